"""A fleet's staged rollout, for one node and one revision: gathers what intake.decide
needs (fleet.yaml's `rollout` from the bytes the revision was read from, the revision's
time, the node's identity, its last applied revision, the local hold, and for the halt
the earlier waves' status records) and keeps the answer in `rollout.json` for `status`.
One-shot `apply`/`plan` (applygate.py) and `watch` both ask `Gate.decide`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reconciler import clock, logs
from reconciler.atomic import atomic_write
from reconciler.engine.holds import read_hold, rfc3339
from reconciler.engine.state import StateStore
from reconciler.engine.target import short_revision
from reconciler.intake import HELD, Decision, Identity, Record, Rollout, decide, is_fleet_root, parse_fleet, wave_of

ROLLOUT_FILE = "rollout.json"
JITTER = 0.1  # of the interval: polls and each node's start within its wave spread over it
EXIT_HELD = 3  # one-shot apply: the revision is held (its wave, paused, halted, a local hold); nothing applied


def jitter(node: str, interval: float, what: str = "") -> float:
    """A delay in [0, 10 % of interval), the same for a node name (and `what`) every time:
    a fleet's nodes never hit their source, or start their wave, in the same second."""
    h = int.from_bytes(hashlib.sha256(f"{what}\0{node}".encode()).digest()[:8], "big")
    return JITTER * interval * h / 2**64


def fleet_rollout(root: Path, verdict=None) -> Rollout | None:
    """fleet.yaml's `rollout` of the revision read at `root`: from the verified commit's
    blob when `verify` read one (never the worktree's bytes), else from the file. None for
    a plain root, or a fleet.yaml that does not parse (the read reports it: invalid)."""
    return parse_rollout_of(fleet_bytes(root, verdict), str(Path(root) / "fleet.yaml"))


def fleet_bytes(root: Path, verdict=None) -> bytes | None:
    """fleet.yaml's bytes as fleet_rollout reads them, None for a plain root."""
    files = getattr(verdict, "files", None)
    fleet_root = getattr(files, "fleet", None)
    if fleet_root is not None:
        return fleet_root.file[2] if isinstance(fleet_root.file[2], bytes) else None
    if is_fleet_root(root):
        from reconciler.intake import read_fleet_bytes

        return read_fleet_bytes(Path(root) / "fleet.yaml")
    return None


def parse_rollout_of(raw: bytes | None, display: str) -> Rollout | None:
    """The `rollout` of fleet.yaml's bytes `raw` (`display`: its name in messages); None
    without them or when they do not parse."""
    if raw is None:
        return None
    fleet, _ = parse_fleet(display, raw)
    return fleet.rollout if fleet is not None else None


def time_of(root: Path, revision: str, verdict=None) -> tuple[float | None, str | None]:
    """(the revision's time (intake.revision_time), None) or (None, why it cannot be read)."""
    from reconciler.intake import RevisionTimeError, revision_time

    try:
        return revision_time(Path(root), revision, verdict), None
    except RevisionTimeError as e:
        return None, str(e)


