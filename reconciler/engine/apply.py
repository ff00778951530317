"""plan, apply and status: the back half of the pipeline against the live kernel.

desired (desired.load_desired, a saved plan, or a history entry for --rollback) → read
live → plan.make_plan → one transaction → verify (sync.verify_touched, or verify.py's
listing) → state store. While the kernel's generation token is the one the last apply
recorded, the recorded ruleset (read lazily) stands in for the listing and only the
Services whose input changed are compiled; `--refresh` always lists and compiles all.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

from reconciler import logs
from reconciler.compile import FAMILIES, Ruleset, digest, relocate
from reconciler.engine import applystatus
from reconciler.engine import confirm as confirm_window
from reconciler.engine import planfile
from reconciler.engine.changes import Changes, diff
from reconciler.engine.commits import adopt_commit, append_commit, commit_ahead, newest_commit
from reconciler.engine.guards import applied_services, removal_refusal
from reconciler.engine.plan import format_text, make_plan, to_json
from reconciler.engine.probes import probe_status_json, probe_status_lines, read_probe_state
from reconciler.engine.sourcestate import read_source_state, source_status_json, source_status_lines
from reconciler.engine.state import HOST, StateCorrupt, read_history, read_status
from reconciler.engine.sync import clean_udp_conntrack, commit, forget_affinity_clients, touched_objects, verify_touched
from reconciler.engine.target import CommandError, Target, short_revision
from reconciler.engine.verify import slim_created, verify_listed
from reconciler.kernel import (Interface, MayHaveCommitted, NftError, canonical, canonical_ops, fingerprint, kernel_token, list_live, parse_live, read_live,
                               sweep_trace_tables)

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_NOT_APPLIED = 3  # `status --detailed-exitcode`: the newest revision attempted is not the applied one (else 1)


def _color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def recorded_state(nft: Interface, target: Target, *, lazy: bool = False) -> tuple[Ruleset, dict | None] | None:
    """The fast path: (the last applied ruleset as recorded, its compile memo or None)
    while the kernel's generation token says nobody committed since; else None.
    `lazy`: its chains and sets are decoded when first read (engine/recorded.py)."""
    store = target.store()
    st = read_status(store)
    token = kernel_token(nft)
    if st.kernel_generation is not None and token == st.kernel_generation:
        entries = read_history(store)
        if entries and entries[-1].digest == st.desired_digest:
            try:
                return store.load_ruleset(entries[-1], lazy=lazy), store.read_compiled(st.desired_digest)
            except StateCorrupt:
                pass  # fall back to the kernel
    return None


def read_live_state(nft: Interface, target: Target, *, refresh: bool) -> tuple[Ruleset, bool]:
    """(live ruleset in canonical form, whether it came from the fast path)."""
    if not refresh:
        rec = recorded_state(nft, target)
        if rec is not None:
            return canonical(rec[0]), True
    return read_live(nft, target.table), False


def plan_desired(desired, nft: Interface, target: Target, *, refresh: bool, memo: bool = True):
    """Compile `desired` (read with compile=False) against what the kernel holds, and plan:
    (desired with its ruleset, plan, the listing or None, whether the kernel was not
    listed, the compile memo or {} without `memo`). On the fast path only the Services
    whose input changed are compiled and diffed (compile.project); otherwise the kernel is
    listed and everything compiled, keeping the listing's index ranges."""
    from dataclasses import replace

    from reconciler.compile import NftSyntaxError, compile_oneshot

    # lazily: with its memo, compile_oneshot reads only the changed Services' objects
    rec = None if refresh else recorded_state(nft, target, lazy=True)
    inv = desired.inventory
    live = None
    try:
        if rec is not None:
            one = compile_oneshot(inv, desired.config, desired.config_digest, *rec)
        else:
            one, live = _compile_listing(desired, nft, target, memo)
    except NftSyntaxError as e:  # defence in depth: validation should have refused it
        raise CommandError(f"refusing input that would reach nft unsafely: {e}") from None
    desired = replace(desired, ruleset=one.ruleset)
    services = {s.key: s for s in inv.services}
    if one.changed is not None:  # the record became one.ruleset: only its projection is left
        plan = make_plan(one.desired_part, canonical(one.applied_part), services, _derived_hints(desired))
        plan = replace(plan, desired=one.ruleset)  # what commit and verify_touched read
        logs.log.debug(f"incremental plan: {one.recompiled} of {len(services)} Services compiled, "
                       f"{len(one.changed)} compared")
    else:  # compile_oneshot does not consume the record then
        plan = make_plan(one.ruleset, live if live is not None else canonical(rec[0]), services,
                         _derived_hints(desired))
    return desired, plan, live, rec is not None, one.memo


