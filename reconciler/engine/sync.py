"""The sync step shared by `nftrec apply` and `nftrec watch`: plan → one transaction →
a kernel verified to hold the desired ruleset; the caller records the state. A plan made
from memory (trusted while the generation token says nobody else committed) that the
kernel rejects is re-planned once from a listing.
"""

from __future__ import annotations

import ipaddress

from reconciler import logs, progress
from reconciler.compile import AFFINITY_SET, Element, NamedSet, Ruleset, Table, affinity_updates
from reconciler.engine.changes import diff
from reconciler.engine.plan import Plan, make_plan
from reconciler.engine.target import CommandError, Target
from reconciler.intake import Inventory, NodeConfig
from reconciler.kernel import (
    Interface, MayHaveCommitted, NftError, NotFound, Transaction, cleanup_udp, kernel_token, parse_duration, read_live,
    read_live_objects, read_runtime_keys,
)


def commit(nft: Interface, table: str, desired: Ruleset, plan: Plan, services: dict, *,
           from_memory: str | None) -> tuple[Plan, bool]:
    """Run `plan`'s transaction: (the plan that ran, whether it was re-planned from a
    listing). `from_memory` says where a plan not made from a listing came from ("the
    recorded state", "memory"); None for a listing. NftError propagates: the transaction
    is atomic, so the kernel still holds the previous ruleset whole, unless it is
    MayHaveCommitted (never re-planned: the caller says so and keeps what restores)."""
    if plan.empty:
        return plan, False
    try:
        with progress.step(f"committing the transaction ({len(plan.transaction)} nft operations)"):
            nft.run(plan.transaction)
        return plan, False
    except NftError as e:
        if from_memory is None or isinstance(e, MayHaveCommitted):
            raise
        logs.log.warning(f"the transaction planned from {from_memory} failed ({e.text.strip()}); "
                         f"listing the kernel's tables and planning again")
    plan = make_plan(desired, read_live(nft, table), services)
    if not plan.empty:
        with progress.step(f"committing the transaction ({len(plan.transaction)} nft operations)"):
            nft.run(plan.transaction)
    return plan, True


def verify_applied(nft: Interface, target: Target, desired: Ruleset) -> tuple[Ruleset, int | None]:
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


def touched_objects(plan: Plan) -> dict[str, tuple[list[str], list[NamedSet]]] | None:
    """What the plan's transaction wrote, to read back: {family: (chains added or
    rewritten, sets added, re-created or with elements added/removed/changed)}. None when
    a table was (re-)created: then everything was written."""
    out: dict[str, tuple[list[str], list[NamedSet]]] = {}
    for family, fc in plan.changes.families.items():
        if fc.table is not None:
            return None
        table = plan.desired.tables.get(family)
        chains = sorted({c.name for c in fc.chains_added + fc.chains_changed})
        names = {c.name for c in fc.sets_added + fc.sets_changed + fc.elements_added + fc.elements_removed
                 + fc.elements_changed}
        sets = [table.sets[n] for n in sorted(names) if table is not None and n in table.sets]
        if chains or sets:
            out[family] = (chains, sets)
    return out


def verify_touched(nft: Interface, target: Target, desired: Ruleset, plan: Plan, *,
                   token_before: int | None) -> tuple[Ruleset | None, int | None]:
    """`--verify touched`: (the full listing, or None; the token). A token that advanced by
    exactly our commit since `token_before` proves nobody else wrote, so only the chains
    and sets the transaction wrote are read back and compared. Anything else (another
    writer, a re-created table) lists and compares everything (`verify_applied`)."""
    after = kernel_token(nft)
    touched = touched_objects(plan)
    expected = (token_before + (0 if plan.empty else 1)) if token_before is not None else None
    if after is None or after != expected or touched is None:
        return verify_applied(nft, target, desired)
    live = read_live_objects(nft, target.table, touched)
    if live is None:  # an object we just wrote is gone: say what, from a full listing
        return verify_applied(nft, target, desired)
    want = Ruleset()
    for family, (chains, sets) in touched.items():
        d = desired.tables[family]
        want.tables[family] = Table(family, d.name, None, {c: d.chains[c] for c in chains},
                                    {st.name: st for st in sets})
        live.tables[family].comment = None
    left = diff(want, live)
    if not left.empty:
        sample = "; ".join(f"{c.action} {c.family} {c.kind} {c.name}: {c.reason}" for c in list(left)[:5])
        raise CommandError(
            f"the kernel does not hold what the transaction wrote ({len(left)} differences in the objects "
            f"it touched, e.g. {sample}); run `nftrec plan -v` to see them, and report it if they persist")
    return None, after


def verify_commit(nft: Interface, target: Target, desired: Ruleset, *, token_before: int | None,
                  committed: bool, full: bool) -> tuple[Ruleset | None, int | None]:
    """After `commit`: (the verified listing, or None when none was needed; the token).
    A token advanced by exactly our commit (or unchanged, with nothing committed) means
    the atomic transaction left `desired` in the kernel; otherwise, and always when
    `full`, list and compare (`verify_applied`)."""
    after = kernel_token(nft)
    expected = (token_before + 1 if committed else token_before) if token_before is not None else None
    if full or after is None or after != expected:
        return verify_applied(nft, target, desired)
    return None, after


