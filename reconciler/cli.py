"""The `nftrec` entry point: the process's GC policy (heap.py), then the typer command
line of commands.py, which imports the stages inside each command, so a command pays only
for the stages it uses. click's conventions hold: a usage error exits 64 (commands.py), a
closed stdout ends the command quietly with exit 1. `--show-completion SHELL` and
`--install-completion SHELL` are answered here, for the shell named.
"""

from __future__ import annotations

import sys

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_for_named_shell(argv: list[str]) -> bool:
    """`nftrec --show-completion bash` / `--install-completion zsh`: typer's options are
    flags that detect the current shell (shellingham) and ignore a name after them, so a
    packaging script or a CI job would get whatever shell it runs under, or nothing.
    A shell named right after the flag is honoured here, with typer's own scripts."""
    if not argv or argv[0].split("=", 1)[0] not in ("--show-completion", "--install-completion"):
        return False
    flag, _, shell = argv[0].partition("=")
    shell = shell or (argv[1] if len(argv) > 1 else "")
    if shell not in SHELLS:
        return False  # typer's flag: the detected shell
    from typer import completion, echo

    if flag == "--show-completion":
        echo(completion.get_completion_script(prog_name="nftrec", complete_var="_NFTREC_COMPLETE",
                                                    shell=shell))
    else:
        installed, path = completion.install(shell=shell, prog_name="nftrec", complete_var="_NFTREC_COMPLETE")
        echo(f"{installed} completion installed in {path}; it takes effect in a new shell")
    return True


def main() -> None:
    from reconciler.heap import for_one_shot

    for_one_shot()  # `watch` turns the cyclic GC back on (heap.for_daemon)
    if _completion_for_named_shell(sys.argv[1:]):
        raise SystemExit(0)
    from reconciler.commands import main as command_line

    command_line()


if __name__ == "__main__":
    main()
