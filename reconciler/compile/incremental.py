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

import hashlib
import weakref
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter

from reconciler.compile import layout
from reconciler.compile.ruleset import Chain, Element, NamedSet, Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.services import FAMILIES, NODEPORT_IPS, FamilyFragment, ServiceFragment, assemble_placed, \
    check_fragment_references, compile_service, compile_static, family_context, slices_by_service
from reconciler.intake import Inventory, NodeConfig

# sets whose elements only the static part writes (the node's addresses)
STATIC_FILLED = frozenset({NODEPORT_IPS})


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
    # every EndpointSlice by Service key (orphans too), for the next step's _changed_inputs;
    # and the Services whose fragment differs from `base`'s (the Compiled this one was
    # made from, weakly held), which changed_services answers without a pass over all
    slices: dict | None = field(default=None, repr=False, compare=False)
    base: weakref.ref | None = field(default=None, repr=False, compare=False)
    changed: frozenset | None = field(default=None, repr=False, compare=False)
    contexts: dict | None = field(default=None, repr=False, compare=False)  # family_context per family


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
    # a function of the config alone
    contexts = prev.contexts if prev is not None and prev.contexts is not None and prev.config == config else \
        {f: family_context(config, f) for f in FAMILIES}
    node_key = tuple(contexts[f].node_ip for f in FAMILIES)
    same_node = reuse and prev.node_key == node_key
    touched = None  # the keys that may have changed (None: any)
    if same_node and prev.slices is not None:
        # the common step (`watch`): only the Services whose objects are not prev's
        inputs, fragments, n, by_svc, touched = _recompile_changed(inventory, config, prev, contexts)
    else:
        by_svc = {k: tuple(v) for k, v in slices_by_service(inventory.endpoint_slices).items()}
        inputs, fragments, n = {}, {}, 0
        for svc in sorted(inventory.services, key=lambda s: (s.namespace, s.name)):
            key = svc.key
            inp = (svc, by_svc.get(key, ()))
            if reuse and key in prev.inputs and prev.inputs[key] == inp and (same_node or not _uses_node_ip(svc)):
                frag = prev.fragments[key]
            else:
                frag = compile_service(svc, inp[1], config, contexts)
                n += 1
            inputs[key], fragments[key] = inp, frag
    changed = None
    if reuse:
        old_frags = prev.fragments
        keys = touched if touched is not None else set(old_frags) | set(fragments)
        changed = frozenset(k for k in keys if old_frags.get(k) is not fragments.get(k))
    base = weakref.ref(prev) if prev is not None else None
    before = prev.allocation if prev is not None else layout.allocation_of(previous)
    # compile_static reads only the config and the ServiceCIDRs: unchanged, prev's skeleton
    # is this one (the same object: the daemon's projections then leave its chains out)
    static = prev.static if prev is not None and prev.static is not None and prev.config == config and \
        prev.inventory.service_cidrs == inventory.service_cidrs else compile_static(config, inventory)
    swapped = _swap(prev, static, fragments, changed) if reuse else None
    if swapped is not None:
        ruleset, alloc = swapped
        return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc,
                        frozenset(), static, prev.shared, True, by_svc, base, changed, contexts)
    ruleset, alloc = assemble_placed(compile_static(config, inventory), fragments.values(), before)
    moved = set()
    if reuse:
        for key, frag in fragments.items():
            if prev.fragments.get(key) is frag and any(
                    alloc.get((p.family, p.chain)) != before.get((p.family, p.chain))
                    for ff in frag.families.values() for p in ff.picks):
                moved.add(key)
    return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc, frozenset(moved),
                    static, _shared(fragments.values()), False, by_svc, base, changed, contexts)