@dataclass
class Gate:
    """The rule for one node: `decide` a revision (module doc). `first_seen` gives a
    revision with no time of its own (a plain directory) the time it was first seen, kept
    in rollout.json so that its waves still open one after another."""

    store: StateStore
    hold_dir: Path  # the state root: the hold is per namespace (holds.py)
    # () -> (records, error or None): the status records, for the halt; or a str while
    # the answer is not known yet (daemon/haltcheck.py): the reason the revision is held
    fetch: Callable[[], tuple | str] | None = None
    ignore_rollout: bool = False
    ignore_hold: bool = False
    first_seen: dict = field(default_factory=dict)

    def decide(self, rollout: Rollout | None, identity: Identity, revision: str, revision_time: float | None,
               applied: str | None, time_error: str | None = None) -> Decision:
        now = clock.now()
        hold = None if self.ignore_hold else read_hold(self.hold_dir, self.store.netns)
        if self.ignore_rollout:
            rollout = None
        if revision_time is None and rollout is not None:
            revision_time = self._first_seen(revision, now)
        d = decide(rollout, identity, revision, revision_time, now, applied_revision=applied, hold=hold)
        if d.apply and rollout is not None and time_error is not None and applied is not None and applied != revision:
            d = Decision(HELD, d.wave, d.wave_index, None, f"held: {time_error}")
        if d.apply and rollout is not None and rollout.max_failures is not None and d.wave_index > 0 and \
                applied is not None and applied != revision:
            answer = self.fetch() if self.fetch is not None else (
                (), "the node config has no status.remote to read the earlier waves' records from")
            if isinstance(answer, str):  # not known yet (watch reads in the background): held, saying so
                d = Decision(HELD, d.wave, d.wave_index, None, answer)
            else:
                d = decide(rollout, identity, revision, revision_time, now, applied_revision=applied, hold=hold,
                           records=answer[0], records_error=answer[1])
        if d.apply and d.opens_at is not None and rollout is not None and not rollout.immediate and \
                applied is not None and applied != revision:  # the node's own start within its wave
            start = d.opens_at + jitter(identity.name, rollout.interval, "wave")
            if now < start:
                d = Decision(HELD, d.wave, d.wave_index, start, f"held: wave {d.wave} opens for this node at "
                             f"{rfc3339(start)}")
        if rollout is not None or not d.apply:
            self._keep(revision, d, now)
        return d

    def hold_until(self) -> float | None:
        """When the local hold ends by itself (watch wakes then), None without one."""
        hold = None if self.ignore_hold else read_hold(self.hold_dir, self.store.netns)
        return hold.until if hold is not None and hold.active(clock.now()) else None

    def _first_seen(self, revision: str, now: float) -> float:
        if revision not in self.first_seen:
            kept = read_rollout_state(self.store)
            self.first_seen = {revision: kept["firstSeen"] if kept and kept.get("revision") == revision and
                               isinstance(kept.get("firstSeen"), (int, float)) else now}
        return self.first_seen[revision]

    def _keep(self, revision: str, d: Decision, now: float) -> None:
        self._first_seen(revision, now)  # kept for the revision's later decisions, whatever decided this one
        doc = {"revision": revision, "state": d.state, "wave": d.wave, "opensAt": None if d.opens_at is None else
               rfc3339(d.opens_at), "reason": d.reason, "decidedAt": rfc3339(now),
               "firstSeen": self.first_seen.get(revision)}
        kept = read_rollout_state(self.store)
        if kept is not None and {k: kept.get(k) for k in doc if k != "decidedAt"} == \
                {k: v for k, v in doc.items() if k != "decidedAt"}:
            return
        try:
            atomic_write(self.store.dir / ROLLOUT_FILE, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
        except OSError as e:
            logs.log.warning(f"cannot record the rollout decision in {self.store.dir}: {e}")


def read_rollout_state(store: StateStore) -> dict | None:
    """rollout.json, None when absent or unreadable (status must not fail over it)."""
    try:
        doc = json.loads((store.dir / ROLLOUT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("revision"), str) else None


def _current(doc: dict | None, status) -> bool:
    """rollout.json speaks of the newest revision attempted, and it is not the applied one."""
    return doc is not None and doc.get("revision") == status.last_attempted_revision != status.last_applied_revision


def rollout_status_json(doc: dict | None, status) -> dict:
    if not _current(doc, status):
        return {}
    return {"rollout": {k: doc.get(k) for k in ("revision", "state", "wave", "opensAt", "reason", "decidedAt")}}


def rollout_status_lines(doc: dict | None, status) -> list[str]:
    if not _current(doc, status) or doc.get("state") == "open":
        return []
    return [f"rollout:   revision {short_revision(doc['revision'])} {doc.get('reason') or doc.get('state')}"]


def status_record(identity: Identity, rollout: Rollout | None, applied: str | None, attempted: str | None,
                  outcome: str, error: str = "", wave: str = "") -> Record:
    """The status record of one outcome (statusrecords.StatusChannel.enqueue); its wave is
    the node's in `rollout`, else `wave`."""
    wave = rollout.waves[wave_of(rollout, identity)].name if rollout is not None else wave
    return Record(node=identity.name, labels=tuple(identity.labels), wave=wave, applied=applied or "",
                  attempted=attempted or "", outcome=outcome, error=error[:500], time=clock.now())


def records_fetcher(config) -> Callable[[], tuple] | None:
    """The node config's `status.remote` as Gate.fetch, None without one."""
    settings = config.status
    if settings is None or not settings.remote:
        return None

    def fetch() -> tuple:
        from reconciler.engine.statusrecords import fetch_records

        return fetch_records(settings.remote, settings.ssh_key)  # an unreadable remote: ((), why): the halt says it

    return fetch
