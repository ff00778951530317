"""Self-checks of the data-plane harness, independent of nftrec's compiler.

A hand-written tiny nft DNAT ruleset proves that the topology, the echo servers, the
probe's error classification and the conntrack witness work, so that a failure in
test_kube_proxy_semantics.py points at the compiler, not at the harness.
"""

from __future__ import annotations

import pytest

from dp_topology import (CLIENT_A4, CLIENT_A6, EP4, EP6, NODE_BE4, NODE_IP4, POD4)

pytestmark = pytest.mark.dataplane

HAND_RULESET = f"""
table ip nftrec {{
    chain pre {{
        type nat hook prerouting priority -100;
        ip daddr 10.96.0.10 tcp dport 80 dnat to numgen random mod 3 map {{ 0 : {EP4[0]}, 1 : {EP4[1]}, 2 : {EP4[2]} }} : 8080
        ip daddr 10.96.0.11 udp dport 53 dnat to {EP4[1]}:9090
        ip daddr 10.96.0.12 tcp dport 80 meta mark set 0x4000 dnat to {EP4[2]}:8080
    }}
    chain filt {{
        type filter hook forward priority 0;
        ip daddr 10.96.0.20 reject
        ip daddr 10.96.0.21 drop
    }}
    chain post {{
        type nat hook postrouting priority 100;
        meta mark & 0x4000 != 0 masquerade
    }}
}}
table ip6 nftrec {{
    chain pre {{
        type nat hook prerouting priority -100;
        ip6 daddr fd00:96::10 tcp dport 80 dnat to [{EP6[0]}]:8080
    }}
}}
"""


def test_harness_direct_and_sink(dp):
    """Without any nftrec table: endpoints are reachable directly, with the client's
    own source address; service addresses hit the upstream sink (ICMP unreachable)."""
    r = dp.probe_one("clientA", EP4[0], 8080)
    assert r.reply and r.reply.server_ip == EP4[0] and r.reply.peer_ip == CLIENT_A4, r
    r = dp.probe_one("clientA", EP6[1], 9090, proto="udp")
    assert r.reply and r.reply.server_ip == EP6[1] and r.reply.peer_ip == CLIENT_A6, r
    r = dp.probe_one("pod", EP4[2], 8080)
    assert r.reply and r.reply.peer_ip == POD4, r
    assert dp.probe_one("clientA", "10.96.0.10", 80).error == "unreachable"
    assert dp.probe_one("clientA", "fd00:96::10", 80).error == "unreachable"
    assert dp.probe_one("clientA", "10.96.0.10", 80, proto="udp").error == "unreachable"
    # the node itself reaches the endpoints too (host-originated traffic)
    r = dp.probe_one("node", EP4[0], 8080)
    assert r.reply and r.reply.server_ip == EP4[0], r


def test_harness_hand_written_dnat(dp):
    dp.load_script(HAND_RULESET, tables=("nftrec",))
    results = dp.probe("clientA", "10.96.0.10", 80, count=40)
    assert all(r.reply for r in results), results
    assert {r.reply.server_ip for r in results} == set(EP4)
    assert {r.reply.peer_ip for r in results} == {CLIENT_A4}  # not masqueraded
    # conntrack witness: entries with the ClusterIP as original destination
    flows = dp.conntrack("-p", "tcp", "--orig-dst", "10.96.0.10")
    assert {f.reply_src for f in flows} == set(EP4), flows

    r = dp.probe_one("clientA", "10.96.0.11", 53, proto="udp")
    assert r.reply and r.reply.server_ip == EP4[1] and r.reply.server_port == 9090, r

    r = dp.probe_one("clientA", "10.96.0.12", 80)
    assert r.reply and r.reply.peer_ip == NODE_BE4, r  # masqueraded to the node
    flows = dp.conntrack("-p", "tcp", "--orig-dst", "10.96.0.12")
    assert flows and {f.reply_dst for f in flows} == {NODE_BE4}, flows

    assert dp.probe_one("clientA", "10.96.0.20", 80).error == "refused"
    assert dp.probe_one("clientA", "10.96.0.20", 80, proto="udp").error == "refused"
    assert dp.probe_one("clientA", "10.96.0.21", 80).error == "timeout"
    assert dp.probe_one("clientA", "10.96.0.21", 80, proto="udp").error == "timeout"

    r = dp.probe_one("clientA", "fd00:96::10", 80)
    assert r.reply and r.reply.server_ip == EP6[0] and r.reply.peer_ip == CLIENT_A6, r
    # NodePort-style: the node IP is local to the node, DNAT still applies in prerouting
    assert dp.probe_one("clientA", NODE_IP4, 80).error == "refused"  # nothing listens there