def _recompile_changed(inventory: Inventory, config: NodeConfig, prev: Compiled, contexts: dict
                       ) -> tuple[dict, dict, int, dict, set]:
    """compile_incremental's loop for an unchanged static part and node: (inputs,
    fragments, Services compiled, slices by key, keys looked at) from prev's, touching only the Services
    whose Service object or slices are not the very objects prev was compiled from (the
    intake hands back the same model object for an unchanged document): a pass over
    object ids instead of a comparison per Service (~0.5 s at 10,000 Services). An equal
    new object (a file re-read) is compared and its fragment kept."""
    old = prev.inventory
    keys: set[str] = set()
    came_svc: dict[str, object] = {}
    gone_svc: set[str] = set()
    a, b = set(map(id, old.services)), set(map(id, inventory.services))
    if a != b:
        gone, came = a - b, b - a
        gone_svc = {s.key for s in old.services if id(s) in gone}
        came_svc = {s.key: s for s in inventory.services if id(s) in came}
        keys |= gone_svc | set(came_svc)
    by_svc = prev.slices
    a, b = set(map(id, old.endpoint_slices)), set(map(id, inventory.endpoint_slices))
    if a != b:
        gone, came = a - b, b - a
        by_svc = by_svc.copy()
        hit = {s.service_key for s in old.endpoint_slices if id(s) in gone}
        added: dict[str, list] = {}
        for s in inventory.endpoint_slices:
            if id(s) in came:
                added.setdefault(s.service_key, []).append(s)
        for k in hit | set(added):  # the order of a Service's slices does not matter to compile_service
            t = tuple(x for x in by_svc.get(k, ()) if id(x) not in gone) + tuple(added.get(k, ()))
            if t:
                by_svc[k] = t
            else:
                by_svc.pop(k, None)
        keys |= hit | set(added)
    inputs, fragments, n = prev.inputs.copy(), prev.fragments.copy(), 0
    new_keys = False
    for key in sorted(keys):
        svc = came_svc.get(key)
        if svc is None and key not in gone_svc and key in prev.inputs:
            svc = prev.inputs[key][0]  # the same Service object; its slices changed
        if svc is None:  # removed (or slices of no Service)
            inputs.pop(key, None)
            fragments.pop(key, None)
            continue
        inp = (svc, by_svc.get(key, ()))
        old_inp = prev.inputs.get(key)
        new_keys |= old_inp is None
        if old_inp is None or old_inp[0] != svc or set(map(id, old_inp[1])) != set(map(id, inp[1])) \
                and not _same_slices(old_inp[1], inp[1]):
            fragments[key] = compile_service(svc, inp[1], config, contexts)
            n += 1
        inputs[key] = inp
    if new_keys:  # Service-key order, as the full loop builds them
        inputs = {k: inputs[k] for k in sorted(inputs, key=lambda k: (inputs[k][0].namespace, inputs[k][0].name))}
        fragments = {k: fragments[k] for k in inputs}
    return inputs, fragments, n, by_svc, keys


def _same_slices(a: tuple, b: tuple) -> bool:
    """Equal slices in any order (compile_service does not depend on their order): sorted
    by name, which pairs them up (names are unique per namespace; a duplicate at worst
    reads as a change, and the Service is compiled again), not by repr, which formats
    every field of every slice."""
    if len(a) != len(b):
        return False
    key = attrgetter("name")
    return sorted(a, key=key) == sorted(b, key=key)


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


def _swap(prev: Compiled, static: Ruleset, fragments: dict, changed_keys: frozenset | None = None
          ) -> tuple[Ruleset, dict] | None:
    """assemble_placed(static, fragments, prev.allocation) computed from prev's ruleset:
    the changed Services' objects taken out and put back, index ranges kept as
    layout.allocate keeps them. None when that is not certainly equal (module doc);
    the caller then assembles the whole ruleset. tests/test_watch.py checks equality.
    `changed_keys`: the Services whose fragment is not prev's (None: found here)."""
    if prev.static is None or prev.static != static:
        return None
    old_frags = prev.fragments
    changed = sorted(changed_keys if changed_keys is not None else
                     (k for k in set(old_frags) | set(fragments) if old_frags.get(k) is not fragments.get(k)))
    if not changed:
        return prev.ruleset, prev.allocation
    # .copy(), not dict(): CPython clones a dict that had keys deleted (as every _swap
    # does) only through .copy(); dict() inserts each key again (1,000 Services: the
    # owners' 10,000 keys 1.5 ms against 0.16 ms, measured)
    rs = Ruleset(owners=prev.ruleset.owners.copy())
    for fam, t in prev.ruleset.tables.items():
        rs.tables[fam] = Table(t.family, t.name, t.comment, t.chains.copy(), t.sets.copy())
    copied: set[tuple[str, str]] = set()

    def writable(fam: str, name: str):
        """The set, copied before its first change (prev's ruleset stays as it was)."""
        t = rs.tables[fam]
        if (fam, name) not in copied:
            t.sets[name] = t.sets[name].with_elements(dict(t.sets[name].elements))
            copied.add((fam, name))
        return t.sets[name]

    alloc = prev.allocation.copy()
    owners = rs.owners
    maps: set[tuple[str, str]] = set()
    hairpin: set[tuple[str, str]] = set()  # hairpin shards that gain or lose elements
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
                if layout.is_hairpin_shard(set_name):
                    hairpin.add((fam, set_name))
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
                if layout.is_hairpin_shard(set_name):
                    if set_name not in t.sets:  # the shard's first element: created below
                        t.sets[set_name] = layout.empty_hairpin_shard(t, set_name)
                        copied.add((fam, set_name))
                    hairpin.add((fam, set_name))
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
    for fam in {fam for fam, _ in hairpin}:  # as assemble's prune_hairpin leaves them
        layout.settle_hairpin_shards(rs.tables[fam], sorted(n for f, n in hairpin if f == fam))
    for key in changed:
        if key in fragments:
            check_fragment_references(rs, fragments[key])
    return rs, alloc


