"""reconciler/engine/changes.py: minimal, per-Service transactions that the kernel accepts in one go.

Each scenario runs on the Fake and on a real kernel (inside a test namespace): apply the
base ruleset, apply one edit, check that only that Service's objects were touched and
that nothing differs afterwards.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from _nft_samples import (
    CONFIG,
    HAIRPIN_A,
    HAIRPIN_B,
    add_service,
    ep,
    epp,
    rich_inventory,
    sl,
    sp,
    svc,
    with_endpoints,
    with_service,
)
from nsutil import for_this_nft
from reconciler.compile.services import compile_ruleset
from reconciler.intake.model import Inventory
from reconciler.engine.changes import Changes, diff, owner_of_name, transaction_for
from reconciler.kernel.live import canonical, read_live
from reconciler.compile import changed_services, compile_incremental, project
from reconciler.kernel import Fake, Libnftables, Transaction
from reconciler.compile.ruleset import BaseHook, Chain, Rule, Ruleset, Table
from reconciler.compile.layout import hairpin_chain_of, hairpin_set, hairpin_vmap_key, is_layout_map, relocate

TABLE = CONFIG.table_name



def sync(nft, desired: Ruleset) -> tuple[Changes, Transaction]:
    """As plan/apply do: read the kernel, keep its endpoint index ranges (layout sharded),
    diff, commit."""
    live = read_live(nft, TABLE)
    desired = relocate(desired, live)
    changes = diff(desired, live)
    tx = transaction_for(changes, desired)
    nft.run(tx)
    return changes, tx


def compiled(inv, layout: str = "sharded") -> Ruleset:
    """As plan/apply compile for this machine's nft (kube-proxy's spelling on nft 0.9.8)."""
    return compile_ruleset(inv, replace(for_this_nft(CONFIG), layout=layout))


def assert_in_sync(nft, desired: Ruleset) -> None:
    live = read_live(nft, TABLE)
    left = diff(relocate(desired, live), live)
    assert [(c.action, c.family, c.kind, c.name, c.key, c.reason) for c in left] == []


def test_cold_apply_then_nothing_to_do(backend):
    desired = compiled(rich_inventory())
    changes, tx = sync(backend, desired)
    assert {c.table.action for c in changes.families.values()} == {"add"}
    # every table, chain, set and map declared
    assert len(tx) >= sum(1 + len(t.chains) + len(t.sets) for t in desired.tables.values())
    assert_in_sync(backend, desired)
    changes, tx = sync(backend, desired)
    assert changes.empty and len(changes) == 0 and len(tx) == 0


def _chain_decls(tx: Transaction) -> list[tuple[str, str, bool]]:
    """(family, chain, declared with rules) per `add chain`, in transaction order."""
    return [(op.split()[2], op.split()[4], "{" in op and not re.search(r"\{ (type \S+ hook[^;]*; (policy \w+ ; )?)?(comment \"[^\"]*\" ; )?\}$", op))
            for op in tx if op.startswith("add chain")]


def test_cold_create_declares_each_chain_once_after_those_it_jumps_to(backend):
    """A new chain that gets rules is declared once, with its rules (an empty shell
    first too cost nft 40 MB of 315 at 10,000 Services), after every chain it jumps
    to; the kernel (and the Fake) refuse a jump to a chain not yet declared."""
    desired = compiled(BASE)
    _, tx = sync(backend, desired)
    decls = _chain_decls(tx)
    assert len(decls) == len(set(decls)) and len(decls) == sum(len(t.chains) for t in desired.tables.values())
    at = {(fam, name): i for i, (fam, name, _) in enumerate(decls)}
    jumps = 0
    for fam, t in desired.tables.items():
        for c in t.chains.values():
            for target in (m for r in c.rules for m in re.findall(r"\b(?:jump|goto) ([^\s,{};]+)", r.body)):
                assert at[(fam, target)] < at[(fam, c.name)], (c.name, target)
                jumps += 1
    assert jumps > 10
    # the insertion order of the compiled ruleset has base chains first: they were reordered
    first_base = next(c.name for c in desired.tables["ip"].chains.values() if c.base and c.rules)
    assert at[("ip", first_base)] > min(at.values())
    assert_in_sync(backend, desired)


def _table(*chains: Chain) -> Ruleset:
    return Ruleset(tables={"ip": Table("ip", TABLE, chains={c.name: c for c in chains})})


def test_new_chains_in_dependency_order_else_shells_first(backend):
    a, b, c, e = (Chain("a", (Rule("jump b"), Rule("goto c"))), Chain("b", (Rule("ip daddr 10.0.0.1 jump c"),)),
                  Chain("c", (Rule("ip daddr 10.0.0.2 jump e"), Rule("accept"))), Chain("e"))
    desired = _table(a, b, c, e)
    _, tx = sync(backend, desired)
    assert _chain_decls(tx) == [("ip", "e", False), ("ip", "c", True), ("ip", "b", True), ("ip", "a", True)]
    assert_in_sync(backend, desired)
    # a loop (the kernel refuses it; the order cannot be found): every new chain
    # declared empty first, then its rules, in the ruleset's order
    loop = _table(Chain("x", (Rule("jump y"),)), Chain("y", (Rule("jump x"),)))
    tx = transaction_for(diff(loop, Ruleset()), loop)
    assert _chain_decls(tx) == [("ip", "x", False), ("ip", "y", False), ("ip", "x", True), ("ip", "y", True)]


BASE = rich_inventory()
EDITS = {
    "endpoint added": ("ns1/multi", with_endpoints(BASE, "ns1/multi", "IPv4", [ep("10.180.0.3"), ep("10.180.0.2"), ep("10.180.0.9")])),
    "endpoint removed": ("ns1/multi", with_endpoints(BASE, "ns1/multi", "IPv4", [ep("10.180.0.3")])),
    "last endpoint removed": ("ns1/one", with_endpoints(BASE, "ns1/one", "IPv4", [])),
    "affinity endpoint removed": ("ns3/lb", with_endpoints(BASE, "ns3/lb", "IPv4", [ep("10.180.2.1")])),
    "service added": ("ns9/new", add_service(
        BASE,
        svc("ns9", "new", "NodePort", cips=("172.30.0.99",), ports=[sp(80, name="web", node_port=30099)]),
        sl("ns9", "new", [ep("10.180.9.1", "edge-7"), ep("10.180.9.2")], [epp(8080, name="web")]),
    )),
    "service removed": ("ns3/lb", with_service(BASE, "ns3/lb", remove=True)),
    "plain service removed": ("ns1/one", with_service(BASE, "ns1/one", remove=True)),
    "v6 service removed": ("ns5/v6aff", with_service(BASE, "ns5/v6aff", remove=True)),
    "affinity on": ("ns1/multi", with_service(BASE, "ns1/multi", session_affinity="ClientIP")),
    "affinity off": ("ns3/lb", with_service(BASE, "ns3/lb", session_affinity="None")),
    "affinity timeout changed": ("ns3/lb", with_service(BASE, "ns3/lb", affinity_timeout_seconds=900)),
    "source range changed": ("ns3/lb", with_service(BASE, "ns3/lb", load_balancer_source_ranges=("203.0.113.0/26",))),
    "eTP Local to Cluster": ("ns2/np", with_service(BASE, "ns2/np", external_traffic_policy="Cluster")),
}


def _owners(changes: Changes) -> set:
    """Owners of the changes; a shared endpoint map of the sharded layout created or
    removed (its first user came or its last one left) counts as none. A hairpin shard
    created or removed (its set, chain and dispatch vmap element) is the Service's whose
    elements it holds (changes._Owners._shard): counted."""
    return {c.owner for c in changes if not (c.owner is None and c.kind == "set" and is_layout_map(c.name))}


@pytest.mark.parametrize("layout", ["sharded", "kube-proxy"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_single_edit_touches_only_that_service(backend, edit, layout):
    key, inv = EDITS[edit]
    base = compiled(BASE, layout)
    sync(backend, base)
    desired = compiled(inv, layout)
    changes, tx = sync(backend, desired)
    assert len(tx) > 0
    assert _owners(changes) == {key}, [(c.kind, c.name, c.key, c.owner) for c in changes if c.owner != key]
    if layout == "kube-proxy":
        assert {c.owner for c in changes} == {key}
    # every chain/set the transaction names belongs to that Service, or is a shared set
    # whose elements (owned by it, checked above) were edited or whose definition is
    # re-declared for the rules that use it (changes.transaction_for, step 5), or a
    # created/removed map, or an object the diff gives that Service (a hairpin shard's chain)
    shared = {s for s in base.tables["ip"].sets if owner_of_name(s) is None}
    its = {c.name for c in changes if c.owner == key}
    for op in tx:
        name = op.split()[4]
        assert owner_of_name(name) == key or name in shared or name in its or (
            layout == "sharded" and is_layout_map(name)), op
    assert_in_sync(backend, desired)
    # and back again
    changes, _ = sync(backend, base)
    assert _owners(changes) == {key}, [(c.kind, c.name, c.key, c.owner) for c in changes if c.owner != key]
    assert_in_sync(backend, base)


def _shard_owners(changes: Changes, ip: str) -> dict[tuple[str, str], str | None]:
    """(kind, name) → owner of the changes to the hairpin shard of local endpoint `ip`:
    its set, its chain, its dispatch vmap element, and its elements (by address)."""
    shard = hairpin_set(ip)
    out = {}
    for c in changes:
        if c.name == shard or c.name == hairpin_chain_of(shard) or (
                c.name == "hairpin-shards" and c.key == hairpin_vmap_key(c.family, shard)):
            out[(c.kind, c.name if c.kind != "element" or c.name != shard else c.key[0])] = c.owner
    return out


def test_hairpin_shard_is_its_one_services_else_shared(backend):
    """A hairpin shard (layout sharded) is created with its first element and removed
    with its last one: its set, chain and dispatch vmap element are the Service's whose
    elements it holds, or shared when it holds two Services' (each element stays its
    Service's)."""
    a, b = HAIRPIN_A, HAIRPIN_B
    assert hairpin_set("10.180.9.40") == hairpin_set("10.180.8.40") == "hairpin-connections-28"
    base, with_a, with_b, both = (compiled(BASE), compiled(add_service(BASE, *a)), compiled(add_service(BASE, *b)),
                                  compiled(add_service(add_service(BASE, *a), *b)))
    assert "hairpin-connections-28" not in base.tables["ip"].sets
    skeleton = [("set", "hairpin-connections-28"), ("chain", "hairpin-28"), ("element", "hairpin-shards")]
    sync(backend, base)
    # one Service fills it: all of it is that Service's, created and removed
    changes, tx = sync(backend, with_a)
    assert _shard_owners(changes, "10.180.9.40") == {**dict.fromkeys(skeleton, "ns9/a"), ("element", "10.180.9.40"): "ns9/a"}
    assert {c.owner for c in changes} == {"ns9/a"} and any(op.startswith("add chain ip nftrec hairpin-28 ") for op in tx)
    # a second Service's element in the existing shard: only that element changes
    changes, _ = sync(backend, both)
    assert _shard_owners(changes, "10.180.9.40") == {("element", "10.180.8.40"): "ns9/b"}
    # the first one's goes, the shard stays (the second's)
    changes, _ = sync(backend, with_b)
    assert _shard_owners(changes, "10.180.9.40") == {("element", "10.180.9.40"): "ns9/a"}
    # its last element gone: removed (its elements with the set), the second Service's
    changes, tx = sync(backend, base)
    assert _shard_owners(changes, "10.180.9.40") == dict.fromkeys(skeleton, "ns9/b")
    assert "delete chain ip nftrec hairpin-28" in tx
    # two Services fill it in one edit, or both leave: shared (each element its Service's)
    changes, _ = sync(backend, both)
    assert _shard_owners(changes, "10.180.9.40") == {
        **dict.fromkeys(skeleton, None), ("element", "10.180.9.40"): "ns9/a", ("element", "10.180.8.40"): "ns9/b"}
    changes, _ = sync(backend, base)
    assert _shard_owners(changes, "10.180.9.40") == dict.fromkeys(skeleton, None)
    assert_in_sync(backend, base)


