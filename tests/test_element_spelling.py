"""engine/changes.transaction_for: how set and map elements are written.

nft 1.0.6 fills its cache from the kernel (every chain and set of the table) to evaluate
an `add element` or `delete element` (0.4-1.3 s at 10,000 Services), not a set's
declaration or `flush set` (bench/README.md). So additions to a flag-free set go through
its declaration (`add set … { type … ; elements = { … } ; }`), and sets losing elements
are flushed and re-declared whole when they are all declarable and small enough
(`REWRITE_BUDGET`), else every removal is a `delete element` (the first one pays the
cache fill for all). Each case runs on the Fake and on a real kernel, ends in sync.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import reconciler.engine.changes as changes_mod
from _nft_samples import CONFIG, add_service, ep, epp, rich_inventory, sl, sp, svc, with_endpoints
from nsutil import for_this_nft
from reconciler.compile.layout import hairpin_set, relocate
from reconciler.compile.services import compile_ruleset
from reconciler.engine.changes import diff, transaction_for
from reconciler.kernel.live import read_live

TABLE = CONFIG.table_name
# the hairpin-connections set of a local endpoint (layout sharded: its shard, compile/layout.py)
HP_NEW, HP_ONE = hairpin_set("10.180.9.1"), hairpin_set("10.180.0.1")
BASE = rich_inventory()
NEW = add_service(BASE, svc("ns9", "new", "NodePort", cips=("172.30.0.99",), ports=[sp(80, name="web", node_port=30099)]),
                  sl("ns9", "new", [ep("10.180.9.1", "edge-7"), ep("10.180.9.2")], [epp(8080, name="web")]))



def sync(nft, inv, layout="sharded"):
    live = read_live(nft, TABLE)
    desired = relocate(compile_ruleset(inv, replace(for_this_nft(CONFIG), layout=layout)), live)
    ch = diff(desired, live)
    tx = transaction_for(ch, desired)
    nft.run(tx)
    live = read_live(nft, TABLE)
    assert diff(relocate(desired, live), live).empty
    return ch, tx


def verbs(tx, *prefixes):
    return [op for op in tx if op.startswith(prefixes)]


@pytest.mark.parametrize("layout", ["sharded", "kube-proxy"])
def test_a_new_service_s_elements_go_through_the_sets_declarations(backend, layout):
    sync(backend, BASE, layout)
    ch, tx = sync(backend, NEW, layout)
    assert not verbs(tx, "add element", "delete element", "flush"), tx.ops
    added = {c.name for c in ch if c.kind == "element"}
    hairpin = HP_NEW if layout == "sharded" else "hairpin-connections"
    assert {"cluster-ips", "service-ips", "service-nodeports", hairpin} <= added
    for name in added:
        decl = [op for op in verbs(tx, f"add set ip nftrec {name} {{", f"add map ip nftrec {name} {{")
                if "elements = {" in op]
        assert len(decl) == 1, (name, tx.ops)
    assert "172.30.0.99 . tcp . 80 : goto service-" in " ".join(verbs(tx, "add map ip nftrec service-ips {"))


def test_a_removed_service_s_sets_are_rewritten_or_all_deleted(backend, monkeypatch):
    sync(backend, NEW)
    ch, tx = sync(backend, BASE)  # ns9/new removed; every set it leaves is declarable and small
    lost = {c.name for c in ch if c.kind == "element"}
    assert {"cluster-ips", "service-ips"} <= lost and not verbs(tx, "delete element")
    assert sorted(op.split()[-1] for op in verbs(tx, "flush set", "flush map")) == sorted(lost)
    sync(backend, NEW)
    monkeypatch.setattr(changes_mod, "REWRITE_BUDGET", 5)  # too many elements to rewrite: deletes
    ch, tx = sync(backend, BASE)
    assert not verbs(tx, "flush set", "flush map")
    assert {op.split()[4] for op in verbs(tx, "delete element")} == lost


def test_a_set_that_cannot_be_declared_makes_every_removal_a_delete(backend):
    # ns1/one loses its only endpoint: its ClusterIP goes from service-ips to
    # no-endpoint-services (elements with a comment: not declarable), its hairpin element goes
    sync(backend, BASE)
    ch, tx = sync(backend, with_endpoints(BASE, "ns1/one", "IPv4", []))
    assert {c.name for c in ch if c.kind == "element" and c.action == "remove"} == {"service-ips", HP_ONE}
    assert not verbs(tx, "flush set", "flush map")  # a rewrite would not save the cache fill
    assert len(verbs(tx, "delete element")) == 2
    # and back: no-endpoint-services loses its element (not declarable): deletes again
    ch, tx = sync(backend, BASE)
    assert verbs(tx, "delete element ip nftrec no-endpoint-services") and not verbs(tx, "flush set", "flush map")


def test_a_projection_rewrites_only_sets_it_kept_whole(backend):
    """watch's partial syncs and one-shot runs plan from projections
    (compile/projection.project). A shared set a changed Service has elements in is kept
    whole there, so a removal is the same flush + declaration as for the whole rulesets;
    a set the projection cut down (`Ruleset.partial`) is never flushed, which would drop
    every other Service's elements."""
    from dataclasses import replace as dc_replace

    from reconciler.compile import changed_services, compile_incremental, project
    from reconciler.compile import compile_static
    from reconciler.kernel.live import canonical

    cfg = replace(for_this_nft(CONFIG), layout="sharded")
    sync(backend, NEW)
    c1 = compile_incremental(NEW, cfg, None, previous=read_live(backend, TABLE))
    edited = with_endpoints(NEW, "ns9/new", "IPv4", [ep("10.180.9.2")])  # loses its local endpoint
    c2 = compile_incremental(edited, cfg, c1)
    changed = changed_services(c1, c2)
    assert changed == {"ns9/new"}
    static = compile_static(cfg, edited)
    frags = [f for k in changed for f in (c1.fragments.get(k), c2.fragments.get(k)) if f]
    old_p, new_p = project(c1.ruleset, static, frags), project(c2.ruleset, static, frags)
    assert new_p.partial and not c2.ruleset.partial
    assert ("ip", HP_NEW) not in new_p.partial  # the Service has elements there
    tx = transaction_for(diff(new_p, canonical(old_p)), new_p)
    assert verbs(tx, f"flush set ip nftrec {HP_NEW}") and not verbs(tx, "delete element")
    flushed = {(op.split()[2], op.split()[4]) for op in verbs(tx, "flush set", "flush map")}
    assert not new_p.partial & flushed
    # the same projection with that set marked cut: deletes, never a flush of it
    cut = dc_replace(new_p, partial=new_p.partial | {("ip", HP_NEW)})
    tx_cut = transaction_for(diff(cut, canonical(old_p)), cut)
    assert verbs(tx_cut, f"delete element ip nftrec {HP_NEW}") and not verbs(tx_cut, "flush set", "flush map")
    backend.run(tx)
    live = read_live(backend, TABLE)
    assert diff(relocate(c2.ruleset, live), live).empty  # every other Service's elements kept
