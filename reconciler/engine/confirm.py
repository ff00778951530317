"""Confirmed apply: Junos' `commit confirmed` and `netplan try`, made automatic.

Before the commit, nftrec's own tables are saved as a restore script (pending-confirm.json:
`add table; delete table` plus the old listing, so it restores exactly what was there, or
nothing). The apply holds the lock through the window; checks pass or `nftrec confirm`
(confirm-request.json) keeps the ruleset, else one transaction rolls back. If the apply
dies, the next command in the namespace rolls back first; SIGHUP is ignored meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reconciler import logs
from reconciler.engine.lock import LockHeld
from reconciler.engine.state import FORMAT_VERSION, StateCorrupt, StateStore, atomic_write, fsync_dir, utc_now
from reconciler.engine.target import CommandError, Target, short_revision
from reconciler.intake import HealthCheck
from reconciler.kernel import Interface, MayHaveCommitted, NftError

PENDING_FILE = "pending-confirm.json"
REQUEST_FILE = "confirm-request.json"
FAMILIES = ("ip", "ip6")
POLL = 0.1  # seconds between looks for a confirm request
RETRY = 1.0  # seconds between two attempts of a check that failed
ATTEMPT_MAX = 10.0  # seconds one attempt of one check may take at most
CONFIRM_WAIT = ATTEMPT_MAX + 5.0  # how long `nftrec confirm` waits for the waiting apply to answer


@dataclass(frozen=True)
class ConfirmSpec:
    """What `apply --confirm-timeout` asks: the window and the checks (none: `nftrec confirm`)."""

    timeout: float
    checks: tuple[HealthCheck, ...] = ()


@dataclass
class Pending:
    """pending-confirm.json (state/README.md)."""

    id: str
    writer: str  # "nftrec apply", "nftrec watch"
    pid: int
    revision: str | None
    digest: str  # of the ruleset being tried
    started_at: str
    deadline: str
    timeout_seconds: float
    checks: list[str]
    restore: str  # the nft script that puts the previous tables back
    confirmed: bool = False
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        return {"formatVersion": self.format_version, "id": self.id, "writer": self.writer, "pid": self.pid,
                "revision": self.revision, "digest": self.digest, "startedAt": self.started_at,
                "deadline": self.deadline, "timeoutSeconds": self.timeout_seconds, "checks": self.checks,
                "confirmed": self.confirmed, "restore": self.restore}

    @classmethod
    def from_json(cls, doc: Any, path: Path) -> "Pending":
        if not isinstance(doc, dict):
            raise StateCorrupt(path, "is not a JSON object")
        if doc.get("formatVersion") != FORMAT_VERSION:
            raise StateCorrupt(path, f"has formatVersion {doc.get('formatVersion')!r}; this nftrec reads {FORMAT_VERSION}")
        kinds = {"id": str, "writer": str, "pid": int, "digest": str, "startedAt": str, "deadline": str,
                 "timeoutSeconds": (int, float), "checks": list, "confirmed": bool, "restore": str}
        for key, t in kinds.items():
            if not isinstance(doc.get(key), t):
                raise StateCorrupt(path, f"field {key!r} is missing or has the wrong type")
        if doc.get("revision") is not None and not isinstance(doc["revision"], str):
            raise StateCorrupt(path, "field 'revision' is not a string")
        return cls(id=doc["id"], writer=doc["writer"], pid=doc["pid"], revision=doc.get("revision"),
                   digest=doc["digest"], started_at=doc["startedAt"], deadline=doc["deadline"],
                   timeout_seconds=float(doc["timeoutSeconds"]), checks=[str(c) for c in doc["checks"]],
                   restore=doc["restore"], confirmed=doc["confirmed"])


# --- the files -------------------------------------------------------------------------------


def pending_path(store: StateStore) -> Path:
    return store.dir / PENDING_FILE


def request_path(store: StateStore) -> Path:
    return store.dir / REQUEST_FILE


def _write(path: Path, doc: dict) -> None:
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def read_pending(store: StateStore) -> Pending | None:
    """The pending confirmation, None when there is none. A damaged file cannot be rolled
    back from (its restore script is what is damaged): it is reported, moved aside, and the
    kernel keeps what it has; `nftrec apply --rollback` is the way back then."""
    path = pending_path(store)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Pending.from_json(json.loads(raw.decode("utf-8")), path)
    except (UnicodeDecodeError, ValueError, StateCorrupt) as e:
        err = e if isinstance(e, StateCorrupt) else StateCorrupt(path, f"is not valid JSON ({e})")
        moved = store.reset(path)
        logs.log.error(f"{str(err).rstrip('.')}; moved it to {moved}. A confirmation may have been pending: "
                       f"check `nftrec status` and use `nftrec apply --rollback` to go back if needed")
        return None


def clear_pending(store: StateStore) -> None:
    for path in (request_path(store), pending_path(store)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(FileNotFoundError):
        fsync_dir(store.dir)


def _confirm_requested(store: StateStore, pending: Pending) -> bool:
    try:
        doc = json.loads(request_path(store).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("id") == pending.id


def _rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the window ------------------------------------------------------------------------------


def restore_script(nft: Interface, table: str) -> str:
    """The nft script that puts nftrec's tables back as they are now (see the module doc)."""
    parts = []
    for family in FAMILIES:
        parts.append(f"add table {family} {table}\ndelete table {family} {table}\n")
        text = nft.list_table(family, table)
        if text:
            parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