def test_hairpin_shard_owner_between_two_projections():
    """`watch` diffs two projections (compile.project): a shard's created objects are its
    Service's, and so are its removed ones (the recorded side's owners)."""
    c0 = compile_incremental(BASE, CONFIG, None)
    c1 = compile_incremental(add_service(BASE, *HAIRPIN_A), CONFIG, c0)
    c2 = compile_incremental(BASE, CONFIG, c1)
    skeleton = {("set", "hairpin-connections-28"): "ns9/a", ("chain", "hairpin-28"): "ns9/a",
                ("element", "hairpin-shards"): "ns9/a"}
    for old, new, want in ((c0, c1, {**skeleton, ("element", "10.180.9.40"): "ns9/a"}), (c1, c2, skeleton)):
        frags = [f for k in changed_services(old, new) for f in (old.fragments.get(k), new.fragments.get(k)) if f]
        got = diff(project(new.ruleset, new.static, frags), canonical(project(old.ruleset, new.static, frags)))
        assert _shard_owners(got, "10.180.9.40") == want
        assert {c.owner for c in got} == {"ns9/a"}


@pytest.mark.parametrize("layout", ["sharded", "kube-proxy"])
def test_operation_counts_like_kube_proxy(layout):
    def compiled(inv, layout):  # nftrec's own spelling, whatever this machine's nft accepts
        return compile_ruleset(inv, replace(CONFIG, layout=layout))

    f = Fake()
    sync(f, compiled(BASE, layout))
    # one endpoint fewer in a two-port Service without affinity: per port the policy chain
    # is flushed and its one DNAT rule re-added (through the chain's declaration,
    # ruleset.chain_rules_cmd: `add rule` costs nft 1.0.6 a cache fill); kube-proxy: no
    # element changes; sharded: the port's two map elements and (last user gone) its map
    # are deleted.
    _, tx = sync(f, compiled(EDITS["endpoint removed"][1], layout))
    ops = [" ".join(op.split()[:2]) for op in tx]
    assert not any(op.startswith("add rule") for op in tx)
    if layout == "kube-proxy":
        assert ops == ["flush chain"] * 2 + ["add chain"] * 2
    else:
        assert sorted(ops) == sorted(["flush chain"] * 2 + ["add chain"] * 2 + ["delete map"] * 2)  # elements go with it
    sync(f, compiled(BASE, layout))
    # an endpoint more (3 → capacity 4 holds it, sharded): kube-proxy rewrites the rule
    # with its anonymous map; sharded adds one element per port, written as its map's
    # declaration (no nft cache fill: ruleset.set_elements_cmd), and rewrites the rule
    _, tx = sync(f, compiled(EDITS["endpoint added"][1], layout))
    ops = [" ".join(op.split()[:2]) for op in tx]
    if layout == "kube-proxy":
        assert ops == ["flush chain"] * 2 + ["add chain"] * 2
    else:  # the new maps declared before the chains whose rules use them
        assert sorted(ops) == sorted(["flush chain"] * 2 + ["add map"] * 4 + ["add chain"] * 2)
        adds = [op for op in tx if op.startswith("add map") and "elements =" in op]
        assert len(adds) == 2 and all(re.search(r"typeof numgen random mod 1 : ip daddr \. (udp|sctp) dport ; comment \"[^\"]+\" ; "
                             r"elements = \{ 2 : 10\.180\.0\.9 \. \d+ \} ; \}$", op) for op in adds), adds
    sync(f, compiled(BASE, layout))
    # a new ClusterIP Service with one endpoint: chain + rule + cluster-ips + service-ips
    # (their elements in the sets' declarations)
    inv = add_service(BASE, svc("ns9", "c", cips=("172.30.0.98",), ports=[sp(80)]), sl("ns9", "c", [ep("10.180.9.5")], [epp(80)]))
    _, tx = sync(f, compiled(inv, layout))
    assert sorted(" ".join(op.split()[:3]) for op in tx) == [
        "add chain ip", "add map ip", "add set ip"]  # the chain once, with its rule (no empty shell first)
    # removing it again: flush + delete of the chain; cluster-ips and service-ips (small
    # here: changes.REWRITE_BUDGET) flushed and re-declared instead of 2 element deletes
    _, tx = sync(f, compiled(BASE, layout))
    assert sorted(" ".join(op.split()[:2]) for op in tx) == [
        "add map", "add set", "delete chain", "flush chain", "flush map", "flush set"]


