"""The sync step shared by `nftrec apply` and `nftrec watch`: plan → one transaction →
a kernel verified to hold the desired ruleset. The caller records the state.

A plan made from memory (apply's recorded state, or watch's last commit, trusted while
the kernel's generation token says nobody else committed) saves listing the tables. If
the kernel rejects its transaction, the memory was wrong after all: `commit` lists the
tables, plans again and tries once more. A plan made from a listing is not retried.
"""

from __future__ import annotations

from reconciler import logs, progress
from reconciler.compile import Ruleset
from reconciler.engine.changes import diff
from reconciler.engine.plan import Plan, make_plan
from reconciler.engine.target import CommandError, Target
from reconciler.kernel import Libnftables, NftError, kernel_token, read_live


def commit(nft: Libnftables, table: str, desired: Ruleset, plan: Plan, services: dict, *,
           from_memory: str | None) -> tuple[Plan, bool]:
    """Run `plan`'s transaction: (the plan that ran, whether it was re-planned from a
    listing). `from_memory` says where a plan not made from a listing came from ("the
    recorded state", "memory"); None for a listing. NftError propagates: the transaction
    is atomic, so the kernel still holds the previous ruleset whole."""
    if plan.empty:
        return plan, False
    try:
        with progress.step(f"committing the transaction ({len(plan.transaction)} nft operations)"):
            nft.run(plan.transaction)
        return plan, False
    except NftError as e:
        if from_memory is None:
            raise
        logs.log.warning(f"the transaction planned from {from_memory} failed ({e.text.strip()}); "
                         f"listing the kernel's tables and planning again")
    plan = make_plan(desired, read_live(nft, table), services)
    if not plan.empty:
        with progress.step(f"committing the transaction ({len(plan.transaction)} nft operations)"):
            nft.run(plan.transaction)
    return plan, True


def verify_applied(nft: Libnftables, target: Target, desired: Ruleset) -> tuple[Ruleset, int | None]:
    """Re-read the kernel; (live, the generation token the listing is at least as new as).

    The token is taken BEFORE listing: a commit by someone else after it makes the
    recorded token stale (the next plan lists), never hides that commit behind it."""
    token = kernel_token(nft)
    live = read_live(nft, target.table)
    left = diff(desired, live)
    if not left.empty:
        sample = "; ".join(f"{c.action} {c.family} {c.kind} {c.name}" for c in list(left)[:5])
        raise CommandError(
            f"the kernel does not match the desired ruleset after the transaction "
            f"({len(left)} differences, e.g. {sample}); another program may be editing "
            f"table {target.table} in {target.where}. Run `nftrec plan -v` to see them.")
    return live, token


def verify_commit(nft: Libnftables, target: Target, desired: Ruleset, *, token_before: int | None,
                  committed: bool, full: bool) -> tuple[Ruleset | None, int | None]:
    """After `commit`: (the verified listing, or None when none was needed; the token).

    When the token advanced by exactly our one commit (or not at all, with nothing
    committed), nobody else wrote in between and the transaction was atomic, so the
    kernel holds `desired` without listing. Otherwise, and always when `full`, list and
    compare (`verify_applied`)."""
    after = kernel_token(nft)
    expected = (token_before + 1 if committed else token_before) if token_before is not None else None
    if full or after is None or after != expected:
        return verify_applied(nft, target, desired)
    return None, after
