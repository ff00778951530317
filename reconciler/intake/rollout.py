"""Staged rollout with no server: fleet.yaml's `rollout` puts each node in a wave, and wave
k of a revision opens k x interval after the revision's time (git committer time, OCI
`created`). Until its wave opens a node keeps its last applied revision. `decide` is the
whole rule (waves, paused, immediate, the local hold, the halt on earlier waves' failures)
as a pure function of its inputs, so that tests compare it with an independent model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from reconciler.intake.fleet import Identity, Selector

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
    raise NotImplementedError


def opens_at(rollout: Rollout, wave_index: int, revision_time: float) -> float:
    """revision_time + k x interval; every wave opens at revision_time when `immediate`."""
    raise NotImplementedError


def decide(rollout: Rollout | None, identity: Identity, revision: str, revision_time: float | None, now: float, *,
           applied_revision: str | None, hold: LocalHold | None = None, records: Sequence[Record] | None = None,
           records_error: str | None = None) -> Decision:
    """Whether this node applies `revision` now (module doc). In order: a local hold holds;
    a node that applied nothing applies at once; the revision it applied already is open;
    `paused` holds; with no rollout everything is open; the wave not yet open holds (with
    opens_at); a wave k > 0 with maxFailures set halts when more than maxFailures nodes of
    waves before k have a FAILED_OUTCOMES record for `revision`, or when `records_error`
    says the records could not be read (unless halt_on_unreachable is false). An unknown
    revision time (a plain directory) counts as `now`."""
    raise NotImplementedError