def begin_confirm(nft: Interface, store: StateStore, *, writer: str, revision: str | None, digest: str, timeout: float,
          checks: tuple[HealthCheck, ...]) -> Pending:
    """Before the commit, under the lock: record what to restore. A crash from here on
    rolls back on the next command (restoring the same tables if the commit never ran).
    An unconfirmed window this process left (its commit may have happened, and its
    rollback failed) keeps its restore script: the tables now may be that commit's."""
    now = time.time()
    left = read_pending(store)
    restore = left.restore if left is not None and not left.confirmed and left.pid == os.getpid() else None
    pending = Pending(id=uuid.uuid4().hex, writer=writer, pid=os.getpid(), revision=revision, digest=digest,
                      started_at=utc_now(), deadline=_rfc3339(now + timeout), timeout_seconds=timeout,
                      checks=[str(c) for c in checks], restore=restore or restore_script(nft, store.table))
    with contextlib.suppress(FileNotFoundError):
        request_path(store).unlink()  # an old request never confirms a new window
    _write(pending_path(store), pending.to_json())
    return pending


def roll_back(nft: Interface, store: StateStore, pending: Pending, reason: str) -> None:
    """Restore the previous tables in one transaction; record the revision as failed."""
    try:
        nft.run_script(pending.restore)
    except NftError as e:
        holds = "it may have happened" if isinstance(e, MayHaveCommitted) else "the kernel still holds it"
        raise CommandError(
            f"rolling back revision {short_revision(pending.revision)} failed, {holds}: nft said "
            f"{e.text.strip()}. The pending confirmation stays in {pending_path(store)} and the next nftrec "
            f"command tries again; `nftrec apply --rollback` also goes back") from None
    store.record_attempt(pending.revision, f"rolled back: {reason}")
    clear_pending(store)
    logs.log.warning(f"rolled back revision {short_revision(pending.revision)}: {reason}; the previous ruleset of "
                     f"table {store.table} is restored (one transaction, other tables untouched)",
                     extra={"fields": {"event": "rollback", "revision": pending.revision, "reason": reason}})


def mark_confirmed(store: StateStore, pending: Pending) -> None:
    """The window is confirmed: from here on a crash never rolls it back (recovery just
    removes the file)."""
    pending.confirmed = True
    _write(pending_path(store), pending.to_json())


def record_confirmed(store: StateStore, pending: Pending, record: Callable[[], Any]) -> None:
    """Mark the window confirmed, record the apply (status.json, history), remove the
    pending file (last: `nftrec confirm` reads status.json once the file is gone)."""
    mark_confirmed(store, pending)
    record()
    clear_pending(store)


