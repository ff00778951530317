"""The `nftrec` entry point: the process's GC policy (heap.py), then the typer command
line of commands.py, which imports the stages inside each command, so a command pays only
for the stages it uses. click's conventions hold: a usage error exits 64 (commands.py), a
closed stdout ends the command quietly with exit 1.
"""

from __future__ import annotations


def main() -> None:
    from reconciler.heap import for_one_shot

    for_one_shot()  # `watch` turns the cyclic GC back on (heap.for_daemon)
    from reconciler.commands import main as command_line

    command_line()


if __name__ == "__main__":
    main()
