"""compile/layout.py: the sharded endpoint layout (nftrec's default) against kube-proxy's.

* Same rules: for random inventories and node configs, the sharded ruleset with every
  index range written back inline (`numgen random mod N map { 0 : … }`, `vmap { 0 : goto … }`)
  is exactly the `layout: kube-proxy` ruleset: the same endpoints, in the same order, for
  the same chains; nothing else differs.
* Stable ranges: a compile that is given the previous ruleset keeps every unchanged
  Service port's range; new and grown ranges go to the shard's high-water mark.
* relocate (plan/apply) and compile_incremental (watch) agree with compile(previous=…).
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from _nft_samples import CONFIG, add_service, ep, epp, rich_inventory, sl, sp, svc, with_endpoints, with_service
from nsutil import for_this_nft, needs_nft_spelling
from test_kernel_accepts import configs, inventories
from reconciler.compile.layout import (
    AFFINITY_SET, COMPACT_AT, FIREWALL_RULES_MAX, HAIRPIN_SET_PREFIX, HAIRPIN_VMAP, Pick, affinity_key, allocate,
    allocation_of, capacity, chain_range, hairpin_dispatch, hairpin_set, is_layout_map,
    relocate, shard,
)
from reconciler.compile.ruleset import NamedSet, Rule, Ruleset, Table, chain_id, element_id, set_id
from reconciler.compile.services import compile_ruleset
from reconciler.intake.model import LoadBalancerIngress
from reconciler.compile.incremental import changed_services, compile_incremental
from reconciler.engine.changes import diff, transaction_for
from reconciler.kernel.live import canonical, read_live

KP = replace(CONFIG, layout="kube-proxy")
SH = replace(CONFIG, layout="sharded")


def inline(rs: Ruleset) -> Ruleset:
    """The sharded ruleset written the way kube-proxy writes it: each range back into an
    anonymous map in its rule, the shared maps (and their owners) gone; the shared
    affinity set back into one set per endpoint (each id checked against kube-proxy's set
    name); firewall chains' `return` rules back into `ip saddr != { … } drop`; the
    hairpin-connections shards back into the one set and its rule (each element checked to
    be in the shard of its address)."""
    out = Ruleset(owners={k: v for k, v in rs.owners.items()
                          if not any(k.startswith(f"{f} element endpoint-") and is_layout_map(k.split()[2])
                                     for f in ("ip", "ip6"))})
    for k in [k for k in out.owners if k.split()[1:2] == ["element"] and
              k.split()[2].startswith(HAIRPIN_SET_PREFIX)]:
        fam, _, name, key = k.split(" ", 3)
        out.owners[f"{fam} element hairpin-connections {key}"] = out.owners.pop(k)
    for fam, t in rs.tables.items():
        chains = {}
        affinity_sets = {}
        hairpin = NamedSet("hairpin-connections", f"{t.sets[HAIRPIN_VMAP].type} . {t.sets[HAIRPIN_VMAP].type}"
                           " . inet_proto . inet_service", comment="service hairpin connections")
        for name, s in t.sets.items():
            if name.startswith(HAIRPIN_SET_PREFIX):
                for e in s.elements.values():
                    assert hairpin_set(e.key[0]) == name
                    hairpin.add(e)
        for name, c in t.chains.items():
            if name.startswith("hairpin-"):
                continue
            if name == "masquerading":
                assert c.rules[-1].body == hairpin_dispatch(fam)
                c = replace(c, rules=c.rules[:-1] + (Rule(
                    f"ct status dnat {fam} saddr . {fam} daddr . meta l4proto . th dport "
                    "@hairpin-connections masquerade fully-random"),))
            r = chain_range(c)
            if r is not None:
                m, k, n = r
                values = [t.sets[m].elements[(str(k + i),)].value for i in range(n)]
                body = c.rules[-1].body
                head = body[: body.index("numgen random mod ")]
                verb = "vmap" if m.startswith("endpoint-vmap-") else "map"
                inline_map = " , ".join(f"{i} : {v}" for i, v in enumerate(values))
                c = replace(c, rules=c.rules[:-1] + (Rule(f"{head}numgen random mod {n} {verb} {{ {inline_map} }}"),))
            rules = []
            for r in c.rules:
                m = re.fullmatch(rf"(.*) @{AFFINITY_SET} goto (endpoint-(\S+))", r.body)
                if m:  # the policy chain's check
                    aset = "affinity-" + m.group(3)
                    assert m.group(1) == affinity_key(fam, aset)
                    r = Rule(f"{fam} saddr @{aset} goto {m.group(2)}")
                m = re.fullmatch(rf"update @{AFFINITY_SET} {{ (.*) timeout (\d+)s }}", r.body)
                if m:  # the endpoint chain's update
                    aset = "affinity-" + name[len("endpoint-"):]
                    assert m.group(1) == affinity_key(fam, aset)
                    affinity_sets[aset] = NamedSet(aset, "ipv4_addr" if fam == "ip" else "ipv6_addr",
                                                   flags=("dynamic", "timeout"), timeout=int(m.group(2)))
                    out.owners[set_id(fam, aset)] = rs.owners[chain_id(fam, name)]
                    r = Rule(f"update @{aset} {{ {fam} saddr }}")
                rules.append(r)
            if name.startswith("firewall-") and rules[-1].body == "drop" and "!=" not in rules[0].body:
                sources = [re.fullmatch(rf"{fam} saddr (\S+) return", r.body).group(1) for r in rules[:-1]]
                rules = [Rule(f"{fam} saddr != {{ {' , '.join(sources)} }} drop")]
            chains[name] = replace(c, rules=tuple(rules))
        sets = {n: s for n, s in t.sets.items() if not is_layout_map(n) and n != AFFINITY_SET
                and not n.startswith(HAIRPIN_SET_PREFIX) and n != HAIRPIN_VMAP}
        sets["hairpin-connections"] = hairpin
        out.tables[fam] = Table(t.family, t.name, t.comment, chains, {**sets, **affinity_sets})
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(inventories(), configs())
def test_sharded_is_kube_proxys_ruleset_with_the_maps_inlined(inventory, config):
    kp = compile_ruleset(inventory, replace(config, layout="kube-proxy"))
    sharded = compile_ruleset(inventory, replace(config, layout="sharded"))
    assert inline(sharded) == kp
    # no anonymous map in the sharded layout, ranges never overlap within a map
    for fam, t in sharded.tables.items():
        used: dict[str, set[int]] = {}
        for name, c in t.chains.items():
            assert not re.search(r"v?map \{", " ".join(r.body for r in c.rules)), name
            r = chain_range(c)
            if r is not None:
                idx = set(range(r[1], r[1] + r[2]))
                assert not idx & used.setdefault(r[0], set())
                used[r[0]] |= idx
        for m, s in t.sets.items():
            if is_layout_map(m):
                assert {int(k[0]) for k in s.elements} == used[m]  # no stray element, none missing


def test_only_services_with_more_than_one_endpoint_use_maps():
    inv = rich_inventory()
    rs = compile_ruleset(inv, SH)
    one = rs.tables["ip"].chains["service-" + next(n.split("-", 1)[1] for n in rs.tables["ip"].chains
                                                    if n.startswith("service-") and "ns1/one/" in n)]
    assert chain_range(one) is None and one.rules[-1].body.startswith("meta l4proto tcp dnat to 10.180.0.1:")
    kinds = {m.split("-")[2] if m.startswith("endpoint-dnat-") else "vmap" for m in rs.tables["ip"].sets
             if is_layout_map(m)}
    assert kinds == {"tcp", "udp", "sctp", "vmap"}  # one set of shards per protocol; vmaps: ClientIP affinity


def test_rule_and_map_texts():
    inv = rich_inventory()
    rs = compile_ruleset(inv, SH)
    t = rs.tables["ip"]
    bodies = [c.rules[-1].body for n, c in t.chains.items() if chain_range(c)]
    assert all(re.fullmatch(r"(meta l4proto (tcp|udp|sctp) dnat ip addr \. port to )?numgen random mod \d+"
                            r"( offset [1-9]\d*)? (map @endpoint-dnat-(tcp|udp|sctp)|vmap @endpoint-vmap)-[0-9a-f]{2}", b)
               for b in bodies), bodies
    for name, s in t.sets.items():
        if name.startswith("endpoint-dnat-"):
            proto = name.split("-")[2]
            assert (s.typeof, s.type, s.value_type) == (True, "numgen random mod 1", f"ip daddr . {proto} dport")
        elif name.startswith("endpoint-vmap-"):
            assert (s.typeof, s.type, s.value_type) == (True, "numgen random mod 1", "verdict")
            assert all(e.value.startswith("goto endpoint-") for e in s.elements.values())


# --- allocation ----------------------------------------------------------------------------


def P(chain, n, m="endpoint-dnat-tcp-00"):
    return Pick("ip", chain, m, "", tuple(f"10.0.0.{i} . 80" for i in range(n)))


def test_capacity_is_the_next_power_of_two():
    assert [capacity(n) for n in (1, 2, 3, 4, 5, 8, 9, 1000)] == [1, 2, 4, 4, 8, 8, 16, 1024]


def test_allocate_from_scratch_is_a_running_sum_in_chain_order():
    assert allocate([P("c", 2), P("a", 5), P("b", 3)], {}) == {("ip", "a"): 0, ("ip", "b"): 8, ("ip", "c"): 12}


def test_allocate_keeps_ranges_that_still_fit_and_moves_grown_ones_to_the_high_water_mark():
    prev = {("ip", "a"): ("endpoint-dnat-tcp-00", 0, 5), ("ip", "b"): ("endpoint-dnat-tcp-00", 8, 3),
            ("ip", "c"): ("endpoint-dnat-tcp-00", 12, 2)}
    # a shrinks (kept), b grows within 4 (kept), c grows past 2 (moved), "0new" is new: the
    # mark is the end of the kept ranges (12; c's old [12, 14) is free again), then name order
    got = allocate([P("a", 2), P("b", 4), P("c", 3), P("0new", 2)], prev)
    assert got == {("ip", "a"): 0, ("ip", "b"): 8, ("ip", "0new"): 12, ("ip", "c"): 14}
    # a range recorded for another map, or overlapping one kept before it, is re-allocated
    prev2 = {("ip", "a"): ("endpoint-dnat-tcp-01", 0, 2), ("ip", "b"): ("endpoint-dnat-tcp-00", 0, 2),
             ("ip", "c"): ("endpoint-dnat-tcp-00", 1, 2)}
    assert allocate([P("a", 2), P("b", 2), P("c", 2)], prev2) == {("ip", "b"): 0, ("ip", "a"): 2, ("ip", "c"): 4}


def test_allocate_compacts_a_shard_whose_high_water_mark_runs_away():
    prev = {("ip", "a"): ("endpoint-dnat-tcp-00", COMPACT_AT - 2, 2)}
    assert allocate([P("a", 2), P("b", 4)], prev) == {("ip", "a"): 0, ("ip", "b"): 2}


def test_shard_is_two_hex_digits_fixed_by_the_chain_name():
    assert shard("service-ULMVA6XW-ns1/svc1/tcp/p80") == shard("service-ULMVA6XW-ns1/svc1/tcp/p80")
    assert len({shard(f"service-X-ns/s{i}/tcp/p") for i in range(5000)}) == 256


# --- stability across compiles ------------------------------------------------------------


def many(n: int, eps: int = 3):
    """n one-port ClusterIP Services with `eps` endpoints each (several share a shard)."""
    inv = rich_inventory()
    for i in range(n):
        inv = add_service(inv, svc("bulk", f"s{i:03d}", cips=(f"172.30.{1 + i // 250}.{1 + i % 250}",), ports=[sp(80)]),
                          sl("bulk", f"s{i:03d}", [ep(f"10.181.{i // 250}.{(i % 250) * 0 + j + 1}") for j in range(eps)],
                             [epp(8080)]))
    return inv


def ranges(rs: Ruleset) -> dict:
    return allocation_of(rs)


@pytest.fixture
def shards64(monkeypatch):
    """64 shards: the tests of moves need several Services per shard at a few hundred."""
    import reconciler.compile.layout as layout

    monkeypatch.setattr(layout, "SHARDS", 64)


def test_given_the_previous_ruleset_only_the_changed_services_ranges_move(shards64):
    base_inv = many(300)
    base = compile_ruleset(base_inv, SH)
    # one Service grows past its capacity (3 -> 5), one is added that sorts first ("bulk/a…"),
    # one is removed
    edited = with_endpoints(base_inv, "bulk/s100", "IPv4", [ep(f"10.182.0.{j}") for j in range(1, 6)])
    edited = add_service(edited, svc("bulk", "a-first", cips=("172.30.9.9",), ports=[sp(80)]),
                         sl("bulk", "a-first", [ep("10.183.0.1"), ep("10.183.0.2")], [epp(8080)]))
    edited = with_service(edited, "bulk/s200", remove=True)
    kept = compile_ruleset(edited, SH, previous=base)
    before, after = ranges(base), ranges(kept)
    moved = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    grown = {k for k in after if "bulk/s100/" in k[1]}
    assert {k for k in moved if before[k][1] != after[k][1]} == grown
    assert all(after[k][1] >= max(v[1] + capacity(v[2]) for v in before.values() if v[0] == after[k][0])
               for k in grown)  # at the high-water mark of its shard
    # the diff against the old ruleset touches only the three Services (and no other range)
    owners = {c.owner for c in diff(kept, canonical(base))}
    assert owners == {"bulk/s100", "bulk/a-first", "bulk/s200"}
    # ... while a from-scratch compile shifts other Services' ranges (why the allocation is kept)
    scratch = compile_ruleset(edited, SH)
    assert len({c.owner for c in diff(scratch, canonical(base))}) > 3


def test_relocate_equals_compiling_with_the_previous_ruleset_and_is_idempotent(shards64):
    base_inv = many(200)
    base = compile_ruleset(base_inv, SH)
    edited = add_service(base_inv, svc("bulk", "a-first", cips=("172.30.9.9",), ports=[sp(80)]),
                         sl("bulk", "a-first", [ep("10.183.0.1"), ep("10.183.0.2")], [epp(8080)]))
    want = compile_ruleset(edited, SH, previous=base)
    scratch = compile_ruleset(edited, SH)
    assert scratch != want
    got = relocate(scratch, canonical(base))  # the live side is canonical (kernel/live.py)
    assert got == want and relocate(got, base) is got
    assert relocate(base, None) is base  # nothing to keep: no move
    # kube-proxy layout: nothing to relocate
    kp = compile_ruleset(edited, KP)
    assert relocate(kp, base) is kp


def test_incremental_compile_keeps_ranges_and_equals_the_full_compile():
    base_inv = many(120)
    c1 = compile_incremental(base_inv, SH, None)
    assert c1.ruleset == compile_ruleset(base_inv, SH)
    edited = with_endpoints(base_inv, "bulk/s050", "IPv4", [ep(f"10.182.0.{j}") for j in range(1, 6)])
    c2 = compile_incremental(edited, SH, c1)
    assert c2.recompiled == 1 and c2.ruleset == compile_ruleset(edited, SH, previous=c1.ruleset)
    assert changed_services(c1, c2) == {"bulk/s050"}
    # the first compile of a daemon keeps the last applied ruleset's ranges
    c0 = compile_incremental(edited, SH, None, previous=c1.ruleset)
    assert c0.ruleset == c2.ruleset


def test_a_compacted_shard_counts_its_reused_services_as_changed(monkeypatch, shards64):
    import reconciler.compile.layout as layout

    base_inv = many(60)
    c1 = compile_incremental(base_inv, SH, None)
    monkeypatch.setattr(layout, "COMPACT_AT", 0)  # every shard compacts on the next compile
    edited = with_endpoints(base_inv, "bulk/s010", "IPv4", [ep(f"10.182.0.{j}") for j in range(1, 6)])
    c2 = compile_incremental(edited, SH, c1)
    assert c2.recompiled == 1 and len(changed_services(c1, c2)) > 1 and c2.moved


def test_owners_of_map_elements_and_their_plan_line():
    from reconciler.engine.plan import make_plan

    inv = rich_inventory()
    base = compile_ruleset(inv, SH)
    for fam, t in base.tables.items():
        for name, s in t.sets.items():
            if is_layout_map(name):
                assert all(base.owners.get(element_id(fam, name, k)) for k in s.elements)
    # an endpoint removed from a 3-endpoint port: the plan names it like kube-proxy's layout
    edited = with_endpoints(inv, "ns1/multi", "IPv4", [ep("10.180.0.3")])
    plan = make_plan(compile_ruleset(edited, SH, previous=base), canonical(base))
    plan_kp = make_plan(compile_ruleset(edited, KP), canonical(compile_ruleset(inv, KP)))
    assert [(s.service, s.summary) for s in plan.services] == [(s.service, s.summary) for s in plan_kp.services]
    # removed elements (live only: no desired owner) are still the Service's
    live_only = compile_ruleset(with_service(inv, "ns1/multi", remove=True), SH, previous=base)
    assert {c.owner for c in diff(live_only, canonical(base)) if not (c.kind == "set" and is_layout_map(c.name))} \
        == {"ns1/multi"}


def test_node_config_layout_key(tmp_path):
    from reconciler.intake.config import load_node_config

    p = tmp_path / "c.yaml"
    p.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n\nlayout: kube-proxy\n")
    cfg, problems = load_node_config(str(p), discover=False)
    assert cfg.layout == "kube-proxy" and not problems
    p.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n\n")
    assert load_node_config(str(p), discover=False)[0].layout == "sharded"
    p.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n\nlayout: vmap\n")
    _cfg, problems = load_node_config(str(p), discover=False)
    assert [pr.field for pr in problems if pr.severity == "error"] == ["layout"]


# --- removals: the shard is rewritten, no `delete element` ------------------------------



def _sync(nft, desired: Ruleset):
    """As plan/apply do: read the kernel, keep its ranges, diff, commit."""
    live = read_live(nft, CONFIG.table_name)
    desired = relocate(desired, live)
    changes = diff(desired, live)
    tx = transaction_for(changes, desired)
    nft.run(tx)
    return changes, tx


def _sticky(inv, n: int):
    return add_service(inv, svc("bulk", "sticky", cips=("172.30.9.8",), ports=[sp(80)], session_affinity="ClientIP"),
                       sl("bulk", "sticky", [ep(f"10.184.0.{j}") for j in range(1, n + 1)], [epp(8080)]))


def test_removed_and_changed_endpoints_rewrite_their_shard_without_delete_element(backend, shards64):
    """nft 1.0.6 fetches the whole table's chains and sets for a `delete element` (~1 s at
    10,000 Services): a shard losing or changing elements is flushed and re-declared with
    all its elements, in the same transaction. Everything else in the shard (other
    Services' ranges) survives, the plan shows only the real changes, nothing drifts."""
    needs_nft_spelling("index_maps", backend)
    base_inv = _sticky(many(400), 3)
    base = compile_ruleset(base_inv, SH)
    _sync(backend, base)
    edited = with_endpoints(base_inv, "bulk/s010", "IPv4", [ep("10.181.0.1"), ep("10.181.0.2")])  # 3 -> 2
    edited = with_endpoints(edited, "bulk/s020", "IPv4", [ep("10.181.0.1"), ep("10.181.0.9"), ep("10.181.0.3")])
    edited = with_endpoints(edited, "bulk/sticky", "IPv4", [ep("10.184.0.1"), ep("10.184.0.2")])  # affinity, 3 -> 2
    changes, tx = _sync(backend, compile_ruleset(edited, SH))
    # the plan: exactly the removed / changed elements and the rewritten rules, by Service
    # (the removed affinity endpoint's entries are in the shared set, which stays)
    assert {(c.kind, c.action) for c in changes} == {("element", "remove"), ("element", "change"), ("chain", "change"),
                                                     ("chain", "remove")}
    assert {c.owner for c in changes} == {"bulk/s010", "bulk/s020", "bulk/sticky"}
    maps = {c.name for c in changes if c.kind == "element"}
    assert any(m.startswith("endpoint-vmap-") for m in maps) and any(m.startswith("endpoint-dnat-") for m in maps)
    # the transaction: no element deletes; each touched map flushed once, then declared whole
    assert not [op for op in tx if op.startswith("delete element")], tx.ops
    assert sorted(op for op in tx if op.startswith("flush map")) == sorted(f"flush map ip nftrec {m}" for m in maps)
    desired = relocate(compile_ruleset(edited, SH), read_live(backend, CONFIG.table_name))
    for m in maps:
        decl = [op for op in tx if op.startswith(f"add map ip nftrec {m} ") and "elements =" in op]
        n = len(desired.tables["ip"].sets[m].elements)
        assert len(decl) == 1 and decl[0].split("elements = {")[1].count(" : ") == n, decl
        assert n > 3 or m.startswith("endpoint-vmap-")  # other Services' ranges are in it too
        assert tx.ops.index(f"flush map ip nftrec {m}") < tx.ops.index(decl[0])
    live = read_live(backend, CONFIG.table_name)
    assert diff(relocate(desired, live), live).empty  # no drift: verify/status/plan agree
    # and back: s010's and sticky's elements are only added (declaration, no flush);
    # s020's changed value rewrites its map again
    changes, tx = _sync(backend, base)
    rewritten = {c.name for c in changes if c.kind == "element" and c.action != "add"}
    assert rewritten and rewritten < maps and not [op for op in tx if op.startswith("delete element")]
    assert sorted(op for op in tx if op.startswith("flush map")) == sorted(f"flush map ip nftrec {m}" for m in rewritten)
    live = read_live(backend, CONFIG.table_name)
    assert diff(relocate(base, live), live).empty


# --- the shapes that replace named and anonymous sets (linear kernel cost, bench/kernel_scaling.py) --


def _lb(n_ranges: int):
    ranges = tuple(f"198.18.{i}.0/24" for i in range(n_ranges))
    s = svc("ns1", "lb", "LoadBalancer", cips=("172.30.0.90",), ports=[sp(80, node_port=30090)],
            load_balancer_source_ranges=ranges, load_balancer_ingress=(LoadBalancerIngress("198.51.100.90"),),
            session_affinity="ClientIP", affinity_timeout_seconds=600)
    inv = add_service(rich_inventory(), s, sl("ns1", "lb", [ep("10.180.9.1"), ep("10.180.9.2")], [epp(80)]))
    return compile_ruleset(inv, SH).tables["ip"], ranges


def test_firewall_ranges_are_return_rules_up_to_the_limit_then_kube_proxys_set():
    t, ranges = _lb(FIREWALL_RULES_MAX)
    fw = next(c for n, c in t.chains.items() if n.startswith("firewall-") and "ns1/lb/" in n)
    assert [r.body for r in fw.rules] == [f"ip saddr {r} return" for r in ranges] + ["drop"]
    t, ranges = _lb(FIREWALL_RULES_MAX + 1)
    fw = next(c for n, c in t.chains.items() if n.startswith("firewall-") and "ns1/lb/" in n)
    assert [r.body for r in fw.rules] == [f"ip saddr != {{ {' , '.join(ranges)} }} drop"]


def test_affinity_uses_the_shared_set_with_one_id_per_service_port_and_endpoint():
    t, _ = _lb(1)
    assert not [n for n in t.sets if n.startswith("affinity-") and n != AFFINITY_SET]
    s = t.sets[AFFINITY_SET]
    assert (s.flags, s.timeout, s.size, s.elements) == (("dynamic", "timeout"), None, 64 * 65536, {})
    ids = {name: affinity_key("ip", "affinity-" + name[len("endpoint-"):])
           for name in t.chains if name.startswith("endpoint-")}
    assert len(set(ids.values())) == len(ids) > 2  # distinct per (Service port, endpoint)
    for name in (n for n in ids if "ns1/lb/" in n):  # the update carries the Service's timeout
        assert t.chains[name].rules[0].body == f"update @{AFFINITY_SET} {{ {ids[name]} timeout 600s }}"
    policy = next(c for n, c in t.chains.items() if n.startswith("service-") and "ns1/lb/" in n)
    checks = [r.body for r in policy.rules[:-1]]
    assert checks == [f"{ids[e]} @{AFFINITY_SET} goto {e}" for e in
                      (r.split(" goto ")[1] for r in checks)] and len(checks) == 2


# --- hairpin-connections in shards ---------------------------------------------------------


def test_hairpin_shard_is_the_low_six_bits_of_the_address():
    assert [hairpin_set(ip) for ip in ("10.244.0.0", "10.244.0.63", "10.244.0.64", "10.244.1.42")] == [
        "hairpin-connections-00", "hairpin-connections-3f", "hairpin-connections-00", "hairpin-connections-2a"]
    assert hairpin_set("fd00:10:244::1:3e") == "hairpin-connections-3e"
    assert hairpin_dispatch("ip6") == "ct status dnat ip6 daddr and ::3f vmap @hairpin-shards"


def test_a_moved_local_endpoint_rewrites_only_its_old_shard(backend):
    """Every local endpoint has a hairpin element; moving one rewrites the shard of its old
    address (flush + declaration of that shard's other elements) and declares the new
    address's element in its shard: no other hairpin set, no `delete element`."""
    inv = rich_inventory()
    for i in range(200):
        inv = add_service(inv, svc("hp", f"s{i:03d}", cips=(f"172.30.5.{1 + i}",), ports=[sp(80)]),
                          sl("hp", f"s{i:03d}", [ep(f"10.185.0.{i}", "edge-7"), ep(f"10.186.0.{i}")], [epp(8080)]))
    _sync(backend, compile_ruleset(inv, for_this_nft(SH)))
    edited = with_endpoints(inv, "hp/s007", "IPv4", [ep("10.185.1.77", "edge-7"), ep("10.186.0.7")])
    desired = compile_ruleset(edited, for_this_nft(SH))
    changes, tx = _sync(backend, desired)
    old, new = hairpin_set("10.185.0.7"), hairpin_set("10.185.1.77")
    assert old != new
    assert {c.name for c in changes if c.kind == "element" and c.name.startswith("hairpin")} == {old, new}
    assert not [op for op in tx if op.startswith("delete element")], tx.ops
    assert [op for op in tx if op.startswith("flush set ip nftrec hairpin")] == [f"flush set ip nftrec {old}"]
    t = desired.tables["ip"]
    # the old shard declared with all it keeps, the new one with the added element only
    for name, n in ((old, len(t.sets[old].elements)), (new, 1)):
        decl = [op for op in tx if op.startswith(f"add set ip nftrec {name} ") and "elements =" in op]
        assert len(decl) == 1 and decl[0].count(" . tcp . 8080") == n, decl
    assert len(t.sets[old].elements) < 10  # ~200 / 64 of the elements, not all of them
    live = read_live(backend, CONFIG.table_name)
    assert diff(relocate(desired, live), live).empty


def test_a_shard_exists_while_it_holds_an_element():
    """A shard (set, chain, dispatch vmap element) is compiled only when a local endpoint
    falls in it. Its first element and its last one's removal, through the watch's swap
    and projections and the one-shot patch, give the full compile's ruleset, and the
    projections' diff is the full rulesets' diff (shard objects included)."""
    from reconciler.compile import compile_oneshot, digest, project
    from reconciler.compile.layout import is_hairpin_shard

    def shards(rs):
        t = rs.tables["ip"]
        names = {n for n in t.sets if is_hairpin_shard(n)}
        assert all(t.sets[n].elements for n in names)  # no empty shard
        assert {n[len("hairpin-"):] for n in t.chains if n.startswith("hairpin-")} == \
            {n[len(HAIRPIN_SET_PREFIX):] for n in names}
        assert {e.value for e in t.sets[HAIRPIN_VMAP].elements.values()} == \
            {f"goto hairpin-{n[len(HAIRPIN_SET_PREFIX):]}" for n in names}
        return names

    inv = rich_inventory()
    base = compile_ruleset(inv, SH)
    before = shards(base)
    assert 0 < len(before) < 64
    ip = next(f"10.185.0.{i}" for i in range(64) if hairpin_set(f"10.185.0.{i}") not in before)
    added = add_service(inv, svc("hp", "new", cips=("172.30.5.1",), ports=[sp(80)]),
                        sl("hp", "new", [ep(ip, "edge-7")], [epp(8080)]))
    assert shards(compile_ruleset(added, SH)) == before | {hairpin_set(ip)}

    def oracle_changes(a, b):
        return sorted((c.action, c.kind, c.name, c.key or ()) for c in diff(b, canonical(a)))

    c1 = compile_incremental(inv, SH, None)
    c2 = compile_incremental(added, SH, c1)  # the first element of the shard
    c3 = compile_incremental(inv, SH, c2)  # its last one gone
    for old, new in ((c1, c2), (c2, c3)):
        assert new.swapped and new.ruleset == compile_ruleset(new.inventory, SH, previous=old.ruleset)
        frags = [f for k in changed_services(old, new) for f in (old.fragments.get(k), new.fragments.get(k)) if f]
        got = diff(project(new.ruleset, new.static, frags), canonical(project(old.ruleset, new.static, frags)))
        assert sorted((c.action, c.kind, c.name, c.key or ()) for c in got) == oracle_changes(old.ruleset, new.ruleset)
        assert {(c.action, c.kind, c.name) for c in got if c.kind != "element"} >= {
            ("add" if new is c2 else "remove", kind, name)
            for kind, name in (("set", hairpin_set(ip)), ("chain", "hairpin-" + hairpin_set(ip)[-2:]))}
    assert shards(c3.ruleset) == before

    from reconciler.compile import ruleset_from_json, ruleset_to_json

    def copy(rs):  # compile_oneshot consumes the applied ruleset it is given
        return ruleset_from_json(ruleset_to_json(rs))

    one1 = compile_oneshot(inv, SH, "cd")
    one2 = compile_oneshot(added, SH, "cd", copy(one1.ruleset), one1.memo)
    assert one2.changed == {"hp/new"} and digest(one2.ruleset) == digest(compile_ruleset(added, SH))
    assert oracle_changes(one1.ruleset, one2.ruleset) == sorted(
        (c.action, c.kind, c.name, c.key or ()) for c in diff(one2.desired_part, canonical(one2.applied_part)))
    one3 = compile_oneshot(inv, SH, "cd", copy(one2.ruleset), one2.memo)
    assert one3.changed == {"hp/new"} and digest(one3.ruleset) == digest(base)
    assert shards(one3.ruleset) == before
    assert oracle_changes(one2.ruleset, one3.ruleset) == sorted(
        (c.action, c.kind, c.name, c.key or ()) for c in diff(one3.desired_part, canonical(one3.applied_part)))