def test_changed_set_definition_recreates_set_and_rewrites_users(backend):
    # kube-proxy's layout: a set per affinity endpoint, with the Service's timeout (the
    # sharded layout's shared set carries the timeout in the rules instead)
    sync(backend, compiled(BASE, "kube-proxy"))
    desired = compiled(EDITS["affinity timeout changed"][1], "kube-proxy")
    changes = diff(desired, read_live(backend, TABLE))
    fc = changes.families["ip"]
    assert fc.sets_changed and all(c.reason == "timeout changed: re-created" for c in fc.sets_changed)
    users = {c.name for c in fc.chains_changed}
    assert any(n.startswith("endpoint-") for n in users) and any(n.startswith("service-") for n in users)
    backend.run(transaction_for(changes, desired))
    assert_in_sync(backend, desired)


def test_base_chain_hook_change_recreates_it(backend):
    base = compiled(BASE)
    sync(backend, base)
    desired = compiled(BASE)
    t = desired.tables["ip"]
    t.chains["nat-prerouting"] = replace(t.chains["nat-prerouting"], base=BaseHook("nat", "prerouting", -99))
    changes, tx = sync(backend, desired)
    assert [(c.kind, c.name, c.reason) for c in changes] == [("chain", "nat-prerouting", "hook/priority changed: re-created")]
    assert tx.ops[:2] == ("delete chain ip nftrec nat-prerouting",
                          "add chain ip nftrec nat-prerouting { type nat hook prerouting priority -99 ; }")
    assert_in_sync(backend, desired)