def _compile_listing(desired, nft: Interface, target: Target, memo: bool):
    """(compile.compile_all of `desired`, the live ruleset): a helper thread lists the
    kernel while the Services compile, since libnftables lists outside the GIL; the
    listing is parsed, and its index ranges taken, once they are compiled."""
    from concurrent.futures import ThreadPoolExecutor

    from reconciler import progress
    from reconciler.compile import allocation_of, compile_all

    live: list[Ruleset] = []

    def listed():
        live.append(parse_live(texts.result(), target.table))
        return allocation_of(live[0])

    with progress.step(f"listing table {target.table} in the kernel and compiling"), \
            ThreadPoolExecutor(1, thread_name_prefix="listing") as pool:
        texts = pool.submit(list_live, nft, target.table)
        one = compile_all(desired.inventory, desired.config, desired.config_digest, listed, memo)
    return one, live[0]


def _keep_ranges(desired, live: Ruleset):
    """Layout "sharded": the desired ruleset with the kernel's endpoint index ranges kept
    where they still fit (compile.relocate), so a plan touches only changed Services."""
    from dataclasses import replace

    ruleset = relocate(desired.ruleset, live)
    return desired if ruleset is desired.ruleset else replace(desired, ruleset=ruleset)


def _derived_hints(desired) -> dict:
    """The Services whose topology hints nftrec derived (shown by plan and apply)."""
    from reconciler.compile import derived_topology_hints

    inv = desired.inventory
    return derived_topology_hints(inv.services, inv.endpoint_slices, desired.config)


# --- plan ----------------------------------------------------------------------------------


def _removals(plan, percent: int, target: Target, override: str) -> str | None:
    """The mass-removal guard's refusal of `plan` (engine/guards.py), or None."""
    return removal_refusal((s.service for s in plan.services if s.action == "-"),
                           lambda: applied_services(target.store()), percent, override)


