"""Compiling again after a change: only the Services that changed.

A Service is recompiled (`services.compile_service`) only when it or its slices changed,
with the same node config and service CIDRs; then `services.assemble` builds the ruleset.
`project` cuts two rulesets down to the objects of the changed Services plus the shared
skeleton, so a diff between them costs what the change costs, not what the table costs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace

from reconciler.compile import layout
from reconciler.compile.ruleset import Chain, Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.services import FAMILIES, NODEPORT_IPS, FamilyFragment, ServiceFragment, assemble_placed, \
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


# --- one-shot runs: reuse from the last applied ruleset -------------------------------------
#
# `nftrec plan`/`apply` start from nothing. What the last apply left is its ruleset (the
# state's newest history entry, trusted while the kernel's generation token is unchanged)
# and a memo (`compile_memo`, the state's compiled.json): a digest of what each Service
# was compiled from. A Service whose digest is unchanged gets its objects back from that
# ruleset (`fragments_of`) instead of being compiled again; the diff then looks only at
# the changed Services' objects and the skeleton (`project`).

MEMO_VERSION = 1


def _plain(obj) -> tuple:
    """A model object's compared fields (its `source`, a file position, is left out: a
    Service moved within its file compiles to the same objects)."""
    return tuple(getattr(obj, f.name) for f in fields(obj) if f.compare)


def service_input_digest(svc, slices) -> str:
    """What a Service's fragment is compiled from, besides the node config: the Service and
    its EndpointSlices (in order). repr of frozen dataclasses of strings, ints, tuples and
    None: deterministic across processes (no sets or dicts in the model)."""
    text = repr((_plain(svc), tuple(_plain(s) for s in slices)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def memo_key(config_digest: str, inventory: Inventory) -> str:
    """What every fragment depends on: the effective node config, --strict and the code
    (`intake.config_digest`), and the service CIDRs."""
    cidrs = tuple(_plain(c) for c in inventory.service_cidrs)
    return hashlib.sha256(f"{MEMO_VERSION}|{config_digest}|{cidrs!r}".encode()).hexdigest()


def fragments_of(rs: Ruleset) -> dict[str, ServiceFragment]:
    """Every Service's fragment as it was before `assemble` placed it, read back from an
    assembled ruleset by owner: its chains (a pick chain's last rule back at offset 0, its
    values from the map's range), its own sets and its elements of the static sets.
    Exact only for a ruleset whose elements each came from one Service (`_exact`)."""
    out: dict[str, ServiceFragment] = {}

    def ff_of(owner: str, fam: str) -> FamilyFragment:
        frag = out.get(owner)
        if frag is None:
            frag = out[owner] = ServiceFragment(owner)
        ff = frag.families.get(fam)
        if ff is None:
            ff = frag.families[fam] = FamilyFragment()
        return ff

    owners = rs.owners
    for fam, t in rs.tables.items():
        for name, c in t.chains.items():
            o = owners.get(chain_id(fam, name))
            if o is None:
                continue
            ff = ff_of(o, fam)
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
        for name, s in t.sets.items():
            o = owners.get(set_id(fam, name))
            if o is not None:
                ff_of(o, fam).sets[name] = s
            elif not layout.is_layout_map(name):
                prefix = f"{fam} element {name} "
                for key, e in s.elements.items():
                    o = owners.get(prefix + " . ".join(key))
                    if o is not None:
                        ff_of(o, fam).elements[(name, key)] = e
    return out


def _exact(rs: Ruleset, fragments) -> bool:
    """Whether every element the fragments hold has its own owner entry in `rs`, i.e. no
    two Services produced the same element (add_fragment keeps the first): only then does
    `fragments_of` give each Service back exactly its fragment."""
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
    old_fragments: list = field(default_factory=list)  # of the changed Services, in `applied`
    new_fragments: list = field(default_factory=list)  # of the changed Services, now
    recompiled: int = 0


def compile_oneshot(inventory: Inventory, config: NodeConfig, config_digest: str | None,
                    applied: Ruleset | None = None, memo: dict | None = None) -> OneShot:
    """compile.compile_ruleset(inventory, config, previous=applied), re-using `applied`'s
    objects of every Service whose input digest equals the one in `memo` (written with
    `applied`: the caller checks that they belong together). Equal to compile_ruleset's
    result (tests/test_oneshot_incremental.py checks with random edits)."""
    key = memo_key(config_digest or "", inventory)
    by_svc = slices_by_service(inventory.endpoint_slices)
    services = sorted(inventory.services, key=lambda s: (s.namespace, s.name))
    digests = {svc.key: service_input_digest(svc, by_svc.get(svc.key, ())) for svc in services}
    old = None
    if applied is not None and memo is not None and memo.get("key") == key and memo.get("exact") is True \
            and isinstance(memo.get("services"), dict) and config_digest:
        old = memo["services"]
    extracted: dict[str, ServiceFragment] = {}
    if old is not None:
        try:
            extracted = fragments_of(applied)
        except (KeyError, ValueError):  # a range without its elements: not what we wrote
            old = None
    contexts = {f: family_context(config, f) for f in FAMILIES}
    fragments: dict[str, ServiceFragment] = {}
    n = 0
    for svc in services:
        k = svc.key
        frag = extracted.get(k) if old is not None and old.get(k) == digests[k] else None
        if frag is None:
            frag = compile_service(svc, by_svc.get(k, ()), config, contexts)
            n += 1
        fragments[k] = frag
    before = layout.allocation_of(applied)
    ruleset, alloc = assemble_placed(compile_static(config, inventory), fragments.values(), before)
    memo_out = {"version": MEMO_VERSION, "key": key, "exact": _exact(ruleset, fragments.values()),
                "services": digests}
    out = OneShot(ruleset, compile_static(config, inventory), memo_out, recompiled=n)
    if old is None:
        return out
    changed = {k for k in digests if old.get(k) != digests[k] or k not in extracted} | (set(old) - set(digests))
    for k, frag in fragments.items():  # ranges moved anyway (a shard compacted)
        if k not in changed and any(alloc.get((p.family, p.chain)) != before.get((p.family, p.chain))
                                    for ff in frag.families.values() for p in ff.picks):
            changed.add(k)
    changed |= set(extracted) - set(digests)  # objects of Services the memo does not name
    out.changed = changed
    out.old_fragments = [extracted[k] for k in sorted(changed) if k in extracted]
    out.new_fragments = [fragments[k] for k in sorted(changed) if k in fragments]
    return out
