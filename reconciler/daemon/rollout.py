"""watch and a fleet's staged rollout: a new valid revision is compiled at once (so an
invalid one is reported then) and, while engine.Gate holds it (its wave not open, paused,
halted, `nftrec hold`), kept aside: the daemon's `desired` stays the last applied
revision (after a restart, the state's last applied ruleset), which full syncs and repairs
keep in the kernel. The sync's timer wakes at the opening time (and at a hold's end); a
thread stats hold.json so that hold and release count within a second; the halt reads the
earlier waves' records in the background (haltcheck.py). Outcomes go to the status
channel when `status.remote` is set (re-read on SIGHUP).
"""

from __future__ import annotations

import os
import threading

from reconciler import clock, logs
from reconciler.daemon.compiled import is_restored, restored
from reconciler.daemon.haltcheck import HaltCheck
from reconciler.engine import (CommandError, Gate, fleet_rollout, hold_path, last_applied, short_revision,
                               status_record, time_of)
from reconciler.intake import HALTED, HELD, Decision, identity_of

HOLD_POLL = 0.5  # seconds between two stats of hold.json
HALT_RECHECK = 60.0  # seconds (at most one interval) between two reads of the records while halted
_OUTCOME = {"invalid": "invalid", "unverified": "refused", "removal-guard": "refused", "rolled-back": "rolled-back"}


