"""What a one-shot command does around the engine's calls, shared by the typer command
line (commands.py) and cli.py's plain `apply`, which runs without importing typer.

`guard` turns the errors an operator can act on into one line on stderr and exit 1;
`record_invalid` records invalid input as a failed attempt (status then shows it);
`read_frozen` keeps the cyclic GC off a one-shot command's input once it is read.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from reconciler import logs
from reconciler.engine.lock import LockHeld
from reconciler.engine.state import StateCorrupt
from reconciler.engine.target import CommandError
from reconciler.kernel import NftError

EXIT_OK, EXIT_ERROR = 0, 1


def guard(fn, *args, **kwargs) -> int:
    """Run a command; a CommandError becomes one clear line on stderr and exit 1."""
    try:
        return fn(*args, **kwargs)
    except (CommandError, StateCorrupt) as e:
        logs.log.error(str(e), extra={"lines": getattr(e, "lines", False)})
    except NftError as e:
        logs.log.error(f"nft: {e.text.strip()}", extra={"lines": True})
    except OSError as e:  # state directory not writable, plan file unreadable, ...
        logs.log.error(f"{e.strerror or e}: {e.filename or ''}; check the path and its permissions")
    return EXIT_ERROR


def record_invalid(target, e) -> int:
    """Record `e` (desired.InvalidInput) as the attempt of its revision, under the lock."""
    try:
        with target.lock():  # status.json is read-modify-written: only under the lock
            target.store().record_attempt(e.revision, str(e))
    except LockHeld:
        pass  # the running apply records its own outcome
    return EXIT_OK


def intake_cache_dir(state_root: Path) -> Path | None:
    """The intake cache (reconciler/intake/cache.py) in the state directory;
    NFTREC_INTAKE_CACHE=off reads without it."""
    if os.environ.get("NFTREC_INTAKE_CACHE", "").lower() in ("0", "off", "no", "false"):
        return None
    return Path(state_root) / "cache" / "intake"


@contextmanager
def read_frozen() -> Iterator[None]:
    """For a one-shot command's input read: the cyclic GC paused (as intake pauses it), and
    everything alive at the end frozen (gc.freeze) before the GC runs again. The read's
    objects (documents, models) stay alive and acyclic until the process exits; enabled
    again right after the read, the GC's first collection scanned them all once more,
    finding nothing (0.06 s of a cold `apply` at 1,000 Services, loaded machine). Only for
    a process that exits after its command: a frozen object is never collected as part of
    a cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
