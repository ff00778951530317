"""One-shot `apply` and `plan` under a fleet's rollout and the local hold: the revision of
a directory, of a saved plan (which records the fleet.yaml and revision time it was made
with) or of a rollback, decided by rollout.Gate; a held one is said on stderr and, for
apply, recorded as its attempt and reported (applystatus). A rollback is held by the local
hold alone: it goes back to a ruleset the node applied already, the emergency path.
"""

from __future__ import annotations

from pathlib import Path

from reconciler import logs
from reconciler.engine import applystatus
from reconciler.engine.rollout import Gate, fleet_bytes, fleet_rollout, parse_rollout_of, records_fetcher, time_of
from reconciler.engine.target import short_revision
from reconciler.intake import HALTED, Decision, Rollout


def one_shot(target, desired, root: Path | None, *, ignore_rollout: bool = False, ignore_hold: bool = False,
             record: bool = True, node=None, plan: Path | None = None) -> Decision | None:
    """One-shot `apply`/`plan` of `desired` (read from `root`): the decision when the
    revision is held (said on stderr and, for apply, recorded as its attempt under the
    lock and reported), None when it goes ahead. The applied revision itself goes ahead
    (a repair), whatever the rollout says. No `desired`: `apply --plan` (one_shot_plan)
    or `--rollback` (one_shot_rollback) for `node` (the node config)."""
    from reconciler.engine.state import read_status

    if desired is None and plan is not None:
        return one_shot_plan(target, node, plan, ignore_rollout=ignore_rollout, ignore_hold=ignore_hold)
    if desired is None:
        return one_shot_rollback(target, node, ignore_hold=ignore_hold)
    revision = desired.inventory.revision
    if revision == read_status(target.store()).last_applied_revision:
        return None
    rollout = fleet_rollout(root, desired.verdict)
    t, error = time_of(root, revision, desired.verdict) if rollout is not None else (None, None)
    return _gate(target, desired.config, revision, rollout, t, error, ignore_rollout=ignore_rollout,
                 ignore_hold=ignore_hold, record=record)


def saved_rollout(desired) -> dict:
    """What `apply --plan` decides a saved plan's revision by (planfile's `rollout`): the
    fleet.yaml it was read with (None: a plain root) and the revision's time, or why that
    cannot be read."""
    root = desired.source.root if desired.source is not None else None
    raw = fleet_bytes(root, desired.verdict) if root is not None else None
    t, error = time_of(root, desired.inventory.revision, desired.verdict) if raw is not None else (None, None)
    return {"fleet": None if raw is None else raw.decode("utf-8", "replace"), "revisionTime": t, "timeError": error}


def one_shot_plan(target, node, path: Path, *, ignore_rollout: bool = False, ignore_hold: bool = False
                  ) -> Decision | None:
    """`apply --plan`: a saved plan applies a new revision, so it follows `apply DIR`'s rule
    (its wave, paused, the halt, the local hold), decided now from what the plan recorded
    when it was made (saved_rollout). A plan that recorded none (an older nftrec) cannot be
    judged: refused unless --ignore-rollout. A plan nftrec cannot read is left to apply."""
    from reconciler.engine import planfile
    from reconciler.engine.state import read_status
    from reconciler.engine.target import CommandError

    try:
        revision, made = planfile.rollout_of(path)
    except planfile.PlanFileError:
        return None  # run_apply says what is wrong with it
    if revision == read_status(target.store()).last_applied_revision:
        return None
    if made is None and not ignore_rollout:
        raise CommandError(f"{path} does not record its revision's rollout (it was made by an older nftrec), so "
                           "whether its wave is open cannot be judged; nothing was changed. Make it again with "
                           f"`nftrec plan --out {path}`, or apply it with --ignore-rollout")
    made = made or {}
    rollout = parse_rollout_of(made["fleet"].encode("utf-8"), f"{path}: fleet.yaml") if made.get("fleet") else None
    return _gate(target, node, revision or "", rollout, made.get("revisionTime"), made.get("timeError"),
                 ignore_rollout=ignore_rollout, ignore_hold=ignore_hold)


def one_shot_rollback(target, node, *, ignore_hold: bool = False) -> Decision | None:
    """`apply --rollback`: the way back to a ruleset this node applied already, the
    emergency path, so no wave, pause or halt holds it; a local hold does (a site in its
    maintenance window wants no change at all; --ignore-hold overrides)."""
    entry = target.store().previous()
    if entry is None:
        return None  # run_apply says there is nothing to roll back to
    return _gate(target, node, entry.revision, None, None, None, ignore_rollout=True, ignore_hold=ignore_hold,
                 rollback=True)


def _gate(target, node, revision: str, rollout: Rollout | None, t: float | None, error: str | None, *,
          ignore_rollout: bool, ignore_hold: bool, record: bool = True, rollback: bool = False) -> Decision | None:
    from reconciler.engine.lock import LockHeld
    from reconciler.engine.state import read_status
    from reconciler.intake import identity_of

    store = target.store()
    status = read_status(store)
    # after `cleanup` the node has nothing applied: it takes the revision at once, as watch does
    applied = status.last_applied_revision if status.cleaned_up_at is None else None
    gate = Gate(store, target.state_root, records_fetcher(node), ignore_rollout, ignore_hold)
    # a rollback is held by the hold alone, even back to the applied revision (its ruleset differs)
    d = gate.decide(rollout, identity_of(node), revision, t, None if rollback else applied, time_error=error)
    if d.apply:
        return None
    overrides = "apply --ignore-hold overrides" if rollback else "apply --ignore-rollout, --ignore-hold override"
    logs.log.warning(f"revision {short_revision(revision)} {'was not' if record else 'would not be'} "
                     f"{'rolled back to' if rollback else 'applied'}: {d.reason}; revision "
                     f"{short_revision(applied)} stays ({overrides})")
    if record:
        try:
            with target.lock():
                store.record_attempt(revision, d.reason)
        except LockHeld:
            pass
        applystatus.report("halted" if d.state == HALTED else "held", revision, d.reason, rollout)
    return d