def test_missing_and_unwanted_tables(backend):
    full = compiled(BASE)
    only_v4 = Ruleset({"ip": full.tables["ip"]}, full.owners)
    sync(backend, only_v4)
    assert [t for t in backend.list_tables() if t[1] == TABLE] == [("ip", TABLE)]
    changes, _ = sync(backend, full)
    assert changes.families["ip6"].table.action == "add" and "ip" not in changes.families
    assert_in_sync(backend, full)
    changes, tx = sync(backend, only_v4)
    assert tx.ops == ("delete table ip6 nftrec",)
    assert backend.list_table("ip6", TABLE) is None


def test_drift_is_reported_with_owner_and_repaired(backend):
    desired = compiled(BASE)
    sync(backend, desired)
    live = read_live(backend, TABLE)
    chain = next(n for n in live.tables["ip"].chains if n.startswith("service-") and "ns1/multi" in n)
    # someone flushes a chain and deletes an element behind our back
    backend.run(Transaction().raw(f"flush chain ip nftrec {chain}").raw(
        "delete element ip nftrec cluster-ips { 172.30.0.44 }"))
    changes = diff(desired, read_live(backend, TABLE))
    assert {(c.kind, c.owner) for c in changes} == {("chain", "ns1/multi"), ("element", "ns3/lb")}
    sync(backend, desired)
    assert_in_sync(backend, desired)


