"""`apply`'s verification by one listing, and the work it prepares while nft commits.

Pipeline position: plan → sync.commit → **verify** → state.record_applied.

When the transaction created the table (a cold `apply`: everything was written) or
`--verify full` is asked for, the whole table is listed and compared with the desired
ruleset. The comparison is by fingerprint (`kernel.fingerprint`, the sha256 of the
canonical form that `plan --out` and status already use) plus each set's `typeof`, the one
field `diff` compares that the fingerprint leaves out: equal fingerprints mean `diff`
would find nothing. Only when they differ does `sync.verify_applied` list again and diff
object by object, to fail with the differences (or to pass, should the fingerprint differ
over something `diff` ignores). A cold `apply` at 1,000 Services spent ~0.15-0.2 s in that
diff; the fingerprints cost ~0.02 s each.

The desired side's fingerprint and the history entry's bytes (`compile.digest_parts`)
do not depend on the kernel, so `Prepared` computes them on a thread while the commit
runs: libnftables runs without the GIL (ctypes releases it), so the main process would
otherwise sit idle for the whole commit (0.15-0.3 s at 1,000 Services).
"""

from __future__ import annotations

import threading

from reconciler import logs
from reconciler.compile import Ruleset, digest_parts
from reconciler.engine.changes import Changes, FamilyChanges
from reconciler.engine.plan import Plan, ServiceChange
from reconciler.engine.sync import verify_applied
from reconciler.engine.target import Target
from reconciler.kernel import Interface, canonical, fingerprint, kernel_token, read_live

# Above this many operations the commit is not overlapped: at 10,000 Services (20,644
# operations) the history bytes (~25 MB) and the canonical copy would sit on top of nft's
# own peak (~240 MB for the transaction's parse tree); computed after the commit instead,
# once nft's memory is trimmed (kernel/nft.py). About 4,500 Services of the bench mix
# (1k: 2,988 operations). It was 20,000 while every new chain was declared twice
# (engine/changes.transaction_for): 10k then stayed above it by a wide margin.
OVERLAP_MAX_OPS = 10_000

Expected = tuple[str, dict[tuple[str, str], bool]]  # (fingerprint, typeof per (family, set))


def _typeofs(rs: Ruleset) -> dict[tuple[str, str], bool]:
    return {(fam, name): s.typeof for fam, t in rs.tables.items() for name, s in t.sets.items()}


def expected(desired: Ruleset) -> Expected:
    """What a listing of the kernel holding `desired` fingerprints to (see the module doc)."""
    return fingerprint(canonical(desired)), _typeofs(desired)


def verify_listed(nft: Interface, target: Target, desired: Ruleset,
                  want: Expected | None = None) -> tuple[Ruleset, int | None, str]:
    """List the tables and check they hold `desired`: (the listing, the generation token
    taken before it, as in verify_applied, and the listing's fingerprint). CommandError
    (from verify_applied) when they differ. `want`: expected(desired), if already known."""
    token = kernel_token(nft)
    live = read_live(nft, target.table)
    got = fingerprint(live)
    want = want or expected(desired)
    if got == want[0] and _typeofs(live) == want[1]:
        return live, token, got
    logs.log.debug("the listing's fingerprint differs from the desired ruleset's; comparing object by object")
    live, token = verify_applied(nft, target, desired)  # raises with the differences
    return live, token, fingerprint(live)


class Prepared:
    """expected(ruleset) (when `listed`: verification will list) and digest_parts(ruleset),
    computed on a thread while the plan's transaction commits. Either is None when it was
    not computed (an empty or large transaction: see OVERLAP_MAX_OPS; or it failed), and
    its user computes it then, failing there as it always did. `join()` after the commit.
    The ruleset must not change in between (nothing changes it after planning)."""

    def __init__(self, ruleset: Ruleset, plan: Plan, listed: bool):
        self.expected: Expected | None = None
        self.body: bytes | None = None
        self._thread = None
        if plan.empty or len(plan.transaction) > OVERLAP_MAX_OPS:
            return

        def work():
            try:
                if listed:
                    self.expected = expected(ruleset)
                self.body = digest_parts(ruleset)
            except Exception:  # left to the caller's own call, which reports it
                pass

        self._thread = threading.Thread(target=work, name="nftrec-prepare", daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def slim_created(plan: Plan) -> Plan:
    """`plan` as apply and watch's full sync read it after the commit, when its
    transaction (re-)creates every table it touches (a cold `apply`, a first sync); else
    `plan` itself. Then everything was written: the verification lists the whole table
    (touched_objects: None), no affinity entry is forgotten (forgotten_affinity_ids skips
    a created table) and the UDP conntrack cleanup asks only which Services changed. Only
    for a plan that commit() will not re-plan (it needs the whole plan for that). Dropping the per-object Changes (each element's,
    with its reason text) before nft parses the transaction lowered the commit's peak:
    at 10,000 Services they are ~25 MB of Python heap under nft's ~250 MB."""
    families = plan.changes.families
    if not families or any(fc.table is None for fc in families.values()):
        return plan
    return Plan(desired=plan.desired,
                changes=Changes({f: FamilyChanges(f, table=fc.table) for f, fc in families.items()}),
                transaction=plan.transaction,
                services=[ServiceChange(s.action, s.service, s.summary) for s in plan.services],
                shared=[], derived_hints=plan.derived_hints)