def run_plan(desired, target: Target, *, verbose: bool, output: str, detailed: bool,
             out: Path | None, refresh: bool, out_stream: TextIO = sys.stdout, config: Path | None = None,
             allow_removals: bool = False) -> int:
    """Print what apply would change; `out`: also save it as a plan file (`config`: the node
    config it was made with, named in the command printed to apply it). A revision the
    mass-removal guard refuses is printed, then refused (exit 1, no plan saved), unless
    `allow_removals`: then it is said as a warning."""
    nft = target.nft()
    try:
        token = kernel_token(nft) if out is not None else None  # before listing (see verify_applied)
        if desired.ruleset is None:
            desired, plan, live, _fast, _memo = plan_desired(desired, nft, target, refresh=refresh or out is not None,
                                                             memo=False)
        else:
            live, _fast = read_live_state(nft, target, refresh=refresh or out is not None)
            desired = _keep_ranges(desired, live)
            services = {s.key: s for s in desired.inventory.services}
            plan = make_plan(desired.ruleset, live, services, _derived_hints(desired))
        context = {"netns": target.netns, "table": target.table, "revision": desired.revision,
                   "fastPath": False}
        refusal = _removals(plan, desired.config.removal_guard, target,
                            "let through by --allow-removals" if allow_removals else "`--allow-removals` lets it through once")
        refused = refusal is not None and not allow_removals
        if refusal is not None:
            context["removalGuard"] = {"refused": refused, "message": refusal}
        verdict = desired.verdict  # `verify` set: the signature check, in the header
        if verdict is not None:
            context["verification"] = {"revision": verdict.revision, "signer": verdict.signer, "key": verdict.key,
                                       "time": verdict.time, "rollbackAllowed": verdict.rollback_allowed,
                                       "trust": desired.trust}
        if out is not None and not refused:
            from reconciler.engine.applygate import saved_rollout

            saved = planfile.SavedPlan.create(
                netns=target.netns or HOST, table=target.table, revision=desired.revision,
                desired=desired.ruleset, live_fingerprint=fingerprint(live),
                kernel_generation=token, transaction=list(plan.transaction.ops),
                summary=to_json(plan, **context)["summary"],
                verification=None if verdict is None else {
                    "source": str(Path(desired.source.root).absolute()), "oci": desired.source.oci,
                    "revision": verdict.revision, "signer": verdict.signer, "key": verdict.key, "time": verdict.time},
                rollout=saved_rollout(desired),
            )
            try:
                planfile.save(saved, out)
            except planfile.PlanFileError as e:
                raise CommandError(str(e)) from None
        if output == "json":
            json.dump(to_json(plan, **context), out_stream, indent=2)
            out_stream.write("\n")
        else:
            if verdict is not None:
                out_stream.write(verdict.describe() + "\n")
            out_stream.write(format_text(plan, verbose=verbose, color=_color(out_stream)))
            if out is not None and not refused:
                command = planfile.apply_command(out, state_dir=target.state_root, netns=target.netns, config=config)
                command += " --allow-removals" if refusal is not None else ""  # the guard is checked again
                out_stream.write(f"Saved the plan to {out}; apply it with:\n  {command}\n")
    finally:
        nft.close()
    if refused:
        raise CommandError(f"refused: {refusal}" + (f"; no plan was saved to {out}" if out is not None else ""))
    if refusal is not None:
        logs.log.warning(refusal)
    return EXIT_CHANGES if (detailed and not plan.empty) else EXIT_OK


# --- apply ---------------------------------------------------------------------------------


