"""The two spellings of the sharded layout's endpoint selection carry the same packets.

nft 0.9.8 refuses `typeof numgen … : verdict` maps and numgen in a concatenation
(kernel/features.py), so there nftrec writes kube-proxy's spelling of those constructs
(an anonymous map per Service port, a dynamic set per endpoint for ClientIP affinity):
NftSpelling(index_maps=False, shared_affinity=False). Every nft that accepts nftrec's own
spelling accepts this one too, so both are loaded here in turn, on the nft at hand, and
the same connections must land on the same backends: spread over every endpoint (TCP,
UDP, IPv6), or held to one per client (ClientIP affinity, both families). Every probe is
also checked against nftrec's trace of the loaded ruleset (trace_check.py).
"""

from __future__ import annotations

import re

import pytest

from dp_topology import CLIENT_A4, CLIENT_A6, EP4, EP6
from reconciler.intake.model import EndpointPort, NftSpelling
from test_kube_proxy_semantics import config, eps, inv, replies, servers, service, sport

pytestmark = pytest.mark.dataplane

FALLBACK = NftSpelling(index_maps=False, shared_affinity=False)


def _inventory():
    ports = (EndpointPort("dns", "UDP", 9090),)
    return inv(
        service("web", ("10.96.0.10", "fd00:96::10"), sport(80, 8080)),
        eps("web", EP4), eps("web", EP6),
        service("dns", ("10.96.0.70",), sport(53, 9090, "UDP", name="dns")),
        eps("dns", EP4, ports),
        service("sticky", ("10.96.0.50", "fd00:96::50"), sport(80, 8080), session_affinity="ClientIP",
                affinity_timeout_seconds=300),
        eps("sticky", EP4), eps("sticky", EP6),
        service("sticky-one", ("10.96.0.51",), sport(80, 8080), session_affinity="ClientIP",
                affinity_timeout_seconds=300),
        eps("sticky-one", EP4[:1]),
    )


def _landings(dp) -> dict:
    """Where this ruleset's connections land: per case, the backends reached."""
    out = {
        "tcp4": set(servers(dp.probe("clientA", "10.96.0.10", 80, count=40))),
        "udp4": set(servers(dp.probe("clientA", "10.96.0.70", 53, proto="udp", count=40))),
        "tcp6": set(servers(dp.probe("clientA", "fd00:96::10", 80, count=40))),
        "one": set(servers(dp.probe("pod", "10.96.0.51", 80, count=5))),
    }
    for role, dst in (("clientA", "10.96.0.50"), ("pod", "10.96.0.50"), ("clientB", "10.96.0.50"),
                      ("clientA", "fd00:96::50")):
        out[f"sticky {role} {dst}"] = len(servers(dp.probe(role, dst, 80, count=15)))
    out["ports"] = {r.server_port for r in replies(dp.probe("clientA", "10.96.0.70", 53, proto="udp", count=3))}
    return out


def test_fallback_spelling_lands_where_nftrecs_own_does(dp):
    detected = dp.spelling()
    seen = {}
    for name, spelling in (("detected", detected), ("fallback", FALLBACK)):
        script = dp.load(_inventory(), config(), spelling=spelling)
        if spelling == FALLBACK:  # really the other spelling: no shared maps, a set per endpoint
            assert "endpoint-dnat-" not in script and "affinity-clients" not in script
            assert "numgen random mod 3 map {" in script
        seen[name] = _landings(dp)
        table = dp.nft_list() + dp.nft_list("ip6")
        for client in (CLIENT_A4, CLIENT_A6):  # the affinity entry is in the kernel's set
            assert re.search(r"set affinity-[^{]*\{[^}]*elements = \{[^}]*" + re.escape(client), table), \
                f"{name}: {client} is in no affinity set"
    want = {"tcp4": set(EP4), "udp4": set(EP4), "tcp6": set(EP6), "one": {EP4[0]}, "ports": {9090}}
    for name, got in seen.items():
        assert {k: got[k] for k in want} == want, f"{name}: {got}"
        assert all(v == 1 for k, v in got.items() if k.startswith("sticky")), f"{name}: affinity broken: {got}"
    assert seen["detected"] == seen["fallback"]
    assert dp.trace_checks > 0