def test_stale_chain_deleted_in_the_same_transaction_on_the_kernel(netns):
    """kube-proxy deletes stale chains in a later transaction (kernels < 6.2 noticed only
    later that a chain lost its last reference). Kernel 6.18 accepts the element delete,
    the flush of the referencing chain and the chain delete in one transaction."""
    with Libnftables(netns=netns) as nft:
        sync(nft, compiled(BASE))
        desired = compiled(with_service(BASE, "ns3/lb", remove=True))
        changes, tx = sync(nft, desired)
        removed = {c.name for c in changes.families["ip"].chains_removed}
        assert any(n.startswith("endpoint-") for n in removed) and any(n.startswith("firewall-") for n in removed)
        deletes = [op for op in tx if op.startswith("delete chain")]
        assert len(deletes) == len(changes.families["ip"].chains_removed) and "ip6" not in changes.families
        # deletes come after every element delete / flush that referenced them
        last_ref = max(i for i, op in enumerate(tx.ops) if op.startswith(("delete element", "flush")))
        assert min(tx.ops.index(op) for op in deletes) > last_ref
        text = nft.list_table("ip", TABLE)
        assert not any(n in text for n in removed)
        assert_in_sync(nft, desired)


def test_owner_of_name():
    assert owner_of_name("service-HVFWP5L3-ns5/svc5/tcp/p80") == "ns5/svc5"
    assert owner_of_name("endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80") == "ns5/svc5"
    assert owner_of_name("affinity-GTK6MW7G-ns5/svc5/tcp/__10.180.0.3/80") == "ns5/svc5"
    assert owner_of_name("services") is None
    assert owner_of_name("reject-chain") is None


