"""The daemon's state and its sync function: one revision of the manifests to the kernel.

Each sync reads the changed files, compiles the changed Services and commits the difference.
Partial: the kernel's generation token is our last commit's, so the diff is against the
ruleset in memory (no listing), verified by the token advancing by one. Full (first, every
fullSyncPeriod, after a failure or SIGHUP, or a foreign token): lists, reports drift and
repairs it. An invalid revision is recorded; the last good one stays.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.heap import settle_heap
from reconciler.compile import (
    Compiled, NftSyntaxError, Ruleset, allocation_of, changed_services, compile_incremental, compile_static,
    describe_view_change, node_address_view, project, relocate,
)
from reconciler.daemon.compiled import Services, counts, has_udp, is_restored
from reconciler.daemon.rollout import RolloutWatch
from reconciler.daemon.runner import Fatal, SyncFailed
from reconciler.engine import (CommandError, StateCorrupt, Target, adopt_commit, append_commit, clean_udp_conntrack, commit,
                               diff, forget_affinity_clients, make_plan, read_history, read_status, rollback_baseline,
                               short_revision, slim_created, verify_commit)
from reconciler.daemon import health
from reconciler.daemon.refusals import WHY, check_revision
from reconciler.daemon.signed import SignatureGate
from reconciler.intake import (Intake, Inventory, NodeConfig, Snapshot, discover_host_addresses, discover_node_ips,
                               identity_of, load_node_config)
from reconciler.kernel import Interface, MayHaveCommitted, NftError, Spellings, canonical, fingerprint, kernel_token, read_live


def _netns_id(netns: str | None) -> tuple | None:
    if netns is None:
        return None
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Daemon:
    """State and the sync function; see the module doc. Not thread-safe: sync() runs on
    the runner's thread only; healthy() reads a few attributes."""

    def __init__(self, directory: Path, config_path: Path | None, target: Target, *, strict: bool,
                 fields: str | None = None, metrics=None, clock: Callable[[], float] = time.monotonic,
                 allow_empty: bool = False):
        self.directory, self.config_path, self.target, self.strict = directory, config_path, target, strict
        self.allow_empty, self.metrics, self.clock = allow_empty, metrics, clock  # allow_empty: refusals.py
        self.intake, self.fields = Intake(directory, strict=strict), fields  # fields: --field-validation
        self.store = target.store()
        self.nft: Interface | None = None
        self.config: NodeConfig | None = None
        self.desired: Compiled | None = None  # the last good revision, compiled
        self.desired_signed: tuple = (None, None)  # its signed time and trust (SignatureGate.signed)
        self.applied: Compiled | None = None  # what our last commit put in the kernel
        self.token: int | None = None  # kernel token right after our last commit
        self.last_digest: tuple | None = None  # (input digest, revision) last read (valid or not)
        self.invalid: tuple[str, str, str] | None = None  # (revision, message, "invalid" or "unverified")
        self.gate = SignatureGate(metrics, lambda: rollback_baseline(self.store))  # `verify`
        self.need_full = True
        self.reload_config = False
        self.last_full: float | None = None
        self.last_success: float | None = None
        self.started = clock()
        self.on_root: Callable[[str], None] | None = None  # the watcher follows the resolved root
        self.store_error: str | None = None  # the last state-store write error (logged once)
        # daemon/statewriter.StateWriter (main sets it): state writes after the sync line,
        # on their own thread; None: written in place (in-process tests)
        self.writer = None
        self._settle = False  # a full sync just ended: settle_heap()
        # watcher.take_changes (main sets it): the files written since the last read; a
        # partial sync then reads only those (no walk of the tree)
        self.changes: Callable[[], set[str] | None] | None = None
        self.netns_id: tuple | None = None  # (st_dev, st_ino) of --netns when entered
        # node addresses (nodePortAddresses, the primary): set by the address watcher's
        # thread when the ruleset depends on what changed, taken by sync()
        self._addr_lock = threading.Lock()
        self._pending_addresses: tuple | None = None
        self._sync_reason: str | None = None
        # readiness probes (daemon/probing.py): an input to compile; `declared`: the last good revision as read
        self.prober = None
        self.declared: Inventory | None = None
        self.probe_generation = 0
        # healthChecks (daemon/health.py): the revision rolled back after failing
        # them, (revision, reason), until a new revision arrives; `stopping` says why the
        # checks should give up early (SIGTERM), set by main.
        self.rejected: tuple[str, str] | None = None
        self.applied_declared: Inventory | None = None  # `declared` of what `applied` was compiled from
        self.stopping: Callable[[], str | None] = lambda: None
        # daemon/repair.Repairs (main sets it): other processes' changes to the table, known
        # from nftables events; a full sync repairs them, held back while they fight us
        self.repairs = None
        self._repair_seq = 0  # the last change reported before this sync listed the kernel
        self._hold: float | None = None  # seconds a repair is held back (the runner's timer)
        self.rollout = RolloutWatch(self)  # a fleet's rollout, the local hold: new revisions kept aside

    # -- config

    def load_config(self) -> bool:
        nft = self.nft
        cfg, problems = load_node_config(str(self.config_path) if self.config_path else None,
                                         discover_ips=lambda: nft.in_namespace(discover_node_ips),
                                         discover_addresses=lambda: nft.in_namespace(discover_host_addresses))
        try:
            cfg = replace(cfg, spelling=Spellings(None).get(nft), field_validation=self.fields or cfg.field_validation)
        except NftError as e:
            logs.log.error(f"cannot tell which spellings this nft accepts: {e}")
            return False
        for p in problems:
            logs.problem(p)
        if any(p.is_error for p in problems):
            return False
        if self.config is not None and cfg.table_name != self.config.table_name:
            logs.log.error(f"tableName changed from {self.config.table_name} to {cfg.table_name}; watch cannot move "
                           f"to another table while it runs: keeping the old config; restart nftrec watch")
            return False
        if cfg.full_sync_period < cfg.min_sync_period:
            logs.log.error(f"{cfg.source.file}: fullSyncPeriod ({cfg.full_sync_period}s) is shorter than "
                           f"minSyncPeriod ({cfg.min_sync_period}s); make it at least as long")
            return False
        if not self.gate.configure(cfg.verify):
            return False
        self.config, self.intake.fields, self.intake.identity = cfg, cfg.field_validation, identity_of(cfg)
        return True

    # -- node addresses

    def _with_addresses(self, cfg: NodeConfig, primary: tuple, pairs: tuple) -> NodeConfig:
        return replace(cfg, host_addresses=tuple(pairs),
                       node_ips=tuple(primary) if cfg.node_ips_discovered else cfg.node_ips)

    def addresses_changed(self, primary: tuple, pairs: tuple) -> bool:
        """The node's addresses now (any thread). True when the ruleset depends on the
        change (an address inside nodePortAddresses came or went, or the primary moved):
        the caller then asks for a sync, which takes the addresses."""
        with self._addr_lock:
            cfg = self.config
            if cfg is None:
                return False
            relevant = node_address_view(self._with_addresses(cfg, primary, pairs)) != node_address_view(cfg)
            self._pending_addresses = (tuple(primary), tuple(pairs)) if relevant else None
            return relevant

    def _take_addresses(self) -> None:
        with self._addr_lock:
            pending, self._pending_addresses = self._pending_addresses, None
        if pending is None or self.config is None:
            return
        new = self._with_addresses(self.config, *pending)
        before, after = node_address_view(self.config), node_address_view(new)
        if before != after:
            self._sync_reason = describe_view_change(before, after)
            logs.log.info(self._sync_reason, extra={"fields": {"event": "addresses", "ok": True}})
        self.config = new

    def refresh_addresses(self) -> None:
        """List the addresses again (full syncs: a safety net for a missed event)."""
        if self.nft is None or self.config is None:
            return
        try:
            primary, pairs = self.nft.in_namespace(lambda: (discover_node_ips(), discover_host_addresses()))
        except Exception as e:
            logs.log.warning(f"cannot list the node's addresses: {e}")
            return
        self.addresses_changed(primary, pairs)

    # -- health

    def refusal(self) -> tuple[str, str, str] | None:
        """The newest revision read, when it was refused: (why: "invalid", "unverified" or
        "rolled-back", revision, what was wrong)."""
        if self.invalid is not None:
            return self.invalid[2], self.invalid[0], self.invalid[1]
        if self.rejected is not None:
            return "rolled-back", *self.rejected
        return None

    # -- the sync function (runs on the runner's thread)

    def sync(self) -> float | None:
        if self.writer is not None:
            self.writer.active()  # state writes wait while syncs run (statewriter.py)
        try:
            return self._sync_once()
        finally:
            if self._settle:  # here, once the full sync's listing and plan are out of scope
                self._settle = False
                settle_heap()
            if self.writer is not None:
                self.writer.active()

    def _sync_once(self) -> float | None:
        start = self.clock()
        self._check_netns()
        if self.reload_config:
            self.reload_config = False
            before = self.config
            if self.load_config() and self.config != before:
                logs.log.info(f"node config {self.config.source.file} re-read; full sync")
                self.last_digest = None  # recompile everything with the new config
            self.rollout.configure()  # the status channel follows `status`
            self.need_full = True
        full_due = self.last_full is None or self.clock() - self.last_full >= self.config.full_sync_period
        if (self.need_full or full_due) and self.last_full is not None:
            self.refresh_addresses()
        self._take_addresses()
        self._take_repair()
        changed = self.changes() if self.changes is not None else None
        if self.need_full or full_due:
            changed = None  # a full sync walks the tree: the safety net for a missed event
        snap = self.gate.read(self.intake, changed, again=self.last_digest is None)  # None: verified last, unchanged
        if snap is not None and self.on_root is not None:
            self.on_root(snap.root)
        if (unsigned := self.gate.take_unfetched()) is not None:  # an OCI artifact refused before its layer
            self._refused(*unsigned)
        if snap is not None and (snap.digest, snap.revision) != self.last_digest:  # (a newer one published since: it counts)
            self._take(snap)
        self.rollout.promote()  # a held revision whose wave opened (or hold ended) becomes `desired`
        if self.prober is not None and self.declared is not None and self.prober.generation != self.probe_generation:
            try:  # probe results changed: only the Services whose endpoints changed recompile
                self.desired = compile_incremental(self._with_probes(self.declared), self.config, self.desired)
            except NftSyntaxError as e:
                logs.log.error(f"the last good revision does not compile with the probe results: {e}")
        if self.desired is not None and self.desired.config != self.config and not is_restored(self.desired):
            # SIGHUP changed the node config while the newest revision is invalid: the
            # last good revision is what stays in the kernel, compiled with the new config.
            try:
                self.desired = compile_incremental(self.desired.inventory, self.config, self.desired)
            except NftSyntaxError as e:
                logs.log.error(f"the last good revision does not compile with the new node config: {e}")
        full_due = self.last_full is None or self.clock() - self.last_full >= self.config.full_sync_period
        full = self.need_full or full_due
        if self.desired is None:
            return self.rollout.wake(None)  # no good revision read yet (or held): the kernel stays untouched
        if not full and self.applied is not None and self.desired is self.applied:
            return self._next_full_in()
        try:
            self._sync(full, start)
        except SyncFailed:
            self.need_full = True
            raise
        return self._next_full_in()

    def _next_full_in(self) -> float | None:
        if self.last_full is None:
            return self.rollout.wake(self._hold)
        due = max(0.0, self.last_full + self.config.full_sync_period - self.clock())
        return self.rollout.wake(due if self._hold is None else min(due, self._hold))

    def _take_repair(self) -> None:
        """Another process changed the table: a full sync now, or a timer while held back."""
        self._hold = None
        if self.repairs is None:
            return
        self._repair_seq = self.repairs.seq
        taken = self.repairs.take()
        if taken is None:
            return
        wait, known = taken
        if wait:
            self._hold = wait
        elif known or self._kernel_moved():
            self.need_full = True
        else:  # events were lost, all of them our own commit's (a big one): nothing to repair
            self.repairs.repaired(self._repair_seq)

    def _kernel_moved(self) -> bool:
        """Whether anything committed since our last commit (the generation moved)."""
        try:
            return self.token is None or kernel_token(self.nft) != self.token
        except NftError:
            return True

    def take_again(self) -> None:
        """The next sync checks the revision read last again (its signatures changed)."""
        self.last_digest = None

    def _refused(self, revision: str, message: str) -> None:
        self.invalid = (revision, message, "unverified")
        self._write(lambda: self._record(self.store.record_attempt, revision, message))
        self._set_revisions()

    def _take(self, snap: Snapshot) -> None:
        """A new revision read: log its problems; compile it when valid."""
        self.last_digest = (snap.digest, snap.revision)
        for p in snap.problems:
            logs.problem(p)
        refused = self.gate.refusal(snap) if snap.ok and snap.root else None
        if refused is not None:  # logged by the gate; kept like an invalid revision
            return self._refused(snap.revision, refused)
        compiled, (why, message) = None, check_revision(self, snap.inventory) if snap.ok else ("invalid", None)
        if snap.ok and message is None:
            try:
                # the first compile keeps the last applied ruleset's endpoint index ranges
                previous = self.last_applied_ruleset() if self.desired is None else None
                compiled = compile_incremental(self._with_probes(snap.inventory), self.config, self.desired, previous)
            except NftSyntaxError as e:  # defence in depth: validation should have refused it
                message = f"refusing input that would reach nft unsafely: {e}"
        elif not snap.ok:
            message = f"{snap.errors} error(s) in the input"
        if compiled is None:
            self.invalid = (snap.revision, message, why)
            logs.log.error(f"revision {short_revision(snap.revision)} of {self.intake.shown} is "
                           f"{'invalid' if why == 'invalid' else 'refused'} ({message}); it was not applied and the last "
                           f"good ruleset stays in the kernel." + (f" Run `nftrec validate {self.intake.shown}` for the "
                           "full report." if snap.errors else ""),
                           extra={"fields": {"event": why, "revision": snap.revision, "errors": snap.errors}})
            revision = snap.revision
            self._write(lambda: self._record(self.store.record_attempt, revision, f"{WHY[why]}: {message}"))
            self._set_revisions()
            return
        self.invalid = None
        self.rejected = None
        if self.rollout.hold_back(snap, compiled):  # its wave is not open: `desired` stays the applied one
            return
        self.desired = compiled
        self.desired_signed = self.gate.signed(snap.revision)
        self.declared = snap.inventory
        if self.prober is not None:
            self.prober.update(snap.inventory)

    def _with_probes(self, inventory: Inventory) -> Inventory:
        if self.prober is None:
            return inventory
        self.probe_generation, inventory = self.prober.apply(inventory)
        return inventory

    def _set_revisions(self) -> None:
        self.rollout.observed()  # the outcome's status record
        if self.metrics is None:
            return
        refused = self.refusal()
        self.metrics.set_refused(refused[0] if refused else None)
        applied = self.applied.inventory.revision if self.applied else None
        held = self.rollout.attempt()
        attempted = self.invalid[0] if self.invalid else self.rejected[0] if self.rejected else held[0] if held else (
            self.desired.inventory.revision if self.desired else None)
        self.metrics.set_revisions(applied, attempted)

    def _sync(self, full: bool, start: float) -> None:
        desired = self.desired
        nft = self.nft
        reason = "" if full else None
        why, self._sync_reason = self._sync_reason, None
        if self.writer is not None and self.config.health_checks:
            self.writer.flush()  # the confirm protocol reads and writes the state in place
        try:
            token = kernel_token(nft)
        except NftError as e:
            self._failed(desired, start, full, f"cannot read the kernel's ruleset generation: {e.text.strip()}")
        if not full and (token is None or token != self.token or self.applied is None):
            full, reason = True, "the kernel's ruleset changed since our last commit"
        drift = None
        verified_live = None
        services = Services(desired)
        pending = None
        try:
            if full:
                live = read_live(nft, self.target.table)
                if self.applied is None:  # first sync: a killed daemon's last commit, kept before it is replaced
                    if self.writer is not None:
                        self.writer.flush()
                    self._record(adopt_commit, self.store, nft, self.target.table, live, token)
                relocated = relocate(desired.ruleset, live)  # keep the kernel's index ranges
                if relocated is not desired.ruleset:
                    desired = replace(desired, ruleset=relocated, allocation=allocation_of(relocated))
                    self.desired = desired
                old = self.last_applied_ruleset()
                if old is not None:
                    drift = diff(old, live)
                plan = make_plan(desired.ruleset, live, services)
            else:
                changed = changed_services(self.applied, desired)
                if changed is None:
                    old_p, new_p = self.applied.ruleset, desired.ruleset
                else:
                    # the static part compile_incremental made for this revision (same inputs)
                    static = desired.static if desired.static is not None else \
                        compile_static(desired.config, desired.inventory)
                    frags = [f for k in changed for f in (self.applied.fragments.get(k), desired.fragments.get(k)) if f]
                    # the same skeleton (compile_incremental hands prev's on): its chains are equal on
                    # both sides, so neither projection holds them (15 chains per table, canonicalised
                    # and compared per sync)
                    same = self.applied.static is not None and (self.applied.static is static or
                                                                self.applied.static == static)
                    old_p = project(self.applied.ruleset, static, frags, static_chains=not same)
                    new_p = project(desired.ruleset, static, frags, static_chains=not same)
                plan = make_plan(new_p, canonical(old_p), services)
            pending = health.begin(self, desired, plan)  # healthChecks: what to restore, before the commit
            if full:  # never re-planned (from_memory None): a created table's plan slimmed
                plan = slim_created(plan)
            plan, replanned = commit(nft, self.target.table, desired.ruleset, plan, services,
                                     from_memory=None if full else "memory")
            if replanned:
                full, reason = True, "a transaction planned from memory failed"
            verified_live, after = verify_commit(nft, self.target, desired.ruleset, token_before=token,
                                                 committed=not plan.empty, full=full)
        except MayHaveCommitted as e:  # the previous ruleset may be gone: what restores it is used, not dropped
            health.undo(self, pending, f"the commit may have happened: {e.text.strip()}")
            self._failed(desired, start, full, f"the transaction may have committed (the next full sync lists the "
                         f"kernel and repairs it): {e.text.strip()}")
        except NftError as e:
            health.discard(self, pending)  # the transaction is atomic: nothing to roll back
            self._failed(desired, start, full, f"the kernel rejected the transaction; nothing was changed "
                         f"(the previous ruleset is whole). nft said: {e.text.strip()}")
        except CommandError as e:
            health.undo(self, pending, f"the sync could not be verified: {e}")
            self._failed(desired, start, full, str(e))
        kernel_done = self.clock()
        if pending is not None and not health.passed(self, desired, pending, start, full):
            return  # rolled back to the previous ruleset; waiting for a new revision
        # the rules are live (kernel_done); before the token is kept: the cleanup commits too
        after = forget_affinity_clients(nft, self.target.table, plan, after)
        # The kernel holds `desired` now; record it.
        previous = self.applied
        self.applied, self.token = desired, after
        self.applied_declared = self.declared
        self.need_full = False
        if full:
            self.last_full = start
            if self.repairs is not None:
                self.repairs.repaired(self._repair_seq)
        self.last_success = kernel_done
        invalid, rejected, held = self.invalid, self.rejected, self.rollout.attempt()
        # a full sync's listing is let go now, not held until the write (settle_heap, in sync())
        live_fp = fingerprint(verified_live) if verified_live is not None else None
        verified_live = None
        # the commit record (engine/commits.py): durable before the sync is reported
        (signed_at, trust), changed = self.desired_signed, [f"{s.action}{s.service}" for s in plan.services]
        entry = self._record(append_commit, self.store, revision=desired.inventory.revision, writer="nftrec watch",
                             kind="full" if full else "partial", token=after, operations=len(plan.transaction),
                             fingerprint=live_fp, services=changed, revision_time=signed_at, trust=trust)
        sequence = entry.sequence if entry else None

        def record() -> None:  # serializes the whole ruleset: off the sync path (statewriter.py)
            # liveFingerprint: the listing's, when this sync listed (full); null otherwise, as
            # for `apply --verify touched`: fingerprinting the whole desired ruleset on every
            # write costs more than it is worth, and nothing reads it back
            fp = live_fp
            if self._record(self.store.record_applied, desired.inventory.revision, desired.ruleset, fp, after,
                            commit=sequence, revision_time=signed_at, trust=trust):
                if invalid is not None:  # still the newest revision read: keep it visible
                    self._record(self.store.record_attempt, invalid[0], f"{WHY.get(invalid[2], WHY['invalid'])}: {invalid[1]}")
                elif rejected is not None:  # likewise a revision rolled back after its health checks
                    self._record(self.store.record_attempt, rejected[0], f"rolled back: {rejected[1]}")
                elif held is not None:  # and one held by the rollout
                    self._record(self.store.record_attempt, *held)

        self._write(record, supersedes="applied")
        health.finish(self, pending)
        self._set_revisions()
        drifted = len(drift) if drift is not None else 0
        if drifted:
            owners = sorted(drift.owners())
            shown = ", ".join(owners[:5]) + (" ..." if len(owners) > 5 else "")
            logs.log.warning(f"drift: {drifted} object(s) in table {self.target.table} differed from the last applied "
                             f"ruleset" + (f" (Services: {shown})" if owners else " (shared objects)") + "; repaired",
                             extra={"fields": {"event": "drift", "objects": drifted, "services": owners}})
        end = self.clock()
        kind = "full" if full else "partial"
        if self.metrics is not None:
            self.metrics.observe_sync(kind, end - start, True)
            if full:
                self.metrics.drift_repaired(drifted)
            for fam, (rules, elements) in counts(desired.ruleset).items():
                self.metrics.set_counts(fam, rules, elements)
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        logs.log.info(
            f"sync {kind}: revision {short_revision(desired.inventory.revision)}, "
            f"{len(changed)} Service(s) changed{' (' + shown + ')' if changed else ''}, "
            f"{len(plan.transaction)} operations, {1000 * (end - start):.0f} ms "
            f"(kernel updated after {1000 * (kernel_done - start):.0f} ms)" + (f"; {reason}" if reason else "")
            + (f"; {why}" if why else ""),
            extra={"fields": {"event": "sync", "kind": kind, "revision": desired.inventory.revision,
                              "servicesChanged": changed, "operations": len(plan.transaction),
                              "durationMs": round(1000 * (end - start), 1),
                              "kernelMs": round(1000 * (kernel_done - start), 1),
                              "driftObjects": drifted, "recompiled": desired.recompiled, "addresses": why,
                              "filesParsed": self.intake.parsed, "filesLooked": self.intake.looked,
                              "documentsChecked": self.intake.checked}})
        self._conntrack(previous, desired, plan)
        self._settle = full and self.writer is not None  # the daemon (main sets the writer), not in-process tests

    def _write(self, write: Callable[[], object], supersedes: str | None = None) -> None:
        """Run a state write: on the writer's thread when there is one. With healthChecks
        the confirm protocol orders state writes around the commit (pending-confirm.json,
        roll_back, status): those syncs write in place, after what is queued."""
        if self.writer is None or (self.config is not None and self.config.health_checks):
            if self.writer is not None:
                self.writer.flush()
            write()
        else:
            self.writer.submit(write, supersedes=supersedes)

    def _record(self, fn, *args, **kwargs):
        """A state-store write: its result, None when it failed. The kernel is what matters:
        a write that fails (state dir unwritable, disk full) is logged once until writes
        work again, without a traceback, and never fails the sync (`nftrec status` is stale
        meanwhile)."""
        try:
            result = fn(*args, **kwargs)
        except (OSError, StateCorrupt) as e:
            message = f"cannot record the state in {self.store.dir}: {e}"
            if self.store_error is None:  # the commit record and the state writer fail alike: once
                logs.log.error(f"{message}; the kernel is still reconciled, `nftrec status` is stale until "
                               f"the state directory is writable again",
                               extra={"fields": {"event": "state", "ok": False}})
            self.store_error = message
            return None
        if self.store_error is not None:
            logs.log.info(f"state directory {self.store.dir} is writable again", extra={"fields": {"event": "state"}})
            self.store_error = None
        return result

    def bind_netns(self) -> None:
        """Remember which namespace --netns named when the daemon entered it."""
        self.netns_id = _netns_id(self.target.netns)

    def _check_netns(self) -> None:
        """The namespace thread keeps a deleted namespace alive: without this check the
        daemon would go on reconciling a namespace nothing else can see."""
        if self.target.netns is None or self.netns_id is None:
            return
        now = _netns_id(self.target.netns)
        if now != self.netns_id:
            what = "was deleted" if now is None else "was deleted and re-created"
            logs.log.error(f"network namespace {self.target.netns} {what} while nftrec watch ran; exiting "
                           f"(restart nftrec watch once the namespace exists)",
                           extra={"fields": {"event": "netns", "ok": False}})
            raise Fatal(f"network namespace {self.target.netns} {what}")

    def last_applied_ruleset(self) -> Ruleset | None:
        """What we last committed (memory, else the state store; nothing after `cleanup`,
        which removed it on purpose): the reference for drift."""
        if self.applied is not None:
            return self.applied.ruleset
        try:
            st = read_status(self.store)
            entries = read_history(self.store)
            if entries and st.desired_digest == entries[-1].digest and st.cleaned_up_at is None:
                return self.store.load_ruleset(entries[-1])
        except Exception:  # best effort: no drift report for the first sync
            return None
        return None

    def _failed(self, desired: Compiled, start: float, full: bool, message: str) -> None:
        logs.log.error(f"sync {'full' if full else 'partial'} of revision {short_revision(desired.inventory.revision)} "
                       f"failed: {message}; retrying in {self.config.sync_period:g}s",
                       extra={"fields": {"event": "sync", "ok": False, "revision": desired.inventory.revision}})
        revision = desired.inventory.revision
        self._write(lambda: self._record(self.store.record_attempt, revision, message))
        self.rollout.report("failed", revision, message)
        if self.metrics is not None:
            self.metrics.observe_sync("full" if full else "partial", self.clock() - start, False)
            self.metrics.set_revisions(self.applied.inventory.revision if self.applied else None,
                                       desired.inventory.revision)
        raise SyncFailed(message)

    def _conntrack(self, old: Compiled | None, new: Compiled, plan) -> None:
        """UDP: entries pinned to endpoints that went away (as kube-proxy clears them); only when a
        Service the plan touched has a UDP port (looked up per key, not per Service)."""
        touched = {s.service for s in plan.services}
        if not (has_udp(new, touched) or has_udp(old, touched)):
            return
        n = clean_udp_conntrack(self.target.netns, new.inventory, new.config, plan, old.inventory if old else None)
        if n is not None and self.metrics is not None:
            self.metrics.conntrack_deleted(n)