def run_apply(target: Target, *, desired=None, plan_path: Path | None = None,
              rollback: bool = False, verify: str = "touched", out_stream: TextIO = sys.stdout,
              confirm=None, node=None, allow_rollback: bool = False, allow_removals: bool = False) -> int:
    """Apply `desired` (a desired.Desired), a saved plan, or the previous history entry.
    `verify`: "touched" reads back what the transaction wrote and checks the generation
    token (sync.verify_touched); "full" lists and compares the whole table.
    `confirm` (confirm.ConfirmSpec): keep the result only if confirmed in time (confirm.py).
    `node`, `allow_rollback`: a saved plan's node config (its `verify`) and the override
    (verify_saved). The mass-removal guard (guards.py) refuses a revision or a saved plan
    removing too many applied Services unless `allow_removals`; --rollback is not guarded."""
    lock = target.hold_lock()
    nft = None
    store = target.store()
    revision = None
    try:
        nft = target.nft()
        sweep_trace_tables(nft, target.netns)  # a killed `trace --kernel`'s table; before the token below
        read_history(store)  # a damaged entry would block status and rollback later
        adopt_commit(store, nft, target.table)  # a killed watch's last commit, kept before it is replaced
        status = read_status(store)
        token_before = kernel_token(nft)  # before the kernel is read: see sync.verify_touched
        plan_id, services, memo = None, {}, None
        verdict = trust = None  # a saved plan's, verified again
        compiled_here = desired is not None and desired.ruleset is None  # read with compile=False
        if compiled_here:
            desired, plan, _live, fast, memo = plan_desired(desired, nft, target, refresh=False)
        else:
            # A saved plan is checked against a real listing (its fingerprint came from one);
            # otherwise the unchanged-generation fast path saves one full listing.
            live, fast = read_live_state(nft, target, refresh=plan_path is not None)
        if plan_path is not None:
            try:
                saved = planfile.load(plan_path)
            except planfile.PlanFileError as e:
                raise CommandError(str(e)) from None
            if (saved.netns, saved.table) != (target.netns or HOST, target.table):
                raise CommandError(
                    f"{plan_path} was made for netns {saved.netns} table {saved.table}, not "
                    f"{target.netns or 'the host'} table {target.table}; run `nftrec plan --out` there")
            verdict, trust = verify_saved(saved, plan_path, node, store, allow_rollback)
            if planfile.already_applied(saved, status):
                raise CommandError(f"{plan_path} (plan {saved.plan_id[:12]}) was already applied; "
                                   f"make a new one with `nftrec plan --out {plan_path}`")
            if planfile.is_stale(saved, fingerprint(live)):
                raise CommandError(f"{plan_path} is stale: the kernel's {target.table} tables changed "
                                   f"since the plan was made; make a new one with `nftrec plan --out {plan_path}`")
            ruleset, revision, plan_id = saved.desired_ruleset(), saved.revision, saved.plan_id
            plan = make_plan(ruleset, live)
            if canonical_ops(plan.transaction.ops) != canonical_ops(saved.transaction):
                raise CommandError(f"{plan_path}: its transaction no longer follows from its desired "
                                   f"ruleset and the kernel; make a new plan")
        elif rollback:
            if status.cleaned_up_at is not None:
                raise CommandError(f"nothing to roll back from: `nftrec cleanup` removed the tables at "
                                   f"{status.cleaned_up_at}; `nftrec apply DIR` applies the manifests again")
            entry = store.previous()
            if entry is None:
                raise CommandError(f"nothing to roll back to: the state in {store.dir} has no earlier "
                                   f"applied ruleset")
            ruleset, revision = store.load_ruleset(entry), entry.revision
            plan = make_plan(ruleset, live)
            print(logs.escape(f"Rolling back to revision {short_revision(revision)} applied at {entry.applied_at}."),
                  file=out_stream)
        elif compiled_here:
            ruleset, revision = desired.ruleset, desired.revision
            services = {s.key: s for s in desired.inventory.services}
        else:
            desired = _keep_ranges(desired, live)
            ruleset, revision = desired.ruleset, desired.revision
            services = {s.key: s for s in desired.inventory.services}
            plan = make_plan(ruleset, live, services, _derived_hints(desired))

        if not rollback:
            refusal = _removals(plan, (desired.config if desired is not None else node).removal_guard, target,
                                "let through by --allow-removals" if allow_removals else
                                "nothing was changed; `nftrec apply --allow-removals` lets it through once")
            if refusal is not None and not allow_removals:
                out_stream.write(format_text(plan, color=_color(out_stream)))
                store.record_attempt(revision, f"refused by the removal guard: {refusal}")
                applystatus.report("refused", revision, f"refused by the removal guard: {refusal}")
                raise CommandError(f"refused: {refusal}")
            if refusal is not None:
                logs.log.warning(refusal)
        out_stream.write(format_text(plan, color=_color(out_stream)))
        pending = None
        if confirm is not None and not plan.empty:  # nothing changes: nothing to confirm
            pending = confirm_window.begin_confirm(nft, store, writer="nftrec apply", revision=revision,
                                           digest=digest(ruleset), timeout=confirm.timeout, checks=confirm.checks)
        if not fast:  # a plan from a listing is never re-planned by commit: slim it now
            plan = slim_created(plan)
        try:
            plan, _ = commit(nft, target.table, ruleset, plan, services,
                             from_memory="the recorded state" if fast else None)
        except MayHaveCommitted as e:  # the pending confirmation stays: the next command rolls back first
            store.record_attempt(revision, e.text)
            applystatus.report("failed", revision, e.text)
            raise CommandError(f"the transaction may have committed: {e.text.strip()}. " + (
                f"The pending confirmation stays in {confirm_window.pending_path(store)}: the next nftrec command "
                f"in {target.where} rolls back first" if pending is not None else
                "Run `nftrec plan` to see what the kernel holds")) from None
        except NftError as e:
            if pending is not None:
                confirm_window.clear_pending(store)  # atomic: nothing was committed
            store.record_attempt(revision, e.text)
            applystatus.report("failed", revision, e.text)
            raise CommandError(f"the kernel rejected the transaction; nothing was changed "
                               f"(the previous ruleset is whole). nft said:\n{e.text.strip()}", lines=True) from None
        try:
            if verify == "full" or touched_objects(plan) is None:
                after, token, after_fp = verify_listed(nft, target, ruleset)
            else:
                after, token = verify_touched(nft, target, ruleset, plan, token_before=token_before)
                after_fp = None  # nothing was listed
        except CommandError as e:
            if pending is not None:
                confirm_window.roll_back(nft, store, pending, f"the apply could not be verified: {e}")
            applystatus.report("failed", revision, f"the apply could not be verified: {e}")
            raise
        token = forget_affinity_clients(nft, target.table, plan, token)  # before the token is recorded

        from_dir = desired is not None and plan_path is None and not rollback
        if from_dir:
            verdict, trust = desired.verdict, desired.trust

        recorded = []

        def record():
            # the fingerprint of a listing: None when only the touched objects were read
            # (the whole ruleset is not canonicalised just for it)
            kind = "rollback" if rollback else "plan" if plan_path is not None else "apply"
            if getattr(verdict, "rollback_allowed", False):
                kind = "allow-rollback"  # `apply --allow-rollback` let an older revision through
            signed_at = getattr(verdict, "time", None)
            commit = append_commit(store, revision=revision, writer="nftrec apply", kind=kind, token=token,
                                   operations=len(plan.transaction), fingerprint=after_fp,
                                   services=[f"{s.action}{s.service}" for s in plan.services],
                                   revision_time=signed_at, trust=trust)
            recorded[:] = [store.record_applied(revision, ruleset, after_fp, token, plan_id,
                                 input_digest=desired.input_digest if from_dir else None,
                                 config_digest=desired.config_digest if from_dir else None,
                                 compiled=memo if from_dir else None, commit=commit.sequence,
                                 revision_time=signed_at, trust=trust).desired_digest]

        if pending is not None:
            try:
                confirm_window.hold_window(nft, target, pending, confirm, record)
            except CommandError as e:  # rolled back
                applystatus.report("rolled-back", revision, str(e))
                raise
        else:
            record()
        applystatus.report("applied", revision)
        if desired is not None:
            # as kube-proxy after every sync; a saved plan or a rollback carries no model to
            # tell endpoints from frontends, so the next apply from manifests (or watch) does it
            clean_udp_conntrack(target.netns, desired.inventory, desired.config, plan)
        print(logs.escape(f"Apply complete: {len(plan.transaction)} operations in one transaction; "
                          f"revision {short_revision(revision)} (digest {(recorded[0] if recorded else digest(ruleset))[:12]}) is live in "
                          f"{target.where}."), file=out_stream)
        return EXIT_OK
    finally:
        if nft is not None:
            nft.close()
        lock.release()


