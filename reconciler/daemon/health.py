"""healthChecks in `nftrec watch`: a confirmed apply per new revision (engine/confirm.py).

Before committing a revision other than the last applied one, the restore script is
recorded (a crash rolls back on restart); the checks then run in the namespace until they
pass or `healthCheckTimeout` ends. A failed revision is rolled back in one transaction,
recorded, counted, makes /healthz fail and is not retried until a new revision arrives.
"""

from __future__ import annotations

from reconciler import logs
from reconciler.compile import digest

from reconciler.engine import (
    CommandError, await_confirmation, begin_confirm, clear_pending, mark_confirmed, read_status, roll_back,
    short_revision,
)


def _new_revision(daemon, revision: str) -> bool:
    if daemon.applied is not None:
        return daemon.applied.inventory.revision != revision
    try:
        return read_status(daemon.store).last_applied_revision != revision
    except Exception:
        return True


def begin(daemon, desired, plan):
    """Before the commit: the pending confirmation, or None when no checks apply."""
    cfg = daemon.config
    if not cfg.health_checks or plan.empty or not _new_revision(daemon, desired.inventory.revision):
        return None
    try:
        return begin_confirm(daemon.nft, daemon.store, writer="nftrec watch", revision=desired.inventory.revision,
                             digest=digest(desired.ruleset), timeout=cfg.health_check_timeout,
                             checks=cfg.health_checks)
    except OSError as e:
        raise CommandError(f"cannot record the pending health check in {daemon.store.dir} ({e.strerror or e}); "
                           f"not applying revision {short_revision(desired.inventory.revision)} unguarded") from None


def discard(daemon, pending) -> None:
    """The commit did not happen: nothing to roll back."""
    if pending is not None:
        clear_pending(daemon.store)


def finish(daemon, pending) -> None:
    """After the confirmed revision was recorded: the window is over (`nftrec confirm`,
    if it answered, now finds status.json updated)."""
    if pending is not None:
        clear_pending(daemon.store)


def undo(daemon, pending, reason: str) -> None:
    """The commit happened but cannot be trusted: roll back (best effort, logged)."""
    if pending is None:
        return
    try:
        roll_back(daemon.nft, daemon.store, pending, reason)
    except CommandError as e:
        logs.log.error(str(e))


def passed(daemon, desired, pending, start: float, full: bool) -> bool:
    """After the verified commit: run the checks. True: keep the revision (the caller
    records it). False: it was rolled back and the daemon returned to the previous one."""
    cfg = daemon.config
    revision = desired.inventory.revision
    logs.log.info(f"revision {short_revision(revision)} applied; running {len(cfg.health_checks)} health check(s) "
                  f"for up to {cfg.health_check_timeout:g}s",
                  extra={"fields": {"event": "health", "revision": revision}})
    reason = await_confirmation(daemon.store, pending, cfg.health_checks, daemon.target.netns,
                                cfg.health_check_timeout, aborted=daemon.stopping)
    if reason is None:  # confirmed: a crash from here on must not roll it back
        mark_confirmed(daemon.store, pending)
        return True
    try:
        roll_back(daemon.nft, daemon.store, pending, reason)
    except CommandError as e:
        daemon._failed(desired, start, full, str(e))  # raises SyncFailed: retried after syncPeriod
    previous = daemon.applied
    daemon.rejected = (revision, reason)
    daemon.desired = previous  # None: nothing good in memory; the kernel keeps the restored tables
    daemon.declared = daemon.applied_declared if previous is not None else None
    if daemon.prober is not None and daemon.declared is not None:
        daemon.prober.update(daemon.declared)
    daemon.token = None  # the rollback committed: the next sync lists and compares
    daemon.need_full = True
    if daemon.metrics is not None:
        daemon.metrics.rolled_back()
        daemon.metrics.observe_sync("full" if full else "partial", daemon.clock() - start, False)
    daemon._set_revisions()
    logs.log.error(f"revision {short_revision(revision)} failed its health checks and was rolled back ({reason}); "
                   f"the previous ruleset is back and the revision is not retried until a new one arrives",
                   extra={"fields": {"event": "rollback", "revision": revision, "reason": reason}})
    return False



