"""Staged rollout with no server: fleet.yaml's `rollout` puts each node in a wave, and wave
k of a revision opens k x interval after the revision's time (git committer time, OCI
`created`). Until its wave opens a node keeps its last applied revision. `decide` is the
whole rule (waves, paused, immediate, the local hold, the halt on earlier waves' failures)
as a pure function of its inputs, so that tests compare it with an independent model.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Sequence

from reconciler.intake.selectors import Identity, Selector, selector_of
from reconciler.intake.problems import safe_name, show

# Decision.state values
OPEN = "open"  # apply the revision
HELD = "held"  # the node's wave has not opened yet
PAUSED = "paused"  # rollout.paused
LOCAL_HOLD = "local-hold"  # `nftrec hold` on this node
HALTED = "halted"  # more than maxFailures nodes of earlier waves failed this revision (or their records are unreachable)

# Record.outcome values (SPEC: applied, refused, invalid, failed, rolled back, held, halted)
OUTCOMES = ("applied", "refused", "invalid", "failed", "rolled-back", "held", "halted")
FAILED_OUTCOMES = ("failed", "rolled-back", "invalid")  # count against maxFailures


@dataclass(frozen=True)
class Wave:
    name: str
    selector: Selector | None = None  # takes the nodes it matches
    percent: int | None = None  # or: cumulative, the nodes whose bucket is below it


@dataclass(frozen=True)
class Rollout:
    """fleet.yaml's `rollout`, checked (schemas/fleet.json)."""

    waves: tuple[Wave, ...]
    interval: float  # seconds
    salt: str = ""
    max_failures: int | None = None  # None: no halt
    paused: bool = False
    immediate: bool = False
    halt_on_unreachable: bool = True


@dataclass(frozen=True)
class LocalHold:
    """`nftrec hold`, as the state directory keeps it."""

    reason: str = ""
    since: float = 0.0
    until: float | None = None  # None: until `nftrec release`

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until


@dataclass(frozen=True)
class Record:
    """One node's status record (the JSON file of its ref refs/nftrec/status/<node>)."""

    node: str
    labels: tuple[tuple[str, str], ...]
    wave: str
    applied: str  # lastAppliedRevision
    attempted: str  # lastAttemptedRevision
    outcome: str  # OUTCOMES
    error: str
    time: float  # Unix seconds


@dataclass(frozen=True)
class Decision:
    state: str  # OPEN, HELD, PAUSED, LOCAL_HOLD, HALTED
    wave: str = ""  # the node's wave name ("" when the fleet has no rollout)
    wave_index: int = 0
    opens_at: float | None = None  # when HELD: the wave's opening time (watch wakes then)
    reason: str = ""  # one line for status, logs and /readyz: "held: wave early opens at 2026-12-06T10:30:00Z"

    @property
    def apply(self) -> bool:
        return self.state == OPEN


def bucket(salt: str, node: str) -> int:
    """sha256(salt + nodeName) mod 100: stable for a salt, uniform over names."""
    return int.from_bytes(hashlib.sha256((salt + node).encode()).digest(), "big") % 100


def wave_of(rollout: Rollout, identity: Identity) -> int:
    """The index of the first wave that takes the node: its selector matches, or its
    cumulative percent exceeds the node's bucket. A node no wave takes is in the last."""
    labels = identity.label_map
    b = bucket(rollout.salt, identity.name)
    for i, wave in enumerate(rollout.waves):
        if wave.selector is not None and wave.selector.matches(labels):
            return i
        if wave.percent is not None and b < wave.percent:
            return i
    return len(rollout.waves) - 1


def opens_at(rollout: Rollout, wave_index: int, revision_time: float) -> float:
    """revision_time + k x interval; every wave opens at revision_time when `immediate`."""
    return revision_time if rollout.immediate else revision_time + wave_index * rollout.interval


def decide(rollout: Rollout | None, identity: Identity, revision: str, revision_time: float | None, now: float, *,
           applied_revision: str | None, hold: LocalHold | None = None, records: Sequence[Record] | None = None,
           records_error: str | None = None) -> Decision:
    """Whether this node applies `revision` now (module doc). In order: a local hold holds;
    a node that applied nothing applies at once; the revision it applied already is open;
    `paused` holds; with no rollout everything is open; the wave not yet open holds (with
    opens_at); a wave k > 0 with maxFailures set (and not `immediate`) halts when more than
    maxFailures nodes of waves before k failed `revision` (each node's latest record only,
    see failed_nodes), or when `records_error` says the records could not be read (unless
    halt_on_unreachable is false: then the records that were read still count). An
    unknown revision time (a plain directory) opens the node's wave now: with no time to
    count from, only the halt stages the rollout."""
    wave, k = "", 0
    if rollout is not None:
        k = wave_of(rollout, identity)
        wave = rollout.waves[k].name
    if hold is not None and hold.active(now):
        until = f"until {when(hold.until)}" if hold.until is not None else "until `nftrec release`"
        return Decision(LOCAL_HOLD, wave, k, None, f"held locally: {one_line(hold.reason) or 'no reason given'} ({until})")
    if applied_revision is None:
        return Decision(OPEN, wave, k, None, "open: nothing applied yet, so it applies at once")
    if revision == applied_revision:
        return Decision(OPEN, wave, k, None, "open: the applied revision")
    if rollout is None:
        return Decision(OPEN)
    if rollout.paused:
        return Decision(PAUSED, wave, k, None, "paused: fleet.yaml's rollout.paused")
    opening = now if revision_time is None else opens_at(rollout, k, revision_time)
    if now < opening:
        return Decision(HELD, wave, k, opening, f"held: wave {wave} opens at {when(opening)}")
    if k > 0 and rollout.max_failures is not None and not rollout.immediate:
        if records_error is not None and rollout.halt_on_unreachable:
            return Decision(HALTED, wave, k, None, f"halted: cannot read the status records of earlier waves: "
                            f"{one_line(records_error)}; set rollout.haltOnUnreachable: false to go on without them")
        failed = failed_nodes(rollout, k, revision, records or ())
        if len(failed) > rollout.max_failures:
            return Decision(HALTED, wave, k, None, halt_message(rollout, revision, failed))
    how = "immediate" if rollout.immediate else f"wave {wave} opened at {when(opening)}"
    return Decision(OPEN, wave, k, opening, f"open: {how}")


