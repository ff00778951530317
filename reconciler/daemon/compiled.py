"""What the sync reads of a compiled revision: its Services by key (without building an
index per sync), whether any of some Services has a UDP port (conntrack cleanup), and the
rule and element counts per family (metrics); and the last applied ruleset read back from
the state as a revision that was not compiled here (`restored`).
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.compile import Compiled, Ruleset, allocation_of
from reconciler.intake import Inventory

RESTORED = ("restored",)  # the static_key of a restored revision: no compile's, so nothing is reused from it


class Services(Mapping):
    """Service key -> Service of a compiled revision, from its inputs (no index built per
    sync: a partial sync's plan looks up only the Services it changed)."""

    def __init__(self, compiled: Compiled):
        self._inputs = compiled.inputs

    def __getitem__(self, key: str):
        return self._inputs[key][0]

    def __iter__(self):
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)

    def __bool__(self) -> bool:  # make_plan's `services or {}`: never replaced
        return True


def has_udp(compiled: Compiled | None, keys: set[str]) -> bool:
    for k in keys:
        inp = compiled.inputs.get(k) if compiled is not None else None
        if inp is not None and any(p.protocol == "UDP" for p in inp[0].ports):
            return True
    return False


def counts(rs: Ruleset) -> dict[str, tuple[int, int]]:
    return {fam: (sum(len(c.rules) for c in t.chains.values()), sum(len(s.elements) for s in t.sets.values()))
            for fam, t in rs.tables.items()}


def restored(revision: str, ruleset: Ruleset, config) -> Compiled:
    """The state's last applied ruleset (engine.last_applied) as the daemon's `desired`
    after a restart while a newer revision is held: full syncs and repairs keep it. It has
    no inputs, so nothing recompiles it (a node config re-read applies with the next
    revision), and the next revision's first sync is a full one (RolloutWatch.promote)."""
    return Compiled(Inventory(revision=revision), config, ruleset, RESTORED, allocation=allocation_of(ruleset))


def is_restored(compiled: Compiled | None) -> bool:
    return compiled is not None and compiled.static_key == RESTORED
