"""Compiling again after a change: only the Services that changed.

A Service is recompiled (`services.compile_service`) only when it or its slices changed,
with the same node config and service CIDRs; then `services.assemble` builds the ruleset.
`project` cuts two rulesets down to the objects of the changed Services plus the shared
skeleton, so a diff between them costs what the change costs, not what the table costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from reconciler.compile import layout
from reconciler.compile.ruleset import Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.services import FAMILIES, NODEPORT_IPS, assemble_placed, compile_service, compile_static, \
    family_context, slices_by_service
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
    ruleset, alloc = assemble_placed(compile_static(config, inventory), fragments.values(), before)
    moved = set()
    if reuse:
        for key, frag in fragments.items():
            if prev.fragments.get(key) is frag and any(
                    alloc.get((p.family, p.chain)) != before.get((p.family, p.chain))
                    for ff in frag.families.values() for p in ff.picks):
                moved.add(key)
    return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc, frozenset(moved))


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
    out = Ruleset(partial=True)
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