def changed_services(old: Compiled, new: Compiled) -> set[str] | None:
    """Service keys whose objects may differ; None when everything may (static part changed)."""
    if old.static_key != new.static_key:
        return None
    if new.changed is not None and new.base is not None and new.base() is old:
        return set(new.changed) | set(new.moved)  # the step from `old` (compile_incremental)
    keys = set(old.fragments) | set(new.fragments)
    return {k for k in keys if old.fragments.get(k) is not new.fragments.get(k)} | set(new.moved)


def _index_order(key: tuple[str, ...]) -> tuple:
    """Element keys in a stable order, a map's numeric indexes by value."""
    return tuple((0, int(k), "") if k.isdigit() else (1, 0, k) for k in key)


def project(rs: Ruleset, static: Ruleset, fragments: list, *, static_chains: bool = True) -> Ruleset:
    """`rs` restricted to the static skeleton's objects and the objects of `fragments`
    (chains, affinity sets, and only those elements of shared sets). Diffing two
    projections made with the same static part and the old + new fragments of every
    changed Service gives the same changes as diffing the whole rulesets: every object
    left out belongs to an unchanged Service in both. The shared sets kept whole for the
    transaction name the keys the fragments own in `focus`: the diff compares only those
    (the rest is equal on both sides), so its cost follows the change, not the sets.
    `static_chains=False`: the skeleton's chains are left out too, for a caller whose two
    rulesets were assembled from equal skeletons (no fragment writes a skeleton chain, so
    they are equal on both sides); its sets stay (the changed chains' rules name them)."""
    out = Ruleset()
    cut: set[tuple[str, str]] = set()
    for fam, t in rs.tables.items():
        st = static.tables.get(fam)
        # The sharded hairpin skeleton (compile/layout.py) depends on the family and the
        # layout only, so it is equal on both sides of any projection: its chains, its
        # vmap and the shards no changed Service has elements in are left out (otherwise
        # ~130 chains and ~130 sets per table copied, canonicalised and compared per
        # watch sync: ~7 ms of a ~30 ms 1k sync).
        skip = layout.is_hairpin_skeleton
        chains = [n for n in st.chains if not skip(n)] if st and static_chains else []
        # A set the static part fills (nodeport-ips: the node's addresses) is kept whole:
        # its old elements must be seen to be deleted, and no Service adds to it.
        whole_sets: set[str] = {n for n in st.sets if n in STATIC_FILLED and not skip(n)} if st else set()
        compared_whole = set(whole_sets)  # the others kept whole: only `keys` compared (Ruleset.focus)
        keys: dict[str, set] = {n: set() for n in st.sets if not skip(n)} if st else {}
        shards: set[str] = set()  # the hairpin shards the fragments have elements in
        for frag in fragments:
            ff = frag.families.get(fam)
            if ff is None:
                continue
            chains.extend(ff.chains)
            whole_sets.update(ff.sets)
            compared_whole.update(ff.sets)
            # A shared set a changed Service has elements in is kept whole too: the
            # transaction then writes it exactly as for the whole rulesets (a set losing
            # elements flushed and re-declared, engine/changes.rewritten_sets, instead of
            # nft 1.0.6's 0.5-1 s `delete element`); the diff compares its other elements
            # (equal on both sides) at a few ms per 10,000.
            for set_name, key in ff.elements:
                whole_sets.add(set_name)
                keys.setdefault(set_name, set()).add(key)  # whose owners the plan names
                if layout.is_hairpin_shard(set_name):
                    shards.add(set_name)
            # layout "sharded": the map and keys are the range the chain has in *this*
            # ruleset (not necessarily the pick's map: a Service that gained ClientIP
            # affinity moves from a dnat map to a vmap under the same chain name)
            for p in ff.picks:
                # The endpoint maps a changed Service picks from are kept whole (the same
                # maps on both sides: old + new picks), so a transaction may flush and
                # re-declare one instead of `delete element` (engine/changes.rewritten_sets):
                # a shard holds ~1/64 of the endpoints.
                whole_sets.add(p.map)
                c = t.chains.get(p.chain)
                r = layout.chain_range(c) if c is not None else None
                if r is not None:
                    keys.setdefault(r[0], set()).update((str(i),) for i in range(r[1], r[1] + r[2]))
        # Only these shards can exist on one side and not the other (a shard exists while
        # its set has an element, layout.settle_hairpin_shards): their chains, and their
        # keys of the dispatch vmap (kept whole: a transaction may rewrite it, <= 64
        # elements).
        for name in sorted(shards):
            chains.append(layout.hairpin_chain_of(name))
            whole_sets.add(layout.HAIRPIN_VMAP)
            keys.setdefault(layout.HAIRPIN_VMAP, set()).add(layout.hairpin_vmap_key(fam, name))
        table = Table(t.family, t.name, t.comment)
        for name in chains:
            c = t.chains.get(name)
            if c is not None:
                table.chains[name] = c
                o = rs.owners.get(chain_id(fam, name))
                if o:
                    out.owners[chain_id(fam, name)] = o
        for name in t.sets:  # names only: a lazily read ruleset decodes just the sets kept
            if name not in whole_sets and name not in keys:
                continue
            s = t.sets[name]
            if name in whole_sets:
                table.sets[name] = s
                if name not in compared_whole:
                    out.focus[(fam, name)] = frozenset(keys.get(name, ()))
                for k in keys.get(name, ()):  # only these can change: the others are equal on both sides
                    o = rs.owners.get(element_id(fam, name, k))
                    if o:
                        out.owners[element_id(fam, name, k)] = o
            elif name in keys:
                want = keys[name]
                # in the set's own order (a plan's element lists must not depend on hashing)
                cut.add((fam, name))
                # (`not want` first: len() of a recorded set read lazily decodes it)
                table.sets[name] = s.with_elements({} if not want else
                                                   {k: e for k, e in s.elements.items() if k in want}
                                                   if len(want) * 4 > len(s.elements) else
                                                   {k: s.elements[k] for k in sorted(want, key=_index_order)
                                                    if k in s.elements})
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
    out.partial = frozenset(cut)
    return out


