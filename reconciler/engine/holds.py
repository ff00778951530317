"""The local hold (`nftrec hold`, `nftrec release`): a maintenance window on one node, kept
as `hold.json` in the state directory of the namespace, where `status`, one-shot `apply`
and a running `watch` (which stats it in its loop) find it. While it is active no new
revision is applied; the last applied one stays and is still repaired. A hold with an
end (`--until`) ends by itself; `release` removes the file.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from reconciler import clock
from reconciler.atomic import atomic_write
from reconciler.engine.state import namespace_dir
from reconciler.intake import LocalHold

HOLD_FILE = "hold.json"
REASON_MAX = 200  # characters: one line for status, logs and /readyz
EXIT_OK = 0


def hold_path(root: Path, netns: str | None) -> Path:
    return namespace_dir(root, netns) / HOLD_FILE


def rfc3339(t: float) -> str:
    """Unix seconds as RFC 3339, UTC, whole seconds: 2026-12-06T10:30:00Z."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """RFC 3339 with a zone (Z or +HH:MM) -> Unix seconds; ValueError otherwise."""
    if not re.fullmatch(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d([Zz]|[+-]\d\d:\d\d)", text):
        raise ValueError(f"{text!r} is not an RFC 3339 time with a zone (e.g. 2026-12-06T22:00:00Z)")
    return datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", text.replace("t", "T", 1))).timestamp()


def parse_until(text: str, now: float) -> float:
    """--until: an RFC 3339 time, or a duration from now (90m, 2h); it must lie ahead."""
    from reconciler.intake import parse_duration

    try:
        until = now + parse_duration(text) if text[:1].isdigit() and not text[4:5] == "-" else parse_time(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (e.g. 2h, 90m) nor an RFC 3339 time with a zone "
                         f"(e.g. 2026-12-06T22:00:00Z)") from None
    if until <= now:
        raise ValueError(f"{text!r} is not in the future (now is {rfc3339(now)})")
    return until


def read_hold(root: Path, netns: str | None) -> LocalHold | None:
    """The recorded hold (active or ended by its time), None when there is none. A file
    that cannot be read or has the wrong shape counts as a hold with no end (the node is
    held rather than released by damage) and says so in its reason."""
    path = hold_path(root, netns)
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return LocalHold(reason=f"{path} cannot be read ({e}); `nftrec release` removes it")
    try:
        reason, since, until = doc["reason"], parse_time(doc["since"]), doc["until"]
        if not isinstance(reason, str) or (until is not None and not isinstance(until, str)):
            raise TypeError("reason and until must be strings")
        return LocalHold(reason=reason[:REASON_MAX], since=since, until=None if until is None else parse_time(until))
    except (KeyError, TypeError, ValueError) as e:
        return LocalHold(reason=f"{path} has the wrong shape ({e}); `nftrec release` removes it")


def describe(hold: LocalHold, now: float) -> str:
    """One line: "held locally: <reason> (until T)", or that it ended."""
    said = f": {hold.reason}" if hold.reason else ""
    if hold.until is not None and not hold.active(now):
        return f"local hold{said} ended at {rfc3339(hold.until)}"
    return f"held locally{said} (" + (f"until {rfc3339(hold.until)})" if hold.until is not None else
                                      "until `nftrec release`)")


def run_hold(root: Path, netns: str | None, *, until: float | None, reason: str) -> int:
    """Write the hold (replacing one already there) atomically."""
    if "\n" in reason or len(reason) > REASON_MAX:
        from reconciler.engine.target import CommandError

        raise CommandError(f"--reason must be one line of at most {REASON_MAX} characters")
    now = clock.now()
    doc = {"formatVersion": 1, "reason": reason, "since": rfc3339(now),
           "until": None if until is None else rfc3339(until), "pid": os.getpid()}
    atomic_write(hold_path(root, netns), (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    hold = read_hold(root, netns)
    print(f"{describe(hold, now)}; new revisions wait, the applied one stays and is repaired")
    return EXIT_OK


def run_release(root: Path, netns: str | None) -> int:
    """Remove the hold; a running watch takes the newest revision (its wave permitting)."""
    from reconciler.atomic import fsync_dir

    path = hold_path(root, netns)
    try:
        os.unlink(path)
    except FileNotFoundError:
        print("no local hold on this node")
        return EXIT_OK
    fsync_dir(path.parent)
    print("released: the node takes new revisions again (its wave permitting)")
    return EXIT_OK


def hold_status_json(hold: LocalHold | None, now: float) -> dict:
    if hold is None:
        return {}
    return {"hold": {"reason": hold.reason, "since": rfc3339(hold.since) if hold.since else None,
                     "until": None if hold.until is None else rfc3339(hold.until), "active": hold.active(now)}}


def hold_status_lines(hold: LocalHold | None, now: float) -> list[str]:
    return [] if hold is None else [f"hold:      {describe(hold, now)}"]
