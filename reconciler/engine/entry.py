"""What a one-shot command does around the engine's calls (used by commands.py).

`guard` turns the errors an operator can act on into one line on stderr and exit 1;
`record_invalid` records invalid input as a failed attempt (status then shows it).
"""

from __future__ import annotations

import os
from pathlib import Path

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
    """Record `e` (desired.InvalidInput) as the attempt of its revision, under the lock,
    and report it (refused: `verify` refused it)."""
    from reconciler.engine import applystatus
    from reconciler.engine.desired import Unverified

    try:
        with target.lock():  # status.json is read-modify-written: only under the lock
            target.store().record_attempt(e.revision, str(e))
    except LockHeld:
        return EXIT_OK  # the running apply records its own outcome
    applystatus.report("refused" if isinstance(e, Unverified) else "invalid", e.revision, str(e))
    return EXIT_OK


def intake_cache_dir(state_root: Path) -> Path | None:
    """The intake cache (reconciler/intake/cache.py) in the state directory;
    NFTREC_INTAKE_CACHE=off reads without it."""
    if os.environ.get("NFTREC_INTAKE_CACHE", "").lower() in ("0", "off", "no", "false"):
        return None
    return Path(state_root) / "cache" / "intake"