# --- one-shot runs: reuse from the last applied ruleset -------------------------------------
#
# `nftrec plan`/`apply` start from nothing. What the last apply left is its ruleset (the
# state's newest history entry, trusted while the kernel's generation token is unchanged)
# and a memo (`compile_memo`, the state's compiled.json): a digest of what each Service
# was compiled from. A Service whose digest is unchanged gets its objects back from that
# ruleset (`fragments_of`) instead of being compiled again; the diff then looks only at
# the changed Services' objects and the skeleton (`project`).

MEMO_VERSION = 1


_FIELDS: dict[type, object] = {}


def _plain(obj) -> tuple:
    """A model object's compared fields (its `source`, a file position, is left out: a
    Service moved within its file compiles to the same objects)."""
    get = _FIELDS.get(type(obj))
    if get is None:
        get = _FIELDS[type(obj)] = attrgetter(*[f.name for f in fields(obj) if f.compare])
    return get(obj)


def service_input_digest(svc, slices) -> str:
    """What a Service's fragment is compiled from, besides the node config: the Service and
    its EndpointSlices (in order). repr of frozen dataclasses of strings, ints, tuples and
    None: deterministic across processes (no sets or dicts in the model)."""
    text = repr((_plain(svc), tuple(_plain(s) for s in slices)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def input_tokens(inventory: Inventory, services, by_svc: dict) -> dict[str, str]:
    """Service key -> a digest of the intake's content keys of the Service and its slices
    (`Inventory.origins`), for the Services whose objects all have one. Equal tokens mean
    byte-identical documents under the same code, hence an equal input digest: a Service
    whose token is the memo's takes its digest from there instead of hashing its objects
    again, so only the Services of changed files are digested (at 10,000 Services the
    digests cost ~0.5 s of CPU; the tokens ~20 ms)."""
    origins = inventory.origins
    out: dict[str, str] = {}
    if not origins:
        return out
    for svc in services:
        parts = []
        for o in (svc, *by_svc.get(svc.key, ())):
            e = origins.get(id(o))
            if e is None or e[0] is not o:  # not read by the intake cache, or replaced since
                break
            parts.append(f"{e[1]}/{e[2]}/{e[3]}")
        else:
            out[svc.key] = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    return out


def memo_key(config_digest: str, inventory: Inventory) -> str:
    """What every fragment depends on: the effective node config, --strict and the code
    (`intake.config_digest`), and the service CIDRs."""
    cidrs = tuple(_plain(c) for c in inventory.service_cidrs)
    return hashlib.sha256(f"{MEMO_VERSION}|{config_digest}|{cidrs!r}".encode()).hexdigest()


def fragments_of(rs: Ruleset, keys: set[str] | None = None) -> dict[str, ServiceFragment]:
    """The fragments of the Services `keys` (None: all) as they were before `assemble`
    placed them, read back from an assembled ruleset by owner: their chains (a pick
    chain's last rule back at offset 0, its values from the map's range), their own sets
    and their elements of the static sets. Exact only for a ruleset whose elements each
    came from one Service (`_exact`)."""
    out: dict[str, ServiceFragment] = {}

    def ff_of(owner: str, fam: str) -> FamilyFragment | None:
        if keys is not None and owner not in keys:
            return None
        frag = out.get(owner)
        if frag is None:
            frag = out[owner] = ServiceFragment(owner)
        ff = frag.families.get(fam)
        if ff is None:
            ff = frag.families[fam] = FamilyFragment()
        return ff

    owners = rs.owners
    # the static sets holding elements of the Services asked for (element ids name their
    # set): only those are read, and only the Services' own chains and sets (by name:
    # a lazily read ruleset, engine/recorded.py, decodes nothing else)
    holding = None
    if keys is not None:
        holding = {}  # (family, set) -> the element ids of the Services asked for
        for oid, o in owners.items():
            if o in keys and oid.split(" ", 2)[1] == "element":
                fam, _, name, _ = oid.split(" ", 3)
                holding.setdefault((fam, name), []).append(oid)
    for fam, t in rs.tables.items():
        for name in t.chains:
            o = owners.get(chain_id(fam, name))
            ff = ff_of(o, fam) if o is not None else None
            if ff is None:
                continue
            c = t.chains[name]
            r = layout.chain_range(c) if "/" in name else None
            if r is not None:
                m, k, n = r
                elems = t.sets[m].elements
                body = c.rules[-1].body
                p = layout.Pick(fam, name, m, body[: body.index("numgen random mod ")],
                                tuple(elems[(str(k + i),)].value for i in range(n)))
                ff.picks.append(p)
                if k:
                    c = Chain(c.name, c.rules[:-1] + (layout.pick_rule(p, 0),), c.base, c.comment)
            ff.chains[name] = c
        for name in t.sets:
            o = owners.get(set_id(fam, name))
            if o is not None:
                ff = ff_of(o, fam)
                if ff is not None:
                    ff.sets[name] = t.sets[name]
            elif not layout.is_layout_map(name) and (holding is None or (fam, name) in holding):
                elements = t.sets[name].elements
                prefix = f"{fam} element {name} "
                found = _owned(elements, prefix, holding[(fam, name)]) if holding is not None else None
                for key, e in found if found is not None else elements.items():
                    o = owners.get(prefix + " . ".join(key))
                    ff = ff_of(o, fam) if o is not None else None
                    if ff is not None:
                        ff.elements[(name, key)] = e
    return out


def _owned(elements, prefix: str, oids: list) -> list | None:
    """(key, element) of the element ids `oids` of one set, looked up by key (a recorded
    set read lazily decodes just those, engine/recorded.py), in the set's key order as
    iterating it gives; None when an id does not lead back to one of its elements (the
    caller then reads them all)."""
    out = []
    for oid in oids:
        key = tuple(oid[len(prefix):].split(" . "))
        e = elements.get(key)
        if e is None or prefix + " . ".join(key) != oid:
            return None
        out.append((key, e))
    return sorted(out, key=lambda ke: ke[0])


def _exact(rs: Ruleset, fragments) -> bool:
    """Whether every element the fragments hold has its own owner entry in `rs`, i.e. no
    two Services produced the same element (add_fragment keeps the first one's): only
    then does `fragments_of` give each Service back exactly its fragment."""
    held = sum(len(ff.elements) + sum(len(p.values) for p in ff.picks)
               for frag in fragments for ff in frag.families.values())
    return held == sum(1 for oid in rs.owners if " element " in oid)


@dataclass
class OneShot:
    """A one-shot compile: the whole desired ruleset, and what changed since `applied`."""

    ruleset: Ruleset
    static: Ruleset  # the skeleton (for `project`)
    memo: dict  # for the state's compiled.json
    # Service keys whose objects may differ from `applied`'s; None: compare everything
    changed: set[str] | None = None
    # with `changed`: `applied` and `ruleset` cut down to the skeleton and the changed
    # Services' objects (compile.project): diffing them is diffing the whole rulesets
    applied_part: Ruleset | None = None
    desired_part: Ruleset | None = None
    recompiled: int = 0


def compile_oneshot(inventory: Inventory, config: NodeConfig, config_digest: str | None,
                    applied: Ruleset | None = None, memo: dict | None = None) -> OneShot:
    """compile.compile_ruleset(inventory, config, previous=applied), compiling only the
    Services whose input digest differs from `memo`'s (written with `applied`: the caller
    checks that they belong together) and patching their objects into `applied`, which
    is consumed (it becomes the result). Equal to compile_ruleset's result
    (tests/test_oneshot.py checks with random edits). Without a usable memo, or when the
    patch cannot be exact (an element two Services produce, a shard to compact),
    everything is compiled and `changed` is None."""
    key = memo_key(config_digest or "", inventory)
    by_svc = slices_by_service(inventory.endpoint_slices)
    services = sorted(inventory.services, key=lambda s: (s.namespace, s.name))
    old = None
    if applied is not None and memo is not None and config_digest and memo.get("key") == key \
            and memo.get("exact") is True and isinstance(memo.get("services"), dict):
        old = memo["services"]
    tokens = input_tokens(inventory, services, by_svc)
    # a digest from the memo only where the token is the one it was written with
    same = memo.get("tokens") if old is not None else None
    if not isinstance(same, dict):
        same = {}
    digests = {}
    for svc in services:
        k = svc.key
        t = tokens.get(k)
        d = old.get(k) if t is not None and same.get(k) == t else None
        digests[k] = d if type(d) is str else service_input_digest(svc, by_svc.get(k, ()))
    memo_out = {"version": MEMO_VERSION, "key": key, "exact": False, "services": digests, "tokens": tokens}
    contexts = {f: family_context(config, f) for f in FAMILIES}
    # the memo's copy of `applied`'s index ranges spares reading every chain of it
    before = _memo_allocation(memo) if old is not None else None
    if before is None:
        before = layout.allocation_of(applied)
    if old is not None:
        changed = {k for k, d in digests.items() if old.get(k) != d} | (set(old) - set(digests))
        by_key = {svc.key: svc for svc in services}
        new_frags = [compile_service(by_key[k], by_svc.get(k, ()), config, contexts)
                     for k in sorted(changed) if k in by_key]
        try:
            old_frags = list(fragments_of(applied, changed).values())
        except (KeyError, ValueError):  # a range without its elements: not what we wrote
            old_frags = None
        static = compile_static(config, inventory)
        if old_frags is not None and _patch_fits(applied, changed, new_frags):
            offsets = _offsets(applied, before, old_frags, new_frags)
            if offsets is not None:
                frags = old_frags + new_frags
                applied_part = project(applied, static, frags)  # before `applied` becomes the result
                ruleset = _patch(applied, old_frags, new_frags, offsets)
                memo_out["exact"] = True  # _patch_fits: no element shared, and `applied` was exact
                gone = {(fam, c) for f in old_frags for fam, ff in f.families.items() for c in ff.chains}
                alloc = {k: v for k, v in before.items() if k not in gone}
                alloc.update(((p.family, p.chain), (p.map, offsets[(p.family, p.chain)], len(p.values)))
                             for f in new_frags for ff in f.families.values() for p in ff.picks)
                memo_out["allocation"] = _allocation_json(alloc)
                return OneShot(ruleset, static, memo_out, changed, applied_part, project(ruleset, static, frags),
                               recompiled=len(new_frags))
    fragments = [compile_service(svc, by_svc.get(svc.key, ()), config, contexts) for svc in services]
    ruleset, alloc = assemble_placed(compile_static(config, inventory), fragments, before)
    memo_out["exact"] = _exact(ruleset, fragments)
    memo_out["allocation"] = _allocation_json(alloc)
    return OneShot(ruleset, compile_static(config, inventory), memo_out, recompiled=len(fragments))


def _allocation_json(alloc: dict) -> list:
    """The memo's form of an allocation: [family, chain, map, offset, N], sorted."""
    return sorted([fam, chain, m, k, n] for (fam, chain), (m, k, n) in alloc.items())


def _memo_allocation(memo: dict) -> dict | None:
    """The memo's allocation back as layout.allocation_of gives it; None when absent
    (a memo of an older nftrec) or malformed: the caller reads the ruleset's chains."""
    rows = memo.get("allocation")
    if not isinstance(rows, list):
        return None
    out = {}
    for row in rows:  # ~19,000 at 10,000 Services: plain type checks, no generator per row
        if type(row) is not list or len(row) != 5:
            return None
        fam, chain, m, k, n = row
        if not (type(fam) is str and type(chain) is str and type(m) is str and type(k) is int and type(n) is int):
            return None
        out[(fam, chain)] = (m, k, n)
    return out


def _patch_fits(rs: Ruleset, changed: set[str], new_frags: list) -> bool:
    """Whether the new fragments add no object that an unchanged Service (or another new
    fragment) already has: then assemble would give each object the same owner."""
    owners = rs.owners
    seen: set[str] = set()
    for frag in new_frags:
        for fam, ff in frag.families.items():
            t = rs.tables.get(fam)
            if t is None:
                return False
            ids = [(set_id(fam, n), n in t.sets) for n in ff.sets]
            ids += [(chain_id(fam, n), n in t.chains) for n in ff.chains]
            for (sn, k) in ff.elements:
                s = t.sets.get(sn)
                if s is None and not layout.is_hairpin_shard(sn):  # a shard is made by _patch
                    return False
                ids.append((element_id(fam, sn, k), s is not None and k in s.elements))
            for oid, exists in ids:
                if oid in seen or (exists and owners.get(oid) not in changed):
                    return False
                seen.add(oid)
    return True


def _offsets(rs: Ruleset, before: dict, old_frags: list, new_frags: list) -> dict | None:
    """layout.allocate(every pick, before) for the new fragments' picks, without the
    unchanged Services' picks: those keep their ranges (the ranges of a placed ruleset
    are disjoint, so each is kept), a new pick keeps its chain's range while it fits, and
    the rest go to the map's high-water mark over the kept ranges, in chain order. None
    when the map would be compacted (then every range moves: compile everything)."""
    picks = sorted((p for f in new_frags for ff in f.families.values() for p in ff.picks),
                   key=lambda p: (p.family, p.map, p.chain))
    if not picks:
        return {}
    gone = {(fam, c) for f in old_frags for fam, ff in f.families.items() for c in ff.chains}
    new_chains = {(p.family, p.chain) for p in picks}
    maps = {(p.family, p.map) for p in picks}
    hwm: dict[tuple[str, str], int] = {}
    for (fam, chain), (m, k, n) in before.items():  # the unchanged Services' ranges
        if (fam, m) in maps and (fam, chain) not in gone and (fam, chain) not in new_chains:
            hwm[(fam, m)] = max(hwm.get((fam, m), 0), k + layout.capacity(n))
    out: dict[tuple[str, str], int] = {}
    rest = []
    for p in picks:
        prev = before.get((p.family, p.chain))
        if prev is not None and prev[0] == p.map and len(p.values) <= layout.capacity(prev[2]):
            out[(p.family, p.chain)] = prev[1]
            hwm[(p.family, p.map)] = max(hwm.get((p.family, p.map), 0), prev[1] + layout.capacity(prev[2]))
        else:
            rest.append(p)
    for p in rest:
        k = hwm.get((p.family, p.map), 0)
        if k + layout.capacity(len(p.values)) > layout.COMPACT_AT:
            return None
        out[(p.family, p.chain)] = k
        hwm[(p.family, p.map)] = k + layout.capacity(len(p.values))
    return out


def _patch(rs: Ruleset, old_frags: list, new_frags: list, offsets: dict) -> Ruleset:
    """`rs` (changed in place) without the old fragments' objects and with the new ones,
    placed at `offsets`: what assemble gives for the same fragments (`_patch_fits` and
    `_offsets` said so). Sets that change are copied first (projections share them)."""
    owners = rs.owners
    copied: set[tuple[str, str]] = set()

    def writable(fam: str, name: str) -> NamedSet:
        t = rs.tables[fam]
        if (fam, name) not in copied:
            s = t.sets.get(name)
            # .copy(): a recorded set read lazily (engine/recorded.py) stays lazy
            if s is not None:
                t.sets[name] = s.with_elements(s.elements.copy())
            elif layout.is_hairpin_shard(name):
                t.sets[name] = layout.empty_hairpin_shard(t, name)
            else:
                t.sets[name] = layout.map_for(fam, name)
            copied.add((fam, name))
        return t.sets[name]

    maps_touched: set[tuple[str, str]] = set()
    filled: set[tuple[str, str]] = set()  # sets whose elements changed (for the hairpin shards)
    for frag in old_frags:
        for fam, ff in frag.families.items():
            t = rs.tables[fam]
            for name in ff.chains:
                c = t.chains.pop(name)
                owners.pop(chain_id(fam, name), None)
                r = layout.chain_range(c) if "/" in name else None
                if r is not None:
                    m, k, n = r
                    elems = writable(fam, m).elements
                    for i in range(k, k + n):
                        elems.pop((str(i),), None)
                        owners.pop(element_id(fam, m, (str(i),)), None)
                    maps_touched.add((fam, m))
            for name in ff.sets:
                t.sets.pop(name, None)
                owners.pop(set_id(fam, name), None)
            for (sn, key) in ff.elements:
                writable(fam, sn).elements.pop(key, None)
                owners.pop(element_id(fam, sn, key), None)
                filled.add((fam, sn))
    for frag in sorted(new_frags, key=lambda f: f.service_key):
        owner = frag.service_key
        for fam, ff in frag.families.items():
            t = rs.tables[fam]
            for name, st in ff.sets.items():
                t.sets[name] = st
                owners[set_id(fam, name)] = owner
            for name, c in ff.chains.items():
                t.chains[name] = c
                owners[chain_id(fam, name)] = owner
            for (sn, key), e in ff.elements.items():
                writable(fam, sn).elements[key] = e
                owners[element_id(fam, sn, key)] = owner
                filled.add((fam, sn))
            for p in ff.picks:
                k = offsets[(p.family, p.chain)]
                if k:
                    c = t.chains[p.chain]
                    t.chains[p.chain] = Chain(c.name, c.rules[:-1] + (layout.pick_rule(p, k),), c.base, c.comment)
                elems = writable(fam, p.map).elements
                for i, v in enumerate(p.values):
                    idx = str(k + i)
                    elems[(idx,)] = Element((idx,), v)
                    owners[element_id(fam, p.map, (idx,))] = owner
                maps_touched.add((fam, p.map))
    for fam, m in maps_touched:  # assemble declares only the maps some pick uses
        if not rs.tables[fam].sets[m].elements:
            del rs.tables[fam].sets[m]
    for fam in {fam for fam, _ in filled}:  # and only the hairpin shards holding an element
        layout.settle_hairpin_shards(rs.tables[fam], sorted(n for f, n in filled
                                                           if f == fam and layout.is_hairpin_shard(n)))
    for frag in new_frags:
        check_fragment_references(rs, frag)
    return rs