def saved_source(made: dict):
    """The source a saved plan's verification names: an OCI artifact's tree (its store
    opened as the OCI source's again), else the directory."""
    from reconciler.intake import ManifestSource, open_store

    root = Path(made["source"])
    if made.get("oci"):
        open_store(root.parent)
    return ManifestSource(str(root), root, oci=bool(made.get("oci")))


def verify_saved(saved, path: Path, node, store, allow_rollback: bool):
    """(Verdict, trust) of a saved plan's revision when the node config sets `verify`, else
    (None, None): verified again at the source the plan names, against the rollback
    baseline of now (the plan may be older than the last apply). A plan made without
    `verify` is refused: its revision was never checked. CommandError when refused."""
    from reconciler.engine.commits import rollback_baseline
    from reconciler.engine.desired import Unverified, check_signed

    if node is None or node.verify is None:
        return None, None
    made = saved.verification
    if made is None:
        raise CommandError(f"{path} was made without `verify`, and the node config sets `verify`: its revision "
                           f"{short_revision(saved.revision)} was never checked; nothing was changed. Make the plan "
                           f"again with verify set (`nftrec plan DIR --out {path}` with this node config)")
    try:
        verdict, trust = check_signed(node, saved_source(made), rollback_baseline(store), allow_rollback)
    except Unverified as e:
        if e.record:
            store.record_attempt(e.revision or saved.revision, str(e))
            applystatus.report("refused", e.revision or saved.revision, str(e))
        raise CommandError(f"{path}: {e}") from None
    if verdict.revision != saved.revision:
        raise CommandError(f"{path} was made from revision {short_revision(saved.revision)}, and {made['source']} "
                           f"holds revision {short_revision(verdict.revision)} now; nothing was changed. Make a new "
                           f"plan with `nftrec plan --out {path}`")
    return verdict, trust


