"""The mass-removal guard: a revision that would remove more than `removalGuard` percent of
the Services applied on this node, and more than MIN_REMOVED of them, is refused with
their list. A broken render, a wrong mount or a half-pushed tree looks like that; a real
decommission passes with `apply --allow-removals` (watch: a higher removalGuard and
SIGHUP). The applied Services are those of the last applied state, not the kernel's.
"""

from __future__ import annotations

from typing import Callable, Iterable

MIN_REMOVED = 5  # removing this many Services or fewer always passes (small nodes, small changes)
SHOWN = 20  # Services named in a refusal; the rest are counted


def removal_refusal(removed: Iterable[str], applied: Callable[[], Iterable[str] | None], percent: int,
                    override: str) -> str | None:
    """Why the revision is refused, or None. `removed`: the Services it removes (a superset
    is fine: only those in `applied` count); `applied()`: the Services of the last applied
    state, None or empty when nothing was applied (a first apply is not guarded), called
    only when more than MIN_REMOVED go. `override`: how to let it through, for the message."""
    removed = set(removed)
    if percent >= 100 or len(removed) <= MIN_REMOVED:
        return None
    services = set(applied() or ())
    gone = sorted(removed & services)
    if len(gone) <= MIN_REMOVED or len(gone) * 100 <= percent * len(services):
        return None
    shown = ", ".join(gone[:SHOWN]) + (f" and {len(gone) - SHOWN} more" if len(gone) > SHOWN else "")
    return (f"the revision would remove {len(gone)} of the {len(services)} Services applied on this node "
            f"({100 * len(gone) // len(services)}%, more than removalGuard {percent}%): {shown}; {override}")


def applied_services(store) -> set[str] | None:
    """The Services (namespace/name) owning objects in the last applied ruleset recorded in
    `store` (a state.StateStore), or None when none is recorded, `cleanup` removed it since
    (nothing is applied), or it cannot be read."""
    from reconciler.engine.state import StateCorrupt, read_history, read_status

    try:
        status, entries = read_status(store), read_history(store)
        if not entries or entries[-1].digest != status.desired_digest or status.cleaned_up_at is not None:
            return None
        return set(store.load_ruleset(entries[-1], lazy=True).owners.values())
    except (OSError, StateCorrupt):
        return None