def udp_services(inventory: Inventory | None) -> set[str]:
    """Keys of the Services with a UDP port."""
    if inventory is None:
        return set()
    return {s.key for s in inventory.services if any(p.protocol == "UDP" for p in s.ports)}


def clean_udp_conntrack(netns: str | None, inventory: Inventory, config: NodeConfig, plan: Plan,
                        old: Inventory | None = None) -> int | None:
    """After a commit: delete UDP conntrack entries pinned to endpoints that went away,
    as kube-proxy does, when the plan touched a UDP Service (of `inventory` or `old`).
    The number deleted, or None when nothing was tried or the cleanup failed (logged as
    a warning: it never fails a sync that already reached the kernel)."""
    touched = {s.service for s in plan.services}
    if not touched & (udp_services(old) | udp_services(inventory)):
        return None
    try:
        n = cleanup_udp(netns, inventory, config)
    except Exception as e:
        logs.log.warning(f"UDP conntrack cleanup failed: {e}")
        return None
    if n:
        logs.log.info(f"deleted {n} stale UDP conntrack entr{'y' if n == 1 else 'ies'}",
                      extra={"fields": {"event": "conntrack", "deleted": n}})
    return n


# --- ClientIP affinity entries of endpoints that went -------------------------------------

_FORGET_ATTEMPTS = 3  # each with a fresh listing: an entry may expire between listing and delete


def forgotten_affinity_ids(plan: Plan) -> dict[str, set[tuple[int, int]]]:
    """{family: endpoint ids} whose entries in the shared affinity set (layout sharded)
    the plan made stale: an endpoint chain removed or its `update` timeout changed.
    kube-proxy deletes such an endpoint's own set, so a returning endpoint starts without
    clients. Read from the plan's changed chains only."""
    out: dict[str, set[tuple[int, int]]] = {}
    for family, fc in plan.changes.families.items():
        if fc.table is not None:  # the table (and its set) was created, re-created or deleted
            continue
        ids: set[tuple[int, int]] = set()
        for c in fc.chains_removed:
            ids.update(affinity_updates(c.old))
        for c in fc.chains_changed:
            new = {k: parse_duration(t) for k, t in affinity_updates(c.new).items()}
            ids.update(k for k, t in affinity_updates(c.old).items() if new.get(k) != parse_duration(t))
        if ids:
            out[family] = ids
    return out


def _stale_entries(nft: Interface, table: str, family: str, ids: set[tuple[int, int]]) -> list[Element]:
    """The set's current elements whose endpoint id is one of `ids`, keys rebuilt from
    parsed values (what goes back into a command is never the listing's raw text)."""
    out = []
    for key in read_runtime_keys(nft, family, table, AFFINITY_SET) or ():
        if len(key) != 3 or not (key[1].isdigit() and key[2].isdigit()):
            continue
        if (int(key[1]), int(key[2])) in ids:
            out.append(Element((str(ipaddress.ip_address(key[0])), str(int(key[1])), str(int(key[2])))))
    return out


def forget_affinity_clients(nft: Interface, table: str, plan: Plan, token: int | None) -> int | None:
    """After a verified commit (no rule references those ids any more): delete the shared
    affinity set's entries of `forgotten_affinity_ids`, as kube-proxy forgets them.
    Returns the token to record: advanced by our deletes only when nothing else committed
    in between, else the one before. Never raises: a failure is a warning, and the entries
    expire after their Service's affinity timeout."""
    forgotten = forgotten_affinity_ids(plan)
    if not forgotten:
        return token
    committed = deleted = 0
    set_ = NamedSet(AFFINITY_SET, "")
    for family, ids in forgotten.items():
        try:
            for attempt in range(_FORGET_ATTEMPTS):
                doomed = _stale_entries(nft, table, family, ids)
                if not doomed:
                    break
                tx = Transaction()
                for e in doomed:
                    tx.delete(family, table, e, set=set_)
                try:
                    nft.run(tx)
                except NotFound:  # one of them expired since the listing: the transaction did nothing
                    if attempt + 1 == _FORGET_ATTEMPTS:
                        raise
                    continue
                committed += 1
                deleted += len(doomed)
                break
        except Exception as e:
            text = e.text.strip() if isinstance(e, NftError) else str(e)
            logs.log.warning(
                f"could not delete the ClientIP affinity entries of {len(ids)} endpoint(s) removed or with a changed "
                f"timeout from set "
                f"{family} {table} {AFFINITY_SET} ({text}); their clients go back to those endpoints if they "
                f"return before the entries expire (the Service's affinity timeout)",
                extra={"fields": {"event": "affinity", "ok": False, "family": family, "endpoints": len(ids)}})
    if deleted:
        logs.log.info(f"deleted {deleted} ClientIP affinity entr{'y' if deleted == 1 else 'ies'} of removed endpoints",
                      extra={"fields": {"event": "affinity", "deleted": deleted}})
    if not committed or token is None:
        return token
    try:
        after = kernel_token(nft)
    except NftError:
        return token
    return after if after == token + committed else token
