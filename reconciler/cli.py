"""The `nftrec` entry point: the process's GC policy (heap.py), then the typer command
line of commands.py with `trace` (tracecommands.py) and the `fleet` sub-app of fleetcommands.py, which import the stages
inside each command, so a command pays only for the stages it uses. click's conventions hold: a usage error exits 64 (commands.py), a
closed stdout ends the command quietly with exit 1; `apply`'s queued status records get one
bounded push at the end. Around typer: a shell named after the
completion flags, and a hint for a global option placed after the command.
"""

from __future__ import annotations

import shlex
import sys
from typing import Optional


def main() -> None:
    from reconciler.heap import for_one_shot

    for_one_shot()  # `watch` turns the cyclic GC back on (heap.for_daemon)
    from reconciler.commands import EXIT_OK, EXIT_USAGE

    app = typer_app()

    if completion_for_named_shell(sys.argv[1:]):
        raise SystemExit(EXIT_OK)
    try:
        app()
    except SystemExit as e:
        if e.code == EXIT_USAGE:
            import typer

            hint = global_option_hint(typer.main.get_command(app), sys.argv[1:])
            if hint:
                typer.echo(f"Hint: {hint}", err=True)
        raise
    finally:
        status = sys.modules.get("reconciler.engine.applystatus")  # imported by `apply` only
        if status is not None:
            status.send_queued()  # its queued status records: one bounded push, its exit code kept


def typer_app():
    """The whole command line as one typer app: commands.py's commands, tracecommands.py's
    `trace` and the `fleet` sub-app of fleetcommands.py. main() runs it; the Debian
    package's build walks its click tree for the nftrec(8) man page (debian/docs.py), so
    the page lists exactly the commands and options the program has. A second call adds
    nothing."""
    from reconciler.commands import app
    from reconciler.fleetcommands import fleet_app
    from reconciler.tracecommands import trace

    if not any(group.typer_instance is fleet_app for group in app.registered_groups):
        app.command()(trace)
        app.add_typer(fleet_app, name="fleet")
    return app


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def completion_for_named_shell(argv: list[str]) -> bool:
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
    import typer
    from typer import completion

    if flag == "--show-completion":
        typer.echo(completion.get_completion_script(prog_name="nftrec", complete_var="_NFTREC_COMPLETE",
                                                    shell=shell))
    else:
        installed, path = completion.install(shell=shell, prog_name="nftrec", complete_var="_NFTREC_COMPLETE")
        typer.echo(f"{installed} completion installed in {path}; it takes effect in a new shell")
    return True


def global_option_hint(group, argv: list[str]) -> Optional[str]:
    """After a usage error: when argv has one of `group`'s own options (the click group of
    the typer app: --state-dir, --log-format, ...) after the command, as `--opt X` or
    `--opt=X`, the hint to move it, with the command line rewritten; else None."""
    takes_value = {}
    for param in group.params:
        for opt in getattr(param, "opts", ()):
            if opt.startswith("--"):
                takes_value[opt] = not getattr(param, "is_flag", False)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):  # the global options before the command
        i += 1 + (argv[i] in takes_value and takes_value[argv[i]])
    if i >= len(argv) or argv[i] == "--":
        return None
    head, rest = argv[:i + 1], argv[i + 1:]
    for j, arg in enumerate(rest):
        if arg == "--":
            return None
        opt = arg.split("=", 1)[0]
        if opt not in takes_value:
            continue
        n = 2 if takes_value[opt] and "=" not in arg and j + 1 < len(rest) else 1
        moved = rest[j:j + n]
        line = ["nftrec", *head[:-1], *moved, head[-1], *rest[:j], *rest[j + n:]]
        return f"{opt} is a global option: put it before the command: {shlex.join(line)}"
    return None


if __name__ == "__main__":
    main()