# --- weird kernel states in and around our table (real kernel) -----------------------------

# Each: an `nft -f` script run by hand after nftrec applied BASE; nftrec must plan it
# sensibly and converge in ONE transaction, never touching the tables of others.
WEIRD = {
    "user chain and set": """
add chain ip nftrec mine
add rule ip nftrec mine counter accept
add set ip nftrec myset { type ipv4_addr ; }
""",
    "user vmap with a goto to a user chain": """
add chain ip nftrec uchain
add map ip nftrec umap { type ipv4_addr : verdict ; }
add element ip nftrec umap { 1.2.3.4 : goto uchain }
""",
    "user rule in a service chain": """
add rule ip nftrec reject-chain counter
""",
    "table made dormant": """
add table ip nftrec { flags dormant ; }
""",
    "base chain policy drop": """
add chain ip nftrec filter-input { type filter hook input priority 0 ; policy drop ; }
""",
    "base chain priority changed": """
delete chain ip nftrec nat-output
add chain ip nftrec nat-output { type nat hook output priority 7 ; }
""",
    "stateful objects used by a user chain": """
add counter ip nftrec cnt
add quota ip nftrec q { over 100 mbytes ; }
add limit ip nftrec lim { rate 10/second ; }
add ct helper ip nftrec h { type "ftp" protocol tcp ; }
add ct timeout ip nftrec ctt { protocol tcp ; l3proto ip ; policy = { established : 100 } ; }
add ct expectation ip nftrec ex { protocol tcp ; dport 21 ; timeout 1m ; size 5 ; }
add synproxy ip nftrec sp { mss 1460 ; wscale 7 ; }
add chain ip nftrec uc
add rule ip nftrec uc counter name cnt quota name q
add rule ip nftrec filter-input jump uc
""",
    "chain renamed": """
rename chain ip nftrec nat-prerouting natpre
""",
    "ip6 table gone": """
delete table ip6 nftrec
""",
    "user objects named so nftrec cannot write their names": """
add chain ip nftrec _weird
add set ip nftrec _s { type ipv4_addr ; }
""",
}

NEIGHBOURS = """
add table inet nftrec
add chain inet nftrec c { type filter hook input priority 0 ; }
add table netdev nftrec
add table ip kube-proxy
add chain ip kube-proxy services
add table ip other { flags dormant ; }
"""