def await_confirmation(store: StateStore, pending: Pending, checks: tuple[HealthCheck, ...], netns: str | None,
                       timeout: float, *, aborted: Callable[[], str | None] = lambda: None,
                       clock: Callable[[], float] = time.monotonic) -> str | None:
    """Run the window: None when confirmed (every check passed, or `nftrec confirm`),
    else the reason to roll back. Each check is retried every RETRY seconds until it
    passes once or the deadline passes; without checks only `nftrec confirm` confirms."""
    deadline = clock() + timeout
    left = list(checks)
    from reconciler.kernel import HealthChecker  # imported late: urllib and ssl, for the checks only

    errors: dict[HealthCheck, str] = {}
    checker = HealthChecker(netns) if checks else None
    next_try = clock()
    try:
        while True:
            if _confirm_requested(store, pending):
                logs.log.info(f"revision {short_revision(pending.revision)} confirmed by `nftrec confirm`"
                              + (f" ({len(left)} check(s) had not passed yet)" if left else ""),
                              extra={"fields": {"event": "confirm", "revision": pending.revision}})
                return None
            why = aborted()
            if why:
                return why
            now = clock()
            if checks and not left:
                logs.log.info(f"revision {short_revision(pending.revision)} confirmed: all {len(checks)} health "
                              f"check(s) passed", extra={"fields": {"event": "confirm", "revision": pending.revision}})
                return None
            if now >= deadline:
                if checks:
                    failed = "; ".join(errors.get(c) or f"{c}: not run in time" for c in left)
                    return f"health check(s) did not pass within {timeout:g}s: {failed}"
                return (f"not confirmed within {timeout:g}s (`nftrec confirm` confirms; --health-cmd, "
                        f"--health-url, --health-tcp confirm automatically)")
            if checker is not None and now >= next_try:
                for c in list(left):
                    err = checker.check(c, min(ATTEMPT_MAX, max(0.05, deadline - clock())),
                                        cancelled=lambda: bool(aborted()) or _confirm_requested(store, pending))
                    if err is None:
                        left.remove(c)
                        logs.log.info(f"health check passed: {c}", extra={"fields": {"event": "health", "ok": True}})
                    elif errors.get(c) != err:
                        errors[c] = err
                        logs.log.warning(f"health check failed, retrying until the deadline: {err}",
                                         extra={"fields": {"event": "health", "ok": False}})
                next_try = clock() + RETRY
                continue
            time.sleep(max(0.0, min(POLL, deadline - clock(), next_try - clock() if left else POLL)))
    finally:
        if checker is not None:
            checker.close()


@contextlib.contextmanager
def window_signals():
    """During an apply's window (main thread only): SIGINT/SIGTERM roll back, SIGHUP is
    ignored. Yields the `aborted` callable for await_confirmation."""
    got: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def stop(signum, _frame):
        got.append(signal.Signals(signum).name)

    def hup(_signum, _frame):  # a handler, not SIG_IGN: checks' children get the default back
        logs.log.warning("SIGHUP ignored while waiting for the confirmation (the rollback still happens "
                         "at the deadline)")

    old = {signal.SIGINT: signal.signal(signal.SIGINT, stop), signal.SIGTERM: signal.signal(signal.SIGTERM, stop),
           signal.SIGHUP: signal.signal(signal.SIGHUP, hup)}
    try:
        yield lambda: f"interrupted by {got[0]} before the confirmation" if got else None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def hold_window(nft: Interface, target: Target, pending: Pending, spec: ConfirmSpec, record: Callable[[], Any]) -> None:
    """`apply`'s window, after the commit was verified: record on confirmation, else roll
    back and raise CommandError (exit 1)."""
    store = target.store()
    how = (f"{len(spec.checks)} health check(s)" if spec.checks else
           f"`nftrec confirm{' --netns ' + target.netns if target.netns else ''}`")
    logs.log.info(f"revision {short_revision(pending.revision)} is live in {target.where}, waiting up to "
                  f"{spec.timeout:g}s (until {pending.deadline}) for {how}; without it the previous ruleset "
                  f"comes back", extra={"fields": {"event": "pending", "deadline": pending.deadline}})
    try:
        with window_signals() as aborted:
            reason = await_confirmation(store, pending, spec.checks, target.netns, spec.timeout, aborted=aborted)
    except BaseException as e:  # never leave an unconfirmed revision behind a live process
        roll_back(nft, store, pending, f"nftrec failed while waiting for the confirmation ({e!r})")
        raise
    if reason is None:
        record_confirmed(store, pending, record)
        return
    roll_back(nft, store, pending, reason)
    raise CommandError(f"revision {short_revision(pending.revision)} was rolled back: {reason}. The previous "
                       f"ruleset of table {target.table} is back in {target.where}; `nftrec status` shows the "
                       f"failed attempt")


