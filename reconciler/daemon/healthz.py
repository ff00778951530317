"""What `/healthz` and `/readyz` say. /healthz: the data plane's health, not the newest
revision's. The last good ruleset live and kept in sync is healthy, whatever was refused since (the text names the
refusal; `status` and the metrics report it for alerting). Unhealthy: nothing applied yet
with a refusal, another process's change unrepaired, a restart while a revision is held
with no intact last applied ruleset in the state to keep, or no successful sync for 2 x
fullSyncPeriod. /readyz: the newest revision read is the one applied (Kubernetes' split of
liveness and readiness), else why not.
"""

from __future__ import annotations

from reconciler.engine import short_revision


def healthy(daemon) -> tuple[bool, str]:
    """The data plane's health: the last good ruleset live and kept in sync. A refused
    newest revision is named in the text; it fails only while nothing good is live."""
    refused = daemon.refusal()
    said = ""
    if refused is not None:
        why, revision, message = refused
        said = f"revision {short_revision(revision)} was refused ({why}): {message}"
    why = daemon.repairs.unhealthy() if daemon.repairs is not None else None
    rollout = getattr(daemon, "rollout", None)
    if not why and rollout is not None and rollout.held is not None and daemon.desired is None:
        why = rollout.unrepairable  # restarted while held, with no last applied ruleset to keep
    if why:
        return False, why + (f"; {said}" if said else "")
    period = daemon.config.full_sync_period if daemon.config else 3600.0
    now = daemon.clock()
    if daemon.last_success is None:
        if said:
            return False, f"no revision applied yet; {said}"
        if now - daemon.started > 2 * period:
            return False, f"no successful sync since the start {now - daemon.started:.0f}s ago"
        return True, "starting: no sync yet"
    if now - daemon.last_success > 2 * period:
        return False, (f"no successful sync for {now - daemon.last_success:.0f}s (2 x fullSyncPeriod = "
                       f"{2 * period:.0f}s)" + (f"; {said}" if said else ""))
    applied = f"revision {short_revision(daemon.applied.inventory.revision if daemon.applied else None)}"
    return True, f"{applied} applied {now - daemon.last_success:.1f}s ago" + (
        f"; {said}; the last good ruleset ({applied}) stays in the kernel" if said else "")


def ready(daemon) -> tuple[bool, str]:
    """/readyz: not ready while the newest revision read is refused (invalid, unverified,
    rolled back, refused by the removal guard) or held (rollout, local hold), before the
    first sync, or while unhealthy."""
    refused = daemon.refusal()
    if refused is not None:
        why, revision, message = refused
        kept = daemon.applied.inventory.revision if daemon.applied is not None else None
        return False, (f"revision {short_revision(revision)} was not applied ({why}): {message}; " +
                       (f"revision {short_revision(kept)} stays in the kernel" if kept else "nothing applied yet"))
    rollout = getattr(daemon, "rollout", None)  # a fleet's rollout or `nftrec hold` keeps the newest revision back
    held = rollout.reason() if rollout is not None else None
    if held is not None:
        kept = daemon.applied.inventory.revision if daemon.applied is not None else None
        return False, f"{held}; " + (f"revision {short_revision(kept)} stays in the kernel" if kept else
                                     "the kernel keeps what it holds")
    if daemon.last_success is None:
        return False, "no revision applied yet"
    return healthy(daemon)
