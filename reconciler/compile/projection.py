"""Cutting two rulesets down to what a change can touch: the static skeleton and the
objects of the changed Services (`project`), so that diffing the two costs what the
change costs, not what the tables cost."""

from __future__ import annotations

from reconciler.compile import layout
from reconciler.compile.ruleset import Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.skeleton import NODEPORT_IPS

# sets whose elements only the static part writes (the node's addresses)
STATIC_FILLED = frozenset({NODEPORT_IPS})


def _index_order(key: tuple[str, ...]) -> tuple:
    """Element keys in a stable order, a map's numeric indexes by value."""
    return tuple((0, int(k), "") if k.isdigit() else (1, 0, k) for k in key)


def project(rs: Ruleset, static: Ruleset, fragments: list, *, static_chains: bool = True) -> Ruleset:
    """`rs` restricted to the skeleton's objects and those of `fragments` (the old and new
    fragments of every changed Service): diffing two such projections gives the changes of
    diffing the whole rulesets, since every object left out is equal on both sides. Shared
    sets kept whole name the keys the fragments own in `focus` (the diff compares those).
    `static_chains=False`: the skeleton's chains left out too (equal skeletons)."""
    out = Ruleset()
    cut: set[tuple[str, str]] = set()
    for fam, t in rs.tables.items():
        st = static.tables.get(fam)
        # The sharded hairpin skeleton (compile/layout.py) depends on the family and the
        # layout only, so it is equal on both sides of any projection: its chains, its
        # vmap and the shards no changed Service has elements in are left out (otherwise
        # ~130 chains and ~130 sets per table copied, canonicalised and compared per
        # watch sync).
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
            # (equal on both sides).
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

