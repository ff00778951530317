"""Endpoints removed and replaced through `apply`'s incremental transaction (layout
sharded: the shard map is flushed and re-declared whole, no `delete element`), proven with
real packets: no new connection lands on a removed endpoint, the kept ones still serve."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dp_topology import EP4
from test_kube_proxy_semantics import config, eps, inv, servers, service, sport
from reconciler.compile.layout import relocate
from reconciler.compile.services import compile_ruleset
from reconciler.engine.changes import diff, transaction_for
from reconciler.kernel.live import read_live
from reconciler.kernel import Libnftables

pytestmark = pytest.mark.dataplane


def apply(dp, inventory):
    """As `nftrec apply` commits: read the kernel, keep its index ranges, diff, one
    transaction; returns it. The probes are traced against the new desired ruleset."""
    cfg = replace(config(), spelling=dp.spelling())  # what this nft accepts (before our context)
    nft = Libnftables(dp.node)
    try:
        live = read_live(nft, "nftrec")
        desired = relocate(compile_ruleset(inventory, cfg), live)
        tx = transaction_for(diff(desired, live), desired)
        nft.run(tx)
        assert diff(desired, read_live(nft, "nftrec")).empty
    finally:
        nft.close()
    dp.hand_loaded, dp.loaded_ruleset = False, desired
    dp.flush_conntrack()
    return tx


def test_removed_and_replaced_endpoints_get_no_new_connections(dp):
    web = service("web", ("10.96.0.60",), sport(80, 8080))
    sticky = service("sticky", ("10.96.0.61",), sport(80, 8080), session_affinity="ClientIP",
                     affinity_timeout_seconds=300)
    dp.load(inv(web, eps("web", EP4), sticky, eps("sticky", EP4)), config())
    assert set(servers(dp.probe("clientA", "10.96.0.60", 80, count=40))) == set(EP4)
    for role in ("clientA", "clientB", "pod"):  # affinity entries, some on EP4[2]
        dp.probe(role, "10.96.0.61", 80, count=2)

    tx = apply(dp, inv(web, eps("web", EP4[:2]), sticky, eps("sticky", EP4[:2])))
    if dp.spelling().index_maps:  # else (nft 0.9.8) the rules' anonymous maps change
        assert any(op.startswith("flush map ip nftrec endpoint-dnat-tcp-") for op in tx)
        assert any(op.startswith("flush map ip nftrec endpoint-vmap-") for op in tx)
    assert not [op for op in tx if op.startswith("delete element ip nftrec endpoint-")], tx.ops
    assert set(servers(dp.probe("clientA", "10.96.0.60", 80, count=40))) == set(EP4[:2])
    for role in ("clientA", "clientB", "pod"):
        seen = servers(dp.probe(role, "10.96.0.61", 80, count=6))
        assert len(seen) == 1 and set(seen) <= set(EP4[:2]), f"{role}: {seen}"

    # a replaced endpoint (same count, another address): its index's value changes
    tx = apply(dp, inv(web, eps("web", (EP4[2], EP4[1])), sticky, eps("sticky", EP4[:2])))
    assert not [op for op in tx if op.startswith("delete element ip nftrec endpoint-")], tx.ops
    assert set(servers(dp.probe("clientA", "10.96.0.60", 80, count=40))) == {EP4[1], EP4[2]}
