"""The `nftrec` entry point: `plan` and `apply` with nothing to change are answered here,
before the typer command line (reconciler/commands.py) is imported.

Importing typer (and the pydantic it imports) costs as much as the rest of a no-op `plan`
(issue 8 item 4: a no-op must be nearly free). So `main` first reads the command line
itself, but only a plain one that it reads exactly as commands.py would:

    nftrec [--state-dir D] [--log-format text|json] plan [DIR] [--config F] [--netns NS]
           [--strict] [-o/--output text|json] [--detailed-exitcode] [-v/--verbose]
    nftrec [--state-dir D] [--log-format text|json] apply [DIR] [--config F] [--netns NS]
           [--strict] [--verify touched|full]

(`--opt=value` too). Anything else (another command, --refresh, --out, --probe, --plan,
--help, a repeated option, a value that starts with `-`, a value outside its choices, an
unknown option, shell completion) goes to commands.py untouched. Then the same steps as
commands.py's plan/apply run (engine/noop.py): the node config's table, no confirmation
window pending, and the no-op check. When the no-op does not hold for a plain `apply`,
`_apply` goes on as commands.py's `apply` would (a cold `apply` then never imports typer).
When it does not hold for a `plan`, or anything is unusual (a config problem, an error),
commands.py runs the command from the start; engine/noop.py remembers the "no" so the
check is not repeated, and commands.py reports any error exactly as it always does. So
output and exit codes are the same either way; tests/test_noop_fast_path.py compares the two.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

# Per command: options that take a value (option -> key), and flags.
_GLOBAL = ({"--state-dir": "state_dir", "--log-format": "log_format"}, {})
_COMMANDS = {
    "plan": ({"--config": "config", "--netns": "netns", "-o": "output", "--output": "output"},
             {"--strict": "strict", "--detailed-exitcode": "detailed", "-v": "verbose", "--verbose": "verbose"}),
    "apply": ({"--config": "config", "--netns": "netns", "--verify": "verify"}, {"--strict": "strict"}),
}
_CHOICES = {"log_format": ("text", "json"), "output": ("text", "json"), "verify": ("touched", "full")}


def parse_plain(argv: list[str]) -> dict | None:
    """The options of a plain `plan`/`apply` command line (see above), or None for any
    other command line. Keys: command, dir, and the option keys above."""
    got: dict = {}
    values, flags = _GLOBAL
    rest = iter(argv)
    for arg in rest:
        if "command" not in got and arg in _COMMANDS:
            got["command"] = arg
            values, flags = _COMMANDS[arg]
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in values:
            key = values[name]
            if not eq:
                value = next(rest, "")
            if key in got or not value or value.startswith("-"):
                return None  # repeated (click: the last wins), missing, or an option as a value
            if key in _CHOICES and value not in _CHOICES[key]:
                return None  # commands.py says what is wrong with it
            got[key] = value
        elif arg in flags and flags[arg] not in got:
            got[flags[arg]] = True
        elif "command" in got and "dir" not in got and arg and not arg.startswith("-"):
            got["dir"] = arg
        else:
            return None
    return got if "command" in got else None


def _completing() -> bool:
    """typer's shell completion runs through the command line (`_NFTREC_COMPLETE=...`)."""
    return any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)


def try_noop(argv: list[str]) -> int | None:
    """The exit code of a plain `plan`/`apply` that found nothing to change, or of a plain
    `apply` that did (`_apply`); None: let commands.py run the command (it was not plain,
    a `plan` with changes, or something was unusual)."""
    opts = parse_plain(argv)
    if opts is None or _completing():
        return None
    from reconciler import logs

    logs.setup(opts.get("log_format", "text"))
    try:
        rc = _noop(opts)
    except KeyboardInterrupt:
        return 130  # as typer
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 1  # as click: stdout went away
    except Exception as e:  # commands.py runs the command again, and reports this as usual
        logs.log.debug(f"no-op fast path: left to the full command line ({type(e).__name__}: {e})")
        return None
    if not isinstance(rc, tuple):
        return rc
    # Not a no-op: from here on nothing hands over (the command would run twice); an
    # unexpected error is a traceback and exit 1, as under typer.
    try:
        return _apply(opts, *rc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 1


def _apply(opts: dict, target, config: Path | None) -> int:
    """A plain `apply` that is not a no-op, exactly as commands.py's `apply` runs it, without
    importing typer: the typer command line (typer, pydantic, and an adapter per option)
    cost a cold `apply` at 1,000 Services 0.1-0.25 s of CPU before it started. The no-op
    check and the pending-confirmation check were made in `_noop` already."""
    from reconciler import logs
    from reconciler.engine import InvalidInput, config_cache_dir, guard, intake_cache_dir, load_desired, \
        read_frozen, record_invalid, recover_pending, run_apply

    def recover() -> int:  # as commands._target: roll back a confirmation window left open
        recover_pending(target)
        return 0

    if guard(recover) != 0:
        return 1
    directory = Path(opts.get("dir", "."))
    try:
        with read_frozen():  # this process exits after the apply
            desired = load_desired(directory, config, strict=opts.get("strict", False), netns=target.netns,
                                   cache_dir=intake_cache_dir(target.state_root), compile=False,
                                   config_cache=config_cache_dir(target.state_root))
    except InvalidInput as e:
        logs.log.error(str(e))
        guard(record_invalid, target, e)
        return 1
    return guard(run_apply, target, desired=desired, verify=opts.get("verify", "touched"))


def _noop(opts: dict) -> int | None | tuple:
    from reconciler.engine import (Target, config_cache_dir, default_state_dir, namespace_dir, pending_path,
                                   run_apply_noop, run_plan_noop)
    from reconciler.intake import load_node_config

    netns = opts.get("netns")
    if netns is not None:
        try:
            namespace_dir(Path("/"), netns)
        except ValueError:
            return None  # a usage error: commands.py says so
    config = Path(opts["config"]) if "config" in opts else None
    state_root = Path(opts["state_dir"]) if "state_dir" in opts else default_state_dir()
    cfg, problems = load_node_config(str(config) if config else None, discover=False,
                                     cache_dir=config_cache_dir(state_root))
    if problems:
        return None
    target = Target(netns, cfg.table_name, state_root)
    if pending_path(target.store()).exists():
        return None  # a confirmation window was left open: commands.py rolls it back first
    directory = Path(opts.get("dir", "."))
    strict = opts.get("strict", False)
    if opts["command"] == "plan":
        return run_plan_noop(target, directory, config, strict=strict, output=opts.get("output", "text"))
    rc = run_apply_noop(target, directory, config, strict=strict)
    return (target, config) if rc is None else rc  # not a no-op: _apply


def _quiet_broken_pipe() -> None:
    """What click does on EPIPE: nothing more is written (nor a flush error at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main() -> None:
    # A run builds large, mostly acyclic structures (parsed manifests, rulesets, their
    # JSON); at CPython's default gen-0 threshold (700) the cyclic GC runs thousands of
    # collections that free nothing. 50,000 took 4-6 % off a 1k cold `apply`'s CPU (3
    # interleaved pairs, same run); the older generations keep their default ratios.
    gc.set_threshold(50_000, 10, 10)
    rc = try_noop(sys.argv[1:])
    if rc is not None:
        raise SystemExit(rc)
    from reconciler.commands import main as command_line

    command_line()


if __name__ == "__main__":
    main()
