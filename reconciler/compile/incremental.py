"""The watch step: compiling again after a change, only the Services that changed.

A Service is compiled again only when its object or its slices changed, with the same
node config and service CIDRs; the ruleset is then the previous one with the changed
Services' fragments patched in (`assemble.patch`), or assembled whole where a patch is
not certainly equal (the static part changed, an element shared by two Services)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from operator import attrgetter

from reconciler.compile import layout
from reconciler.compile.assemble import assemble, patch
from reconciler.compile.ruleset import Ruleset, Table
from reconciler.compile.services import compile_service, slices_by_service
from reconciler.compile.skeleton import FAMILIES, compile_static, family_context
from reconciler.intake import Inventory, NodeConfig


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
    # every EndpointSlice by Service key (orphans too), for the next step's _recompile_changed;
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
    ruleset, alloc, shared = assemble(compile_static(config, inventory), fragments.values(), before)
    moved = set()
    if reuse:
        for key, frag in fragments.items():
            if prev.fragments.get(key) is frag and any(
                    alloc.get((p.family, p.chain)) != before.get((p.family, p.chain))
                    for ff in frag.families.values() for p in ff.picks):
                moved.add(key)
    return Compiled(inventory, config, ruleset, static_key, node_key, inputs, fragments, n, alloc, frozenset(moved),
                    static, shared, False, by_svc, base, changed, contexts)


def _recompile_changed(inventory: Inventory, config: NodeConfig, prev: Compiled, contexts: dict
                       ) -> tuple[dict, dict, int, dict, set]:
    """compile_incremental's loop for an unchanged static part and node: (inputs,
    fragments, Services compiled, slices by key, keys looked at) from prev's, touching
    only the Services whose objects are not the very ones prev was compiled from (the
    intake hands back the same object for an unchanged document): a pass over object ids,
    not a comparison per Service. An equal new object is compared and its fragment kept."""
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


def _swap(prev: Compiled, static: Ruleset, fragments: dict, changed: frozenset | None
          ) -> tuple[Ruleset, dict] | None:
    """assemble(static, fragments, prev.allocation) computed from prev's ruleset by
    `assemble.patch` (a copy of its tables; prev's ruleset stays as it was), or None
    where that is not certainly equal. `changed`: the Services whose fragment is not
    prev's (None: found here)."""
    if prev.static is None or prev.static != static:
        return None
    old = prev.fragments
    if changed is None:
        changed = frozenset(k for k in set(old) | set(fragments) if old.get(k) is not fragments.get(k))
    if not changed:
        return prev.ruleset, prev.allocation
    rs = Ruleset(owners=prev.ruleset.owners.copy())
    for fam, t in prev.ruleset.tables.items():
        rs.tables[fam] = Table(t.family, t.name, t.comment, t.chains.copy(), t.sets.copy())
    keys = sorted(changed)
    alloc = patch(rs, prev.allocation, [old[k] for k in keys if k in old],
                  [fragments[k] for k in keys if k in fragments], prev.shared)
    return (rs, alloc) if alloc is not None else None


def changed_services(old: Compiled, new: Compiled) -> set[str] | None:
    """Service keys whose objects may differ; None when everything may (static part changed)."""
    if old.static_key != new.static_key:
        return None
    if new.changed is not None and new.base is not None and new.base() is old:
        return set(new.changed) | set(new.moved)  # the step from `old` (compile_incremental)
    keys = set(old.fragments) | set(new.fragments)
    return {k for k in keys if old.fragments.get(k) is not new.fragments.get(k)} | set(new.moved)