@pytest.mark.parametrize("state", list(WEIRD))
def test_weird_kernel_state_converges_in_one_run(netns, state):
    from nsutil import in_ns

    desired = compiled(BASE)
    in_ns(netns, "nft", "-f", "-", input=NEIGHBOURS)
    with Libnftables(netns=netns) as nft:
        sync(nft, desired)
        others = {t: nft.list_table(*t) for t in (("ip", "kube-proxy"), ("ip", "other"))}
        in_ns(netns, "nft", "-f", "-", input=WEIRD[state])
        changes = diff(desired, read_live(nft, TABLE))
        assert not changes.empty
        for c in changes:
            assert c.reason
        sync(nft, desired)  # ONE transaction
        assert_in_sync(nft, desired)
        assert "dormant" not in nft.list_table("ip", TABLE)
        assert "policy drop" not in nft.list_table("ip", TABLE)
        # neighbours untouched
        assert {t: nft.list_table(*t) for t in others} == others
        assert {("inet", "nftrec"), ("netdev", "nftrec")} <= set(nft.list_tables())


def test_weird_states_are_planned_with_reasons(netns):
    from nsutil import in_ns

    desired = compiled(BASE)
    with Libnftables(netns=netns) as nft:
        sync(nft, desired)
        in_ns(netns, "nft", "-f", "-", input=WEIRD["base chain policy drop"] + WEIRD["stateful objects used by a user chain"])
        changes = diff(desired, read_live(nft, TABLE))
        why = {(c.kind, c.name): c.reason for c in changes}
        assert why[("chain", "filter-input")] == "policy drop (not nftrec's): re-created with policy accept"
        assert why[("object", "cnt")] == "counter object not made by nftrec"
        assert why[("object", "h")] == "ct helper object not made by nftrec"
        tx = transaction_for(changes, desired)
        assert "delete ct helper ip nftrec h" in tx.ops
        # stray objects go after the flush of the rules using them, before chain deletes
        assert tx.ops.index("flush chain ip nftrec uc") < tx.ops.index("delete counter ip nftrec cnt") \
            < tx.ops.index("delete chain ip nftrec uc")
        in_ns(netns, "nft", "add table ip nftrec { flags dormant ; }")
        changes = diff(desired, read_live(nft, TABLE))
        assert changes.families["ip"].table.reason == "table flags dormant (not nftrec's): re-created"
        sync(nft, desired)
        in_ns(netns, "nft", "add chain ip nftrec _weird")
        changes = diff(desired, read_live(nft, TABLE))
        assert changes.families["ip"].table.reason == (
            "object '_weird' is not nftrec's and cannot be deleted by name: re-created")


def _swap_lb_for_new_service(inv):
    """ns3/lb removed; ns9/heir takes its ClusterIP, port and endpoints (same keys in the
    shared maps, other chains), with affinity off."""
    inv = with_service(inv, "ns3/lb", remove=True)
    return add_service(inv, svc("ns9", "heir", cips=("172.30.0.44",), ports=[sp(443, name="https")]),
                       sl("ns9", "heir", [ep("10.180.2.1"), ep("10.180.2.9")], [epp(8443, name="https")]))


ORDERINGS = {
    "a removed Service's ClusterIP reused by a new one": _swap_lb_for_new_service,
    "affinity off while endpoints change": lambda inv: with_endpoints(
        with_service(inv, "ns3/lb", session_affinity="None"), "ns3/lb", "IPv4", [ep("10.180.2.7")]),
    "the last Service of a family removed": lambda inv: with_service(
        with_service(inv, "ns5/v6", remove=True), "ns5/v6aff", remove=True),
    "every Service removed": lambda inv: Inventory(services=(), endpoint_slices=()),
}


@pytest.mark.parametrize("case", list(ORDERINGS))
def test_transaction_ordering_is_accepted_in_one_go(backend, case):
    base = compiled(BASE)
    sync(backend, base)
    desired = compiled(ORDERINGS[case](BASE))
    sync(backend, desired)
    assert_in_sync(backend, desired)
    sync(backend, base)
    assert_in_sync(backend, base)