# --- after a crash, and `nftrec confirm` ------------------------------------------------------------


def recover_locked(nft: Interface, store: StateStore) -> bool:
    """Holding the lock: a pending file means its writer is gone. Roll back (True), or
    just tidy up a window that was confirmed before the crash (False)."""
    pending = read_pending(store)
    if pending is None:
        return False
    if pending.confirmed:
        clear_pending(store)
        return False
    logs.log.warning(f"{pending.writer} (pid {pending.pid}) ended before revision {short_revision(pending.revision)} "
                     f"was confirmed (deadline {pending.deadline}); rolling back first",
                     extra={"fields": {"event": "recover", "revision": pending.revision}})
    roll_back(nft, store, pending, f"{pending.writer} (pid {pending.pid}) ended before the confirmation "
                                   f"(deadline {pending.deadline})")
    return True


def recover_pending(target: Target) -> bool:
    """Every command in a namespace runs this first: when a confirmation is pending and
    nobody holds the lock (its apply died), roll back. Cheap when nothing is pending (one
    stat). A held lock means the waiting apply (or watch) is alive: leave it alone."""
    store = target.store()
    if not pending_path(store).exists():
        return False
    try:
        lock = target.lock().acquire()
    except LockHeld:
        return False
    try:
        nft = target.nft()
        try:
            return recover_locked(nft, store)
        finally:
            nft.close()
    finally:
        lock.release()


def run_confirm(target: Target, *, wait: float = CONFIRM_WAIT) -> int:
    """`nftrec confirm`: 0 when the waiting apply took the confirmation, 1 otherwise."""
    store = target.store()
    pending = read_pending(store)
    if pending is None:
        raise CommandError(f"nothing to confirm: no apply is waiting for confirmation for table {target.table} in "
                           f"{target.where} (state: {store.dir})")
    try:
        lock = target.lock().acquire()
    except LockHeld:
        lock = None
    if lock is not None:  # nobody is waiting: the apply that started the window is gone
        try:
            nft = target.nft()
            try:
                rolled = recover_locked(nft, store)
            finally:
                nft.close()
        finally:
            lock.release()
        if not rolled:
            print(f"revision {short_revision(pending.revision)} was already confirmed")
            return 0
        raise CommandError(f"too late: {pending.writer} (pid {pending.pid}), which was waiting for this "
                           f"confirmation, is gone, so revision {short_revision(pending.revision)} was rolled back "
                           f"instead; apply it again")
    _write(request_path(store), {"id": pending.id, "pid": os.getpid(), "requestedAt": utc_now()})
    end = time.monotonic() + wait
    while time.monotonic() < end:
        now = read_pending(store)
        if now is None or now.id != pending.id:
            break
        time.sleep(POLL)
    else:
        raise CommandError(f"{pending.writer} (pid {pending.pid}) did not take the confirmation within {wait:g}s; "
                           f"it still will if it sees it before the deadline {pending.deadline} (check `nftrec status`)")
    st = store.status()
    if st.last_error is None and st.desired_digest == pending.digest:
        print(f"Confirmed: revision {short_revision(pending.revision)} stays live in {target.where}.")
        return 0
    raise CommandError(f"revision {short_revision(pending.revision)} was not confirmed: {st.last_error or 'rolled back'}")


# --- status ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def pending_status_json(store: StateStore) -> dict:
    """`status -o json`'s `pendingConfirmation` (null when none)."""
    p = read_pending(store)
    if p is None or p.confirmed:
        return {"pendingConfirmation": None}
    return {"pendingConfirmation": {"revision": p.revision, "digest": p.digest, "writer": p.writer, "pid": p.pid,
                                    "running": _alive(p.pid), "startedAt": p.started_at, "deadline": p.deadline,
                                    "timeoutSeconds": p.timeout_seconds, "checks": p.checks}}


def pending_status_lines(doc: dict) -> list[str]:
    p = doc.get("pendingConfirmation")
    if not p:
        return []
    how = f"{len(p['checks'])} health check(s)" if p["checks"] else "`nftrec confirm`"
    state = "" if p["running"] else " (its process is gone: the next nftrec command rolls it back)"
    return [f"pending:   revision {short_revision(p['revision'])} applied at {p['startedAt']} awaits {how} until "
            f"{p['deadline']}, else it is rolled back; {p['writer']} pid {p['pid']}{state}"]