class RolloutWatch:
    """The daemon's held revision and the rule (module doc); every method runs on the
    sync thread except `reason` (read by /readyz) and the hold file's thread."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.gate = Gate(daemon.store, daemon.target.state_root)
        self.held: tuple | None = None  # (compiled, inventory, signed, rollout, time, time error) kept aside
        self.decision: Decision | None = None  # of the held revision
        self.said: tuple | None = None  # (revision, state, reason) last logged and recorded
        self.wave: tuple[str, int] = ("", 0)  # the node's wave (name, index) of the newest revision decided
        self.rollout = None  # fleet.yaml's rollout of the newest valid revision (its records name the wave)
        self.channel = None  # engine.StatusChannel, when the node config has status.remote
        self.halt = HaltCheck(self._settings, lambda: self._run and self._run())  # the halt's reads
        self.unrepairable: str | None = None  # why a restart while held found no last applied ruleset
        self._run = None  # the runner's run(), once started
        self.pushed: tuple | None = None  # (outcome, attempted, when) last enqueued
        self.decided_key = None  # hold.json's stat when the held revision was last decided
        self._hold_file = hold_path(daemon.target.state_root, daemon.target.netns)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the rule

    def _applied(self) -> str | None:
        """The last applied revision; None after `cleanup` (the node then applies at once)."""
        d = self.daemon
        if d.applied is not None:
            return d.applied.inventory.revision
        from reconciler.engine import read_status

        try:
            st = read_status(d.store)
        except OSError:
            return None
        return st.last_applied_revision if st.cleaned_up_at is None else None

    def hold_back(self, snap, compiled) -> bool:
        """A new valid revision: True when it is held (kept aside), False when it goes in."""
        d = self.daemon
        verdict = d.gate.passed[0] if d.gate.passed is not None and d.gate.passed[0].revision == snap.revision else None
        rollout = self.rollout = fleet_rollout(snap.root, verdict)
        t, error = time_of(snap.root, snap.revision, verdict) if rollout is not None else (None, None)
        self.held = (compiled, snap.inventory, d.gate.signed(snap.revision), rollout, t, error)
        self.gate.fetch = self.halt if self._settings() is not None else None
        self.halt.reset()
        if self._decide():
            if d.desired is None:
                self._restore()
            return True
        self.held = self.decision = None
        self._export()
        return False

    def _restore(self) -> None:
        """A restart while a revision is held: `desired` is the state's last applied ruleset
        (compiled.restored). A state with none intact (a damaged history) leaves the kernel
        as it is, unrepaired, until the held revision goes in; never a guess, and never the
        held revision early: said once per held revision, and /healthz fails with it."""
        d = self.daemon
        try:
            _, ruleset = last_applied(d.store)
            st = d.store.status()
        except CommandError as e:
            self.unrepairable = f"cannot keep the applied revision while revision " \
                                f"{short_revision(self.held[0].inventory.revision)} is held: {e}"
            logs.log.error(f"{self.unrepairable}; nothing in table {d.target.table} is repaired until it goes in "
                           f"(`nftrec apply --ignore-rollout` applies it now)",
                           extra={"fields": {"event": "rollout", "ok": False}})
            return
        self.unrepairable = None
        d.desired = restored(st.last_applied_revision, ruleset, d.config)
        d.desired_signed = (st.last_applied_revision_time, st.last_applied_trust)
        logs.log.info(f"revision {short_revision(st.last_applied_revision)}: the last applied ruleset, read from "
                      f"{d.store.dir}, is kept in the kernel", extra={"fields": {"event": "rollout", "state": "kept"}})

    def _decide(self) -> bool:
        """The held revision's decision now; True while it stays held."""
        compiled, _, _, rollout, t, error = self.held
        self.decided_key = self._hold_key()  # before the hold is read: a later change differs from it
        revision = compiled.inventory.revision
        self.decision = d = self.gate.decide(rollout, identity_of(self.daemon.config), revision, t, self._applied(),
                                             time_error=error)
        self.wave = (d.wave, d.wave_index)
        if d.apply:
            return False
        if self.said != (revision, d.state, d.reason):
            self.said = (revision, d.state, d.reason)
            logs.log.warning(f"revision {short_revision(revision)} {d.reason}; revision "
                             f"{short_revision(self._applied())} stays in the kernel",
                             extra={"fields": {"event": "rollout", "revision": revision, "state": d.state,
                                               "wave": d.wave, "opensAt": d.opens_at}})
            store = self.daemon.store
            self.daemon._write(lambda: self.daemon._record(store.record_attempt, revision, d.reason))
            self._export()
            self.report("halted" if d.state == HALTED else "held", revision, d.reason)
        return True

    def promote(self) -> None:
        """Each sync: the held revision goes in once the rule opens it (wave, hold, halt)."""
        if self.held is None or self._decide():
            return
        compiled, inventory, signed, _, _, _ = self.held
        d = self.daemon
        logs.log.info(f"revision {short_revision(compiled.inventory.revision)}: {self.decision.reason}; applying it",
                      extra={"fields": {"event": "rollout", "revision": compiled.inventory.revision, "state": "open"}})
        if is_restored(d.applied):  # nothing compiled to compare with: list the kernel
            d.need_full = True
        d.desired, d.declared, d.desired_signed = compiled, inventory, signed
        if d.prober is not None:
            d.prober.update(inventory)
        self.held = self.decision = None
        self._export()

    def wake(self, due: float | None) -> float | None:
        """The sync timer: no later than the held revision's opening or the hold's end."""
        if self.held is None:
            return due
        when = self.decision.opens_at if self.decision is not None else None
        if self.decision is not None and self.decision.state == HALTED:  # read the earlier waves' records again
            when = clock.now() + min(self.held[3].interval, HALT_RECHECK)
        hold = self.gate.hold_until()
        for t in (when, hold):
            if t is not None:
                left = max(0.0, t - clock.now()) + 0.05
                due = left if due is None else min(due, left)
        return due

    def attempt(self) -> tuple[str, str] | None:
        """(revision, reason) of the held revision: its attempt, kept in the state after a
        repair records the applied one again."""
        if self.held is None or self.decision is None:
            return None
        return self.held[0].inventory.revision, self.decision.reason

    def reason(self) -> str | None:
        """/readyz: why the newest revision is not applied, while it is held."""
        d, held = self.decision, self.held
        if d is None or held is None:
            return None
        return f"revision {short_revision(held[0].inventory.revision)} {d.reason}"

    # -- metrics and status records

    def _export(self) -> None:
        m = self.daemon.metrics
        if m is None:
            return
        d = self.decision
        m.set_rollout(*self.wave, d.state if d else None, d.opens_at if d and d.state == HELD else None)

    def observed(self) -> None:
        """After an outcome the daemon recorded (_set_revisions): its status record."""
        d = self.daemon
        refused = d.refusal()
        if refused is not None:
            self.report(_OUTCOME.get(refused[0], "refused"), refused[1], refused[2])
        elif d.applied is not None and self.held is None:
            self.report("applied", d.applied.inventory.revision, "")

    def report(self, outcome: str, attempted: str | None, error: str) -> None:
        """Queue the outcome's record (never blocks: StatusChannel.enqueue writes a file).
        The same outcome again is sent once per fullSyncPeriod, so that `fleet status`
        tells an idle node (a record at least that often) from an offline one."""
        now = clock.now()
        if self.channel is None or self.pushed is not None and self.pushed[:2] == (outcome, attempted) \
                and now - self.pushed[2] < self.daemon.config.full_sync_period:
            return
        self.pushed = (outcome, attempted, now)
        d = self.daemon
        try:
            self.channel.enqueue(status_record(identity_of(d.config), self.rollout, self._applied(), attempted,
                                               outcome, error))
        except Exception as e:  # the status channel never fails a sync
            logs.log.warning(f"cannot queue the status record ({outcome}): {e}")

    # -- the status channel and the hold file

    def _settings(self):
        settings = self.daemon.config.status if self.daemon.config is not None else None
        return settings if settings is not None and settings.remote else None

    def configure(self) -> None:
        """The status channel of the node config's `status` (at start and after SIGHUP): a
        changed remote or key stops the old channel and starts one for the new (the queue is
        durable: what the old one had not sent goes to the new remote); none without it."""
        settings = self._settings()
        if self._run is None or (self.channel.settings if self.channel is not None else None) == settings:
            return
        if self.channel is not None:
            self.channel.stop()
            self.channel = None
        if settings is not None:
            from reconciler.engine import StatusChannel

            self.channel = StatusChannel(self.daemon.store.dir, settings)
            self.channel.start()
        self.pushed = None  # the current outcome goes to the new remote too
        if self.held is not None:
            self.gate.fetch = self.halt if settings is not None else None
            self.halt.reset()

    def start(self, run) -> None:
        """The status channel (node config `status.remote`), and a thread that stats
        hold.json every HOLD_POLL seconds: a change asks for a sync (`run`)."""
        self._run = run
        self.configure()

        def loop():
            last = self._hold_key()
            while not self._stop.wait(HOLD_POLL):
                now = self._hold_key()
                # a change since the last poll, or since a held revision was decided (a hold
                # and its release between two polls: the sync read the hold, the poll never did)
                if now != last or self.held is not None and now != self.decided_key:
                    last = now
                    run()

        self._thread = threading.Thread(target=loop, name="nftrec-hold", daemon=True)
        self._thread.start()

    def _hold_key(self) -> tuple | None:
        try:
            st = os.stat(self._hold_file)
            return st.st_ino, st.st_size, st.st_mtime_ns
        except OSError:
            return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.halt.stop()
        if self.channel is not None:
            self.channel.stop()
