"""The checks a valid revision passes before watch compiles it: it holds at least one
Service (unless --allow-empty or allowEmpty), and it removes no more of the applied
Services than removalGuard allows (engine/guards.py). A refused revision is kept like an
invalid one: the last good ruleset stays, status, /readyz and the metrics say why.
"""

from __future__ import annotations

from reconciler.engine import applied_services, removal_refusal
from reconciler.intake import Inventory, no_services

WHY = {"invalid": "invalid input", "removal-guard": "refused by the removal guard"}  # status's lastError prefix


def check_revision(daemon, inventory: Inventory) -> tuple[str, str | None]:
    """(why, message) of a refusal ("invalid" or "removal-guard"), message None when the
    revision passes. The applied Services are the daemon's last commit's, else the state's
    (read lazily: only its owners)."""
    cfg = daemon.config
    if not (daemon.allow_empty or cfg.allow_empty):
        empty = no_services(len(inventory.services), daemon.intake.shown)
        if empty is not None:
            return "invalid", empty.message
    if cfg.removal_guard >= 100:
        return "invalid", None
    if daemon.applied is not None:
        applied = daemon.applied
        before, services = set(applied.inputs), lambda: set(applied.ruleset.owners.values())
    else:
        known = applied_services(daemon.store) or set()
        before, services = known, lambda: known
    message = removal_refusal(before - {s.key for s in inventory.services}, services, cfg.removal_guard,
                              "if it is meant, set removalGuard higher in the node config and send SIGHUP (100% "
                              "turns the guard off), or push the removal in smaller steps")
    return ("removal-guard", message) if message is not None else ("invalid", None)