def failed_nodes(rollout: Rollout, wave_index: int, revision: str, records: Sequence[Record]) -> list[Record]:
    """The nodes whose latest record (by time; of equal times the later one in `records`)
    failed `revision` (attempted it, outcome in FAILED_OUTCOMES) in a wave before
    `wave_index` (Record.wave, by name). A node's later record (applied, a newer revision,
    another wave) supersedes its failure; records of this wave, of later ones and of wave
    names the rollout does not have are ignored. Sorted by node name."""
    earlier = {w.name for w in rollout.waves[:wave_index]}
    latest: dict[str, Record] = {}
    for r in records:
        if r.node not in latest or r.time >= latest[r.node].time:
            latest[r.node] = r
    return sorted((r for r in latest.values() if r.wave in earlier and r.attempted == revision
                   and r.outcome in FAILED_OUTCOMES), key=lambda r: r.node)


_FAILURE_WORDS = {"rolled-back": "health check", "invalid": "invalid", "failed": "apply failed"}
_NAMED = 10  # nodes named in a halt message; the rest are counted


def halt_message(rollout: Rollout, revision: str, failed: Sequence[Record]) -> str:
    """"halted: 2 nodes of wave canary failed R: edge-003 (health check), edge-017 (invalid)"."""
    order = [w.name for w in rollout.waves]
    waves = sorted({r.wave for r in failed}, key=order.index)
    nodes = ", ".join(f"{safe_name(r.node)} ({_FAILURE_WORDS.get(r.outcome, r.outcome)})" for r in failed[:_NAMED])
    if len(failed) > _NAMED:
        nodes += f" and {len(failed) - _NAMED} more"
    count = f"{len(failed)} node{'s' if len(failed) != 1 else ''}"
    return (f"halted: {count} of wave{'s' if len(waves) > 1 else ''} {', '.join(waves)} failed "
            f"{revision}: {nodes}")


def one_line(text: str) -> str:
    """`text` for a one-line reason: whitespace runs (newlines included) as one space,
    other control characters escaped."""
    text = " ".join(text.split())
    return text if text.isprintable() else show(text)[1:-1]


def when(t: float) -> str:
    """RFC 3339, UTC, whole seconds rounded up (a wave never shows as open before it is)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(t)))


MAX_INTERVAL = 365 * 86400.0  # seconds: later waves' opening times stay printable dates


def parse_rollout(data: dict) -> Rollout:
    """fleet.yaml's `rollout` mapping, already checked (schema and check_rollout), as a Rollout."""
    from reconciler.intake.config import parse_duration

    waves = tuple(Wave(str(w["name"]), None if w.get("selector") is None else selector_of(w["selector"]),
                       w.get("percent")) for w in data["waves"])
    return Rollout(waves, parse_duration(data["interval"]), str(data.get("salt", "")), data.get("maxFailures"),
                   data.get("paused", False), data.get("immediate", False), data.get("haltOnUnreachable", True))


def check_rollout(data: object) -> list[tuple[tuple, str]]:
    """What the schema cannot say about `rollout`, as (field path, message): an interval
    longer than 0s, each wave with exactly one of selector and percent, unique names,
    percents that never decrease. Runs beside the schema (every problem reported at once),
    so it tolerates any shape."""
    from reconciler.intake.config import parse_duration

    out: list[tuple[tuple, str]] = []
    if not isinstance(data, dict):
        return out
    try:
        seconds = parse_duration(data["interval"]) if "interval" in data else None
    except (TypeError, ValueError):
        seconds = None  # the schema's pattern says it
    if seconds is not None and not seconds > 0:
        out.append((("rollout", "interval"), "must be longer than 0s; use e.g. 30m (immediate: true opens every "
                                             "wave at once)"))
    elif seconds is not None and not seconds <= MAX_INTERVAL:
        out.append((("rollout", "interval"), "must be at most 8760h (a year between two waves); use e.g. 30m"))
    waves = data.get("waves")
    names: dict[str, int] = {}
    last: tuple[int, int] | None = None  # (index, percent) of the latest percent wave
    for i, w in enumerate(waves if isinstance(waves, list) else ()):
        if not isinstance(w, dict):
            continue
        path = ("rollout", "waves", i)
        if ("selector" in w) == ("percent" in w):
            what = "has both selector and percent" if "selector" in w else "has neither selector nor percent"
            out.append((path, f"{what}; a wave takes its nodes by a label selector or by a cumulative percent: "
                              "give exactly one"))
        name = w.get("name")
        if isinstance(name, str):
            if name in names:
                out.append((path + ("name",), f"{safe_name(name)} is the name of waves[{names[name]}] too; wave names are "
                                              "unique (status, metrics and records name the wave)"))
            else:
                names[name] = i
        percent = w.get("percent")
        if type(percent) is int:
            if last is not None and percent < last[1]:
                out.append((path + ("percent",), f"{percent} is less than waves[{last[0]}]'s {last[1]}; percents are "
                                                 f"cumulative (a wave takes the nodes whose bucket is below its "
                                                 f"percent), so write at least {last[1]}"))
            last = (i, percent)
    return out