# --- status --------------------------------------------------------------------------------


def _ahead_drift(nft: Interface, target: Target, commit) -> Changes | None:
    """The drift for a commit the history lacks (commits.commit_ahead): none while the
    kernel is as the commit left it (its generation token, else its listing's
    fingerprint); None (unknown) otherwise, since its ruleset is not on disk."""
    if commit.token is not None and kernel_token(nft) == commit.token:
        return Changes()
    if commit.fingerprint is not None and fingerprint(read_live(nft, target.table)) == commit.fingerprint:
        return Changes()
    return None


def _cleaned_up(target: Target, status, output: str, out_stream: TextIO) -> bool:
    """`status` after `cleanup`: while the tables are still gone, say when they were removed
    and what was applied before (no drift: they were removed on purpose); True when said.
    Tables present again (made by hand since) get the usual drift report instead."""
    nft = target.nft()
    try:
        present = [(f, n) for f, n in nft.list_tables() if n == target.table and f in FAMILIES]
    finally:
        nft.close()
    if present:
        return False
    if output == "json":
        json.dump({"netns": target.netns, "table": target.table, "cleanedUpAt": status.cleaned_up_at,
                   "lastAppliedRevision": status.last_applied_revision, "lastAppliedAt": status.last_applied_at,
                   "drift": False, "driftedServices": [], "driftedObjects": 0}, out_stream, indent=2)
        out_stream.write("\n")
    else:
        out_stream.write(logs.escape(f"table:     {target.table} in {target.where}") + "\n")
        out_stream.write(logs.escape(f"applied:   cleaned up at {status.cleaned_up_at} (nothing applied); before it, "
                                     f"revision {short_revision(status.last_applied_revision)} applied at "
                                     f"{status.last_applied_at}; `nftrec apply DIR` applies again") + "\n")
    return True


_TRUST = {  # how `verify` accepted the applied revision (desired.trust_of), for `status`
    "signed": "signed by a key of verify.keys, and no rollback from the revision applied before",
    "first-use": "trusted on first use: signed by a key of verify.keys, but no earlier applied revision was "
                 "recorded, so nothing was checked for a rollback",
    "allow-rollback": "signed by a key of verify.keys, a rollback from the revision applied before let through "
                      "by --allow-rollback or allowRollback",
}


