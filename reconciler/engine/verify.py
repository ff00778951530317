"""`apply`'s verification by one listing, and the slim plan read after a commit.

When the transaction created the table (a cold `apply`: everything was written) or
`--verify full` is asked for, the whole table is listed and compared with the desired
ruleset by fingerprint (`kernel.fingerprint`) plus each set's `typeof`, the one field
`diff` compares that the fingerprint leaves out. Only when they differ is the table
listed again and diffed object by object (`sync.verify_applied`), to name the differences.
"""

from __future__ import annotations

from reconciler import logs
from reconciler.compile import Ruleset
from reconciler.engine.changes import Changes, FamilyChanges
from reconciler.engine.plan import Plan, ServiceChange
from reconciler.engine.sync import verify_applied
from reconciler.engine.target import Target
from reconciler.kernel import Interface, canonical, fingerprint, kernel_token, read_live

Expected = tuple[str, dict[tuple[str, str], bool]]  # (fingerprint, typeof per (family, set))


def _typeofs(rs: Ruleset) -> dict[tuple[str, str], bool]:
    return {(fam, name): s.typeof for fam, t in rs.tables.items() for name, s in t.sets.items()}


def expected(desired: Ruleset) -> Expected:
    """What a listing of the kernel holding `desired` fingerprints to (see the module doc)."""
    return fingerprint(canonical(desired)), _typeofs(desired)


def verify_listed(nft: Interface, target: Target, desired: Ruleset) -> tuple[Ruleset, int | None, str]:
    """List the tables and check they hold `desired`: (the listing, the generation token
    taken before it, as in verify_applied, and the listing's fingerprint). CommandError
    (from verify_applied) when they differ."""
    token = kernel_token(nft)
    live = read_live(nft, target.table)
    got = fingerprint(live)
    want = expected(desired)
    if got == want[0] and _typeofs(live) == want[1]:
        return live, token, got
    logs.log.debug("the listing's fingerprint differs from the desired ruleset's; comparing object by object")
    live, token = verify_applied(nft, target, desired)  # raises with the differences
    return live, token, fingerprint(live)


def slim_created(plan: Plan) -> Plan:
    """`plan` without its per-object Changes when its transaction (re-)creates every table
    it touches (a cold `apply`, a first sync), else `plan`: what is read after the commit
    is then the same (a full listing verifies, no affinity entry is forgotten, conntrack
    asks which Services changed), and the Changes are freed before nft parses the
    transaction. Only for a plan that commit() will not re-plan."""
    families = plan.changes.families
    if not families or any(fc.table is None for fc in families.values()):
        return plan
    return Plan(desired=plan.desired,
                changes=Changes({f: FamilyChanges(f, table=fc.table) for f, fc in families.items()}),
                transaction=plan.transaction,
                services=[ServiceChange(s.action, s.service, s.summary) for s in plan.services],
                shared=[], derived_hints=plan.derived_hints)
