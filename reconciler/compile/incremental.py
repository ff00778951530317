"""Compiling again after a change: only the Services that changed.

A Service is recompiled (`services.compile_service`) only when it or its slices changed,
with the same node config and service CIDRs. The ruleset is then the previous one with
the changed Services' objects swapped (`_swap`: copies of the touched tables and sets,
the unchanged objects shared), or, when that is not certainly equal (the static part
changed, an element shared by two Services, a map compacted, created or emptied),
`services.assemble` builds it whole.
`project` cuts two rulesets down to the objects of the changed Services plus the shared
skeleton, so a diff between them costs what the change costs, not what the table costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from reconciler.compile import layout
from reconciler.compile.ruleset import Chain, Element, Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.services import FAMILIES, NODEPORT_IPS, assemble_placed, check_fragment_references, \
    compile_service, compile_static, family_context, slices_by_service
from reconciler.intake import Inventory, NodeConfig

STATIC_FILLED = frozenset({NODEPORT_IPS})  # sets whose elements only the static part writes


@dataclass
class Compiled:
    """A desired ruleset with what it was compiled from (for the next incremental step)."""

    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset
    static_key: tuple
    node_key: tuple = ()  # the primary node IP per family (firewall chains depend on it)
    inputs: dict[str, tuple] = field(default_factory=dict)  # Service key -> (Service, slices)
    fragments: dict[str, object] = field(default_factory=dict)  # Service key -> ServiceFragment
    recompiled: int = 0
    # layout "sharded": the index ranges placed ((family, chain) -> (map, offset, N)), the
    # `previous` of the next compile; and the Services whose fragment was reused but
    # whose ranges moved anyway (a shard compacted): changed_services counts them.
    allocation: dict = field(default_factory=dict)
    moved: frozenset = frozenset()
    # for the next step's _swap: the static part as compiled (before any fragment), and
    # the ids of elements more than one Service produces (their owner is the first)
    static: Ruleset | None = None
    shared: frozenset = frozenset()
    swapped: bool = False  # built by _swap (for logs and tests)


def _static_key(config: NodeConfig, inventory: Inventory) -> tuple:
    """What every fragment depends on. The node's addresses are left out: they change
    only the static part (nodeport-ips) and, through the primary node IP, the firewall
    chains (`node_key`), so an address event recompiles only what depends on them."""
    return replace(config, node_ips=(), host_addresses=None, node_ips_discovered=False), inventory.service_cidrs


def _uses_node_ip(svc) -> bool:
    return bool(svc.load_balancer_source_ranges)  # the firewall's "node IP in a range" check


def compile_incremental(inventory: Inventory, config: NodeConfig, prev: Compiled | None,
                        previous: Ruleset | None = None) -> Compiled:
    """compile.compile_ruleset(inventory, config, previous=prev.ruleset), re-using
    `prev`'s fragment of every Service whose Service object and slices are unchanged
    (same node config and service CIDRs). Equal to compile_ruleset's result
    (tests/test_watch.py checks). Index ranges (layout "sharded") are kept from `prev`,
    or without `prev` from `previous` (e.g. the last applied ruleset)."""
    static_key = _static_key(config, inventory)
    reuse = prev is not None and prev.static_key == static_key
    contexts = {f: family_context(config, f) for f in FAMILIES}
    node_key = tuple(contexts[f].node_ip for f in FAMILIES)
    same_node = reuse and prev.node_key == node_key
    by_svc = slices_by_service(inventory.endpoint_slices)
    inputs, fragments, n = {}, {}, 0
    for svc in sorted(inventory.services, key=lambda s: (s.namespace, s.name)):
        key = svc.key
        inp = (svc, tuple(by_svc.get(key, ())))
        if reuse and key in prev.inputs and prev.inputs[key] == inp and (same_node or not _uses_node_ip(svc)):
            frag = prev.fragments[key]
        else:
            frag = compile_service(svc, inp[1], config, contexts)
            n += 1
        inputs[key], fragments[key] = inp, frag
    before = prev.allocation if prev is not None else layout.allocation_of(previous)
    static = compile_static(config, inventory)
    swapped = _swap(prev, static, fragments) if reuse else None
    if swapped is not None:
        ruleset, alloc = swapped
        return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc,
                        frozenset(), static, prev.shared, True)
    ruleset, alloc = assemble_placed(compile_static(config, inventory), fragments.values(), before)
    moved = set()
    if reuse:
        for key, frag in fragments.items():
            if prev.fragments.get(key) is frag and any(
                    alloc.get((p.family, p.chain)) != before.get((p.family, p.chain))
                    for ff in frag.families.values() for p in ff.picks):
                moved.add(key)
    return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc, frozenset(moved),
                    static, _shared(fragments.values()))


def _shared(fragments) -> frozenset:
    """Ids of the elements produced by more than one fragment."""
    seen: set[str] = set()
    shared: set[str] = set()
    for frag in fragments:
        for fam, ff in frag.families.items():
            for set_name, key in ff.elements:
                eid = element_id(fam, set_name, key)
                if eid in seen:
                    shared.add(eid)
                seen.add(eid)
    return frozenset(shared)


def _swap(prev: Compiled, static: Ruleset, fragments: dict) -> tuple[Ruleset, dict] | None:
    """assemble_placed(static, fragments, prev.allocation) computed from prev's ruleset:
    the changed Services' objects taken out and put back, index ranges kept as
    layout.allocate keeps them. None when that is not certainly equal (module doc);
    the caller then assembles the whole ruleset. tests/test_watch.py checks equality."""
    if prev.static is None or prev.static != static:
        return None
    old_frags = prev.fragments
    changed = sorted(k for k in set(old_frags) | set(fragments) if old_frags.get(k) is not fragments.get(k))
    if not changed:
        return prev.ruleset, prev.allocation
    rs = Ruleset(owners=dict(prev.ruleset.owners))
    for fam, t in prev.ruleset.tables.items():
        rs.tables[fam] = Table(t.family, t.name, t.comment, dict(t.chains), dict(t.sets))
    copied: set[tuple[str, str]] = set()

    def writable(fam: str, name: str):
        """The set, copied before its first change (prev's ruleset stays as it was)."""
        t = rs.tables[fam]
        if (fam, name) not in copied:
            t.sets[name] = replace(t.sets[name], elements=dict(t.sets[name].elements))
            copied.add((fam, name))
        return t.sets[name]

    alloc = dict(prev.allocation)
    owners = rs.owners
    maps: set[tuple[str, str]] = set()
    # out: the old fragments
    for key in changed:
        frag = old_frags.get(key)
        if frag is None:
            continue
        for fam, ff in frag.families.items():
            t = rs.tables.get(fam)
            if t is None:
                return None
            for name in ff.sets:
                t.sets.pop(name, None)
                owners.pop(set_id(fam, name), None)
            for name in ff.chains:
                t.chains.pop(name, None)
                owners.pop(chain_id(fam, name), None)
            for set_name, k in ff.elements:
                eid = element_id(fam, set_name, k)
                if eid in prev.shared or owners.get(eid) != key:
                    return None  # shared: the next Service in key order owns it; assemble decides
                del writable(fam, set_name).elements[k]
                del owners[eid]
            for p in ff.picks:
                r = alloc.pop((fam, p.chain), None)
                if r is None:
                    return None
                m, off, count = r
                elems = writable(fam, m).elements
                for i in range(off, off + count):
                    idx = str(i)
                    if elems.pop((idx,), None) is None:
                        return None
                    owners.pop(element_id(fam, m, (idx,)), None)
                maps.add((fam, m))
    # in: the new fragments (as add_fragment does), collecting their picks
    picks = []
    for key in changed:
        frag = fragments.get(key)
        if frag is None:
            continue
        for fam, ff in frag.families.items():
            t = rs.tables.get(fam)
            if t is None:
                return None
            for name, st in ff.sets.items():
                if name in t.sets:
                    return None
                t.sets[name] = st
                owners[set_id(fam, name)] = key
            for name, c in ff.chains.items():
                if name in t.chains:
                    return None
                t.chains[name] = c
                owners[chain_id(fam, name)] = key
            for (set_name, k), e in ff.elements.items():
                if set_name not in t.sets or k in t.sets[set_name].elements:
                    return None  # now shared (or a missing set): assemble decides
                writable(fam, set_name).add(e)
                owners[element_id(fam, set_name, k)] = key
            for p in ff.picks:
                if p.map not in t.sets:
                    return None  # a new map: place() orders it before the Services' own sets
                picks.append((p, key))
    # index ranges: layout.allocate's rules for the changed picks; the others keep theirs
    rest: dict[tuple[str, str], list] = {}
    offsets: dict[tuple[str, str], int] = {}
    for p, key in picks:
        before = prev.allocation.get((p.family, p.chain))
        if before is not None and before[0] == p.map and len(p.values) <= layout.capacity(before[2]):
            offsets[(p.family, p.chain)] = before[1]
            alloc[(p.family, p.chain)] = (p.map, before[1], len(p.values))
        else:
            rest.setdefault((p.family, p.map), []).append(p)
    for (fam, m), group in rest.items():
        hwm = max((off + layout.capacity(count) for (f, _c), (mm, off, count) in alloc.items()
                   if f == fam and mm == m), default=0)
        group.sort(key=lambda p: p.chain)
        if hwm + sum(layout.capacity(len(p.values)) for p in group) > layout.COMPACT_AT:
            return None  # compaction moves every range of the map
        for p in group:
            offsets[(p.family, p.chain)] = hwm
            alloc[(p.family, p.chain)] = (p.map, hwm, len(p.values))
            hwm += layout.capacity(len(p.values))
    for p, key in picks:
        k = offsets[(p.family, p.chain)]
        t = rs.tables[p.family]
        if k:
            c = t.chains[p.chain]
            t.chains[p.chain] = Chain(c.name, c.rules[:-1] + (layout.pick_rule(p, k),), c.base, c.comment)
        elems = writable(p.family, p.map).elements
        for i, v in enumerate(p.values):
            idx = str(k + i)
            if (idx,) in elems:
                return None  # cannot happen with disjoint ranges; never guess
            elems[(idx,)] = Element((idx,), v)
            owners[element_id(p.family, p.map, (idx,))] = key
        maps.add((p.family, p.map))
    if any(not rs.tables[fam].sets[m].elements for fam, m in maps):
        return None  # a map no pick uses any more: place() would not create it
    for key in changed:
        if key in fragments:
            check_fragment_references(rs, fragments[key])
    return rs, alloc


def changed_services(old: Compiled, new: Compiled) -> set[str] | None:
    """Service keys whose objects may differ; None when everything may (static part changed)."""
    if old.static_key != new.static_key:
        return None
    keys = set(old.fragments) | set(new.fragments)
    return {k for k in keys if old.fragments.get(k) is not new.fragments.get(k)} | set(new.moved)


def project(rs: Ruleset, static: Ruleset, fragments: list) -> Ruleset:
    """`rs` restricted to the static skeleton's objects and the objects of `fragments`
    (chains, affinity sets, and only those elements of shared sets). Diffing two
    projections made with the same static part and the old + new fragments of every
    changed Service gives the same changes as diffing the whole rulesets: every object
    left out belongs to an unchanged Service in both."""
    out = Ruleset()
    for fam, t in rs.tables.items():
        st = static.tables.get(fam)
        chains = list(st.chains) if st else []
        # A set the static part fills (nodeport-ips: the node's addresses) is kept whole:
        # its old elements must be seen to be deleted, and no Service adds to it.
        whole_sets: set[str] = {n for n in st.sets if n in STATIC_FILLED} if st else set()
        keys: dict[str, set] = {n: set() for n in st.sets} if st else {}
        for frag in fragments:
            ff = frag.families.get(fam)
            if ff is None:
                continue
            chains.extend(ff.chains)
            whole_sets.update(ff.sets)
            for set_name, key in ff.elements:
                keys.setdefault(set_name, set()).add(key)
            # layout "sharded": the map is fixed by the chain name; the keys are the
            # range the chain has in *this* ruleset
            for p in ff.picks:
                want = keys.setdefault(p.map, set())
                c = t.chains.get(p.chain)
                r = layout.chain_range(c) if c is not None else None
                if r is not None:
                    want.update((str(i),) for i in range(r[1], r[1] + r[2]))
        table = Table(t.family, t.name, t.comment)
        for name in chains:
            c = t.chains.get(name)
            if c is not None:
                table.chains[name] = c
                o = rs.owners.get(chain_id(fam, name))
                if o:
                    out.owners[chain_id(fam, name)] = o
        for name, s in t.sets.items():
            if name in whole_sets:
                table.sets[name] = s
            elif name in keys:
                want = keys[name]
                table.sets[name] = replace(s, elements={k: e for k, e in s.elements.items() if k in want}
                                           if len(want) * 4 > len(s.elements) else
                                           {k: s.elements[k] for k in want if k in s.elements})
                for k in table.sets[name].elements:
                    o = rs.owners.get(element_id(fam, name, k))
                    if o:
                        out.owners[element_id(fam, name, k)] = o
            else:
                continue
            o = rs.owners.get(set_id(fam, name))
            if o:
                out.owners[set_id(fam, name)] = o
        out.tables[fam] = table
    return out