def run_status(target: Target, *, output: str, detailed: bool = False, out_stream: TextIO = sys.stdout) -> int:
    store = target.store()
    status = read_status(store)
    entries = read_history(store)
    pending = confirm_window.pending_status_json(store)  # an apply awaiting confirmation
    # a commit recorded at commit time whose history entry has not been written (a watch
    # killed before its state writer ran): it names what the kernel holds
    ahead = commit_ahead(store, status)
    if ahead is None and (not status.ever_applied or not entries):
        ahead = newest_commit(store)  # the history was lost (deleted, damaged): the record still names it
    if ahead is None and (not status.ever_applied or not entries):
        waiting = "".join(f"; {line.strip()}" for line in confirm_window.pending_status_lines(pending)
                          + source_status_lines(read_source_state(store)))
        raise CommandError(f"nothing was applied to table {target.table} in {target.where} "
                           f"(state: {store.dir}); run `nftrec apply`{waiting}")
    if ahead is None and status.cleaned_up_at is not None and _cleaned_up(target, status, output, out_stream):
        return EXIT_OK
    nft = target.nft()
    try:
        if ahead is None:
            applied = store.load_ruleset(entries[-1])
            drift = diff(applied, read_live(nft, target.table))
        else:
            drift = _ahead_drift(nft, target, ahead)
    finally:
        nft.close()
    applied_revision, applied_at, digest_ = status.last_applied_revision, status.last_applied_at, status.desired_digest
    attempted, attempted_at, error = status.last_attempted_revision, status.last_attempted_at, status.last_error
    trust = status.last_applied_trust
    if ahead is not None:  # status.json's attempt came before that commit (the state writer runs in order)
        applied_revision, applied_at, digest_ = ahead.revision, ahead.committed_at, None
        attempted, attempted_at, error = ahead.revision, ahead.committed_at, None
        trust = ahead.trust
    doc = {
        "netns": target.netns, "table": target.table,
        "lastAppliedRevision": applied_revision,
        "lastAttemptedRevision": attempted,
        "lastAppliedAt": applied_at, "lastError": error, "lastAppliedTrust": trust,
        "desiredDigest": digest_, "drift": None if drift is None else not drift.empty,
        "driftedServices": sorted(drift.owners()) if drift is not None else [],
        "driftedObjects": len(drift) if drift is not None else None,
    }
    if ahead is not None:
        doc["commit"] = ahead.to_json()  # the commit record names what the kernel holds
    probes = read_probe_state(store)  # written by nftrec watch
    doc.update(probe_status_json(probes))
    source = read_source_state(store)  # written by nftrec watch oci://...
    doc.update(source_status_json(source))
    doc.update(pending)
    from reconciler import clock
    from reconciler.engine.holds import hold_status_json, hold_status_lines, read_hold
    from reconciler.engine.rollout import read_rollout_state, rollout_status_json, rollout_status_lines

    hold, rollout, now = read_hold(target.state_root, target.netns), read_rollout_state(store), clock.now()
    if ahead is not None:  # rollout.json is compared with what the commit record says, as the lines above
        from dataclasses import replace

        status = replace(status, last_applied_revision=ahead.revision, last_attempted_revision=ahead.revision)
    doc.update(hold_status_json(hold, now), **rollout_status_json(rollout, status))
    if output == "json":
        json.dump(doc, out_stream, indent=2)
        out_stream.write("\n")
    else:
        def w(line: str) -> None:  # revisions, paths, errors recorded from elsewhere: one line each
            out_stream.write(logs.escape(line.rstrip("\n")) + "\n")

        w(f"table:     {target.table} in {target.where}\n")
        if ahead is None:
            w(f"applied:   revision {short_revision(applied_revision)} at {applied_at}"
              f" (digest {(digest_ or '')[:12]})\n")
        else:
            w(f"applied:   revision {short_revision(applied_revision)} at {applied_at} (committed by {ahead.writer}, "
              f"{ahead.operations} operations; its ruleset is not in the history yet)\n")
        if trust is not None:
            w(f"verified:  {_TRUST.get(trust, trust)}\n")
        if attempted != applied_revision or error:
            w(f"attempted: revision {short_revision(attempted)} at {attempted_at}: {error or 'ok'}\n")
        if drift is None:
            w("drift:     unknown: the kernel changed since that commit, whose ruleset is not recorded; "
              "`nftrec plan DIR` compares the kernel with the manifests\n")
        elif drift.empty:
            w("drift:     no, the kernel matches the last applied ruleset\n")
        else:
            owners = sorted(drift.owners())
            shown = ", ".join(owners[:5]) + (" ..." if len(owners) > 5 else "")
            w(f"drift:     yes, {len(drift)} objects differ"
              + (f" (Services: {shown})" if owners else " (shared objects)")
              + "; `nftrec plan` shows them, `nftrec apply` repairs them\n")
        for line in (probe_status_lines(probes) + source_status_lines(source) + confirm_window.pending_status_lines(pending)
                     + hold_status_lines(hold, now) + rollout_status_lines(rollout, status)):
            w(line)
    if drift is None or not drift.empty:
        return EXIT_CHANGES
    if error:  # the newest revision attempted was not applied: `status || alert` must see it
        return EXIT_NOT_APPLIED if detailed else EXIT_ERROR
    return EXIT_OK
