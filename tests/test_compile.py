"""compile_ruleset, feature by feature, against kube-proxy's rule texts (reference §3-§7,
§12; the expected lines are kube-proxy's proxier_test.go expectations with the table
renamed to nftrec and the production mark 0x00004000)."""

from __future__ import annotations

import random

import pytest

from reconciler.compile.assemble import assemble
from reconciler.compile.parse import CompileError
from reconciler.compile.services import compile_ruleset, compile_service
from reconciler.compile.skeleton import compile_static, family_context
from reconciler.compile.topology import EndpointInfo, categorize_endpoints, endpoints_for_port
from reconciler.intake.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Inventory,
    LoadBalancerIngress,
    NodeConfig,
    Service,
    ServiceCIDR,
    ServicePort,
)
from reconciler.compile.projection import STATIC_FILLED
from reconciler.compile.render import render_script
from reconciler.compile.ruleset import NftSyntaxError, chain_id, element_id, set_id

NODE = "test-node"
# These tests check kube-proxy's exact rule texts (reference §3-§7): layout kube-proxy.
# The default layout (sharded) is checked against it in tests/test_layout.py.
KP = "kube-proxy"
CFG = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2", "2001:db8::1"), cluster_cidrs=("10.0.0.0/8", "fd00:10::/64"),
                 service_cidrs=("172.30.0.0/16", "fd00:10:96::/112"),
                 node_port_addresses=("192.168.0.2/32", "2001:db8::1/128"))
MARK = "0x00004000"


def svc(ns, name, type_="ClusterIP", ips=("172.30.0.41",), ports=None, **kw):
    return Service(ns, name, type_, tuple(ips), ports=tuple(ports or (ServicePort("p80", "TCP", 80, 80),)), **kw)


def ep(ip, node=NODE, **kw):
    return Endpoint((ip,), node_name=node, **kw)


def eps(ns, name, *endpoints, port=EndpointPort("p80", "TCP", 80), ports=None, family="IPv4", slice_name=None):
    return EndpointSlice(ns, slice_name or f"{name}-abc", name, family, tuple(endpoints), tuple(ports or (port,)))


def script(services=(), slices=(), config=CFG, cidrs=()):
    return render_script(compile_ruleset(Inventory(tuple(services), tuple(slices), tuple(cidrs)), config))


def lines(text, prefix=""):
    return [l for l in text.splitlines() if l.startswith(prefix)]


def assert_lines(text, expected):
    have = set(text.splitlines())
    missing = [l for l in expected.strip().splitlines() if l.strip() and l.strip() not in have]
    assert not missing, "missing:\n" + "\n".join(missing) + "\n--- script:\n" + text


def chain_rules(text, family, chain):
    p = f"add rule {family} nftrec {chain} "
    return [l[len(p):] for l in text.splitlines() if l.startswith(p)]


# --- the overall kube-proxy example (TestOverallNFTablesRules) --------------------------

OVERALL_SERVICES = (
    svc("ns1", "svc1", ips=("172.30.0.41",)),
    svc("ns2", "svc2", "LoadBalancer", ("172.30.0.42",), ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
        external_ips=("192.168.99.22",), load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),),
        external_traffic_policy="Local", health_check_node_port=30000),
    svc("ns3", "svc3", "NodePort", ("172.30.0.43",), ports=(ServicePort("p80", "TCP", 80, 80, 3003),)),
    svc("ns4", "svc4", "NodePort", ("172.30.0.44",), external_ips=("192.168.99.33",)),
    svc("ns5", "svc5", "LoadBalancer", ("172.30.0.45",), ports=(ServicePort("p80", "TCP", 80, 80, 3002),),
        load_balancer_ingress=(LoadBalancerIngress("5.6.7.8"),), load_balancer_source_ranges=("203.0.113.0/25",),
        session_affinity="ClientIP", affinity_timeout_seconds=10800),
    svc("ns6", "svc6", ips=("172.30.0.46",)),
)
OVERALL_SLICES = (
    eps("ns1", "svc1", ep("10.180.0.1")),
    eps("ns2", "svc2", ep("10.180.0.2", "other-node")),
    eps("ns3", "svc3", ep("10.180.0.3")),
    eps("ns4", "svc4", ep("10.180.0.4", "other-node"), ep("10.180.0.5")),
    eps("ns5", "svc5", ep("10.180.0.3")),
)

OVERALL_EXPECTED = f"""
add table ip nftrec {{ comment "rules for nftrec" ; }}
add set ip nftrec cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}
add set ip nftrec nodeport-ips {{ type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }}
add set ip nftrec hairpin-connections {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment "service hairpin connections" ; }}
add map ip nftrec firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }}
add map ip nftrec no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }}
add map ip nftrec no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }}
add map ip nftrec service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }}
add map ip nftrec service-nodeports {{ type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }}
add chain ip nftrec cluster-ips-check
add chain ip nftrec filter-prerouting-pre-dnat {{ type filter hook prerouting priority -110 ; }}
add chain ip nftrec filter-output-pre-dnat {{ type filter hook output priority -110 ; }}
add chain ip nftrec filter-forward {{ type filter hook forward priority 0 ; }}
add chain ip nftrec filter-input {{ type filter hook input priority 0 ; }}
add chain ip nftrec filter-output {{ type filter hook output priority 0 ; }}
add chain ip nftrec firewall-check
add chain ip nftrec masquerading
add chain ip nftrec nat-output {{ type nat hook output priority -100 ; }}
add chain ip nftrec nat-postrouting {{ type nat hook postrouting priority 100 ; }}
add chain ip nftrec nat-prerouting {{ type nat hook prerouting priority -100 ; }}
add chain ip nftrec nodeport-endpoints-check
add chain ip nftrec reject-chain {{ comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }}
add chain ip nftrec services
add chain ip nftrec service-endpoints-check
add rule ip nftrec cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip nftrec cluster-ips-check ip daddr {{ 172.30.0.0/16 }} drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip nftrec filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip nftrec filter-forward ct state new jump service-endpoints-check
add rule ip nftrec filter-forward ct state new jump cluster-ips-check
add rule ip nftrec filter-input ct state new jump nodeport-endpoints-check
add rule ip nftrec filter-input ct state new jump service-endpoints-check
add rule ip nftrec filter-output ct state new jump service-endpoints-check
add rule ip nftrec filter-output-pre-dnat ct state new jump firewall-check
add rule ip nftrec filter-output ct state new jump cluster-ips-check
add rule ip nftrec firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip nftrec masquerading mark and {MARK} != 0 mark set mark xor {MARK} masquerade fully-random
add rule ip nftrec masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add rule ip nftrec nat-output jump services
add rule ip nftrec nat-postrouting jump masquerading
add rule ip nftrec nat-prerouting jump services
add rule ip nftrec nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip nftrec reject-chain reject
add rule ip nftrec services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or {MARK} comment "masquerade clusterIP traffic from outside cluster"
add rule ip nftrec services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip nftrec services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
add element ip nftrec nodeport-ips {{ 192.168.0.2 }}
add rule ip nftrec service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services

add chain ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip nftrec cluster-ips {{ 172.30.0.41 }}
add element ip nftrec service-ips {{ 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }}
add element ip nftrec hairpin-connections {{ 10.180.0.1 . 10.180.0.1 . tcp . 80 }}

add chain ip nftrec service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip nftrec service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80
add chain ip nftrec external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip nftrec external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip nftrec external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or {MARK} comment "masquerade local traffic"
add rule ip nftrec external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add element ip nftrec cluster-ips {{ 172.30.0.42 }}
add element ip nftrec service-ips {{ 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }}
add element ip nftrec service-ips {{ 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }}
add element ip nftrec service-ips {{ 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }}
add element ip nftrec service-nodeports {{ tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }}
add element ip nftrec no-endpoint-nodeports {{ tcp . 3001 comment "ns2/svc2:p80" : drop }}
add element ip nftrec no-endpoint-services {{ 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }}
add element ip nftrec no-endpoint-services {{ 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }}

add chain ip nftrec service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip nftrec service-4AT6LBPK-ns3/svc3/tcp/p80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip nftrec external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip nftrec external-4AT6LBPK-ns3/svc3/tcp/p80 mark set mark or {MARK} comment "masquerade"
add rule ip nftrec external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add element ip nftrec cluster-ips {{ 172.30.0.43 }}
add element ip nftrec service-ips {{ 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }}
add element ip nftrec service-nodeports {{ tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }}
add element ip nftrec hairpin-connections {{ 10.180.0.3 . 10.180.0.3 . tcp . 80 }}

add chain ip nftrec service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip nftrec service-LAUZTJTB-ns4/svc4/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 map {{ 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }}
add chain ip nftrec external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip nftrec external-LAUZTJTB-ns4/svc4/tcp/p80 mark set mark or {MARK} comment "masquerade"
add rule ip nftrec external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add element ip nftrec cluster-ips {{ 172.30.0.44 }}
add element ip nftrec service-ips {{ 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }}
add element ip nftrec service-ips {{ 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }}
add element ip nftrec hairpin-connections {{ 10.180.0.5 . 10.180.0.5 . tcp . 80 }}

add set ip nftrec affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 {{ type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }}
add chain ip nftrec service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip nftrec service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip nftrec service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap {{ 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }}
add chain ip nftrec external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip nftrec external-HVFWP5L3-ns5/svc5/tcp/p80 mark set mark or {MARK} comment "masquerade"
add rule ip nftrec external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip nftrec endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip nftrec endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 {{ ip saddr }}
add rule ip nftrec endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip nftrec firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip nftrec firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != {{ 203.0.113.0/25 }} drop
add element ip nftrec cluster-ips {{ 172.30.0.45 }}
add element ip nftrec service-ips {{ 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }}
add element ip nftrec service-ips {{ 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }}
add element ip nftrec service-nodeports {{ tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }}
add element ip nftrec firewall-ips {{ 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }}

add element ip nftrec cluster-ips {{ 172.30.0.46 }}
add element ip nftrec no-endpoint-services {{ 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }}
"""


def test_overall_matches_kube_proxy_exactly():
    text = script(OVERALL_SERVICES, OVERALL_SLICES)
    ip_part = text.split("\n\n")[0]
    want = {l for l in OVERALL_EXPECTED.strip().splitlines() if l}
    have = set(ip_part.splitlines()) - {"delete table ip nftrec"}
    assert have == want, (sorted(have - want), sorted(want - have))
    # the hairpin element of 10.180.0.3:80 (svc3 and svc5) appears once
    assert ip_part.count("hairpin-connections { 10.180.0.3 . 10.180.0.3 . tcp . 80 }") == 1


def test_overall_owners():
    rs = compile_ruleset(Inventory(OVERALL_SERVICES, OVERALL_SLICES), CFG)
    o = rs.owners
    assert o[chain_id("ip", "service-HVFWP5L3-ns5/svc5/tcp/p80")] == "ns5/svc5"
    assert o[chain_id("ip", "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80")] == "ns5/svc5"
    assert o[set_id("ip", "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80")] == "ns5/svc5"
    assert o[element_id("ip", "service-ips", ("172.30.0.41", "tcp", "80"))] == "ns1/svc1"
    assert o[element_id("ip", "no-endpoint-services", ("172.30.0.46", "tcp", "80"))] == "ns6/svc6"
    # shared hairpin element: owned by the first Service in key order
    assert o[element_id("ip", "hairpin-connections", ("10.180.0.3", "10.180.0.3", "tcp", "80"))] == "ns3/svc3"
    for static in ("services", "filter-input", "reject-chain", "masquerading"):
        assert chain_id("ip", static) not in o
    assert set_id("ip", "service-ips") not in o
    assert element_id("ip", "nodeport-ips", ("192.168.0.2",)) not in o
    # every per-Service object has an owner
    for fam, t in rs.tables.items():
        for name in t.chains:
            assert ("/" in name) == (chain_id(fam, name) in o)
        for s in t.sets.values():
            if s.name.startswith("affinity-"):
                assert set_id(fam, s.name) in o
            elif s.name not in STATIC_FILLED:  # elements of the static part
                for k in s.elements:
                    assert element_id(fam, s.name, k) in o


def test_deterministic_independent_of_input_order():
    base = script(OVERALL_SERVICES, OVERALL_SLICES)
    rnd = random.Random(7)
    for _ in range(5):
        s, e = list(OVERALL_SERVICES), list(OVERALL_SLICES)
        rnd.shuffle(s)
        rnd.shuffle(e)
        assert script(s, e) == base


def test_fragments_union_equals_whole():
    inv = Inventory(OVERALL_SERVICES, OVERALL_SLICES)
    whole = compile_ruleset(inv, CFG)
    for order in (list(reversed(OVERALL_SERVICES)), random.Random(3).sample(OVERALL_SERVICES, len(OVERALL_SERVICES))):
        frags = [compile_service(s, OVERALL_SLICES, CFG) for s in order]
        parts = assemble(compile_static(CFG, inv), frags)[0]
        assert render_script(parts) == render_script(whole)
        assert parts.owners == whole.owners
    # each fragment holds exactly the objects its owner is recorded for, plus shared
    # elements (hairpin) that an earlier Service already owns
    for s in OVERALL_SERVICES:
        frag = compile_service(s, OVERALL_SLICES, CFG)
        for fam, ff in frag.families.items():
            for name in ff.chains:
                assert whole.owners[chain_id(fam, name)] == s.key
            for name in ff.sets:
                assert whole.owners[set_id(fam, name)] == s.key
            for (set_name, key) in ff.elements:
                owner = whole.owners[element_id(fam, set_name, key)]
                assert owner == s.key or (set_name == "hairpin-connections" and owner < s.key)


# --- firewall -------------------------------------------------------------------------------

def _lb(ranges, vips=("1.2.3.4", "5.6.7.8")):
    return svc("ns1", "svc1", "LoadBalancer", ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
               load_balancer_ingress=tuple(LoadBalancerIngress(v) for v in vips),
               load_balancer_source_ranges=tuple(ranges))


def test_firewall_node_ip_in_range_appends_vips():
    text = script([_lb(["192.168.0.0/24", "203.0.113.0/25"])], [eps("ns1", "svc1", ep("10.180.0.1"))])
    assert chain_rules(text, "ip", "firewall-ULMVA6XW-ns1/svc1/tcp/p80") == [
        "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop"]
    assert_lines(text, """
add element ip nftrec firewall-ips { 1.2.3.4 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip nftrec firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
""")
    # NodePorts are never subject to the firewall
    assert "firewall-ips { tcp . 3001" not in text


def test_firewall_without_node_ip_in_range():
    text = script([_lb(["203.0.113.0/25"])], [eps("ns1", "svc1", ep("10.180.0.1"))])
    assert chain_rules(text, "ip", "firewall-ULMVA6XW-ns1/svc1/tcp/p80") == ["ip saddr != { 203.0.113.0/25 } drop"]


def test_firewall_exists_without_endpoints_and_needs_vips():
    text = script([_lb(["203.0.113.0/25"])])
    assert "add chain ip nftrec firewall-ULMVA6XW-ns1/svc1/tcp/p80" in text
    assert "add chain ip nftrec service-ULMVA6XW" not in text
    text = script([_lb(["203.0.113.0/25"], vips=())])
    assert "firewall-ULMVA6XW" not in text


def test_lb_ipmode_proxy_is_skipped():
    s = svc("ns1", "svc1", "LoadBalancer", ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
            load_balancer_ingress=(LoadBalancerIngress("1.2.3.4", "Proxy"), LoadBalancerIngress("5.6.7.8", "VIP")))
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1"))])
    assert "1.2.3.4" not in text
    assert "add element ip nftrec service-ips { 5.6.7.8 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }" in text


# --- eTP / iTP Local ------------------------------------------------------------------------

def _etp_local(*endpoints, config=CFG):
    s = svc("ns2", "svc2", "LoadBalancer", ("172.30.0.42",), ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
            load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),), external_traffic_policy="Local")
    return script([s], [eps("ns2", "svc2", *endpoints)], config=config)


def test_etp_local_with_local_endpoint_goes_to_local_chain():
    text = _etp_local(ep("10.180.0.2"), ep("10.180.0.3", "other"))
    assert chain_rules(text, "ip", "external-42NFTM6N-ns2/svc2/tcp/p80") == [
        'ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"',
        f'fib saddr type local mark set mark or {MARK} comment "masquerade local traffic"',
        'fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"',
        "goto local-42NFTM6N-ns2/svc2/tcp/p80",
    ]
    assert chain_rules(text, "ip", "local-42NFTM6N-ns2/svc2/tcp/p80") == ["meta l4proto tcp dnat to 10.180.0.2:80"]
    assert chain_rules(text, "ip", "service-42NFTM6N-ns2/svc2/tcp/p80") == [
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.2 . 80 , 1 : 10.180.0.3 . 80 }"]
    assert "no-endpoint" not in "".join(lines(text, "add element"))


def test_etp_local_without_detector_has_no_pod_short_circuit():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), node_port_addresses=("primary",))
    text = _etp_local(ep("10.180.0.2"), config=cfg)
    rules = chain_rules(text, "ip", "external-42NFTM6N-ns2/svc2/tcp/p80")
    assert not any("short-circuit pod traffic" in r for r in rules)
    assert rules[0] == f'fib saddr type local mark set mark or {MARK} comment "masquerade local traffic"'
    # no detector, no masqueradeAll → no ClusterIP masquerade rule in services
    assert chain_rules(text, "ip", "services") == [
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"]


def test_etp_local_honoured_for_clusterip_with_external_ips():
    # apiservice.ExternalPolicyLocal: ExternallyAccessible = NodePort, LoadBalancer, *or a
    # ClusterIP Service with externalIPs*; eTP Local applies to all three.
    s = svc("ns1", "svc1", external_ips=("192.168.99.1",), external_traffic_policy="Local")
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1", "other"))])
    assert chain_rules(text, "ip", "external-ULMVA6XW-ns1/svc1/tcp/p80") == [
        'ip saddr 10.0.0.0/8 goto service-ULMVA6XW-ns1/svc1/tcp/p80 comment "short-circuit pod traffic"',
        f'fib saddr type local mark set mark or {MARK} comment "masquerade local traffic"',
        'fib saddr type local goto service-ULMVA6XW-ns1/svc1/tcp/p80 comment "short-circuit local traffic"',
    ]
    assert_lines(text, """
add element ip nftrec service-ips { 192.168.99.1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip nftrec no-endpoint-services { 192.168.99.1 . tcp . 80 comment "ns1/svc1:p80" : drop }
add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
""")
    assert "local-ULMVA6XW" not in text
    # with a local endpoint: the external chain ends in the local policy chain
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1", "other"), ep("10.180.0.2"))])
    assert chain_rules(text, "ip", "external-ULMVA6XW-ns1/svc1/tcp/p80")[-1] == "goto local-ULMVA6XW-ns1/svc1/tcp/p80"
    assert chain_rules(text, "ip", "local-ULMVA6XW-ns1/svc1/tcp/p80") == ["meta l4proto tcp dnat to 10.180.0.2:80"]
    assert "no-endpoint" not in "".join(lines(text, "add element"))
    # the externalIP of the other family only: not externally accessible in this family,
    # so no Local policy here (UsesLocalEndpoints needs ExternallyAccessible per family)
    s6 = svc("ns1", "svc1", external_ips=("2001:db8:99::1",), external_traffic_policy="Local")
    text = script([s6], [eps("ns1", "svc1", ep("10.180.0.1", "other"))])
    assert "add chain ip nftrec external-ULMVA6XW" not in text and "ip nftrec local-ULMVA6XW" not in text
    assert "add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }" in text


def test_itp_local_with_nodeport_uses_both_policy_chains():
    # iTP Local + externally accessible: UsesClusterEndpoints (external traffic) and
    # UsesLocalEndpoints (internal traffic); ClusterIP -> local-, NodePort -> external- -> service-
    s = svc("ns1", "svc1", "NodePort", ports=(ServicePort("p80", "TCP", 80, 80, 3001),), internal_traffic_policy="Local")
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1"), ep("10.180.0.2", "other"))])
    assert_lines(text, f"""
add element ip nftrec service-ips {{ 172.30.0.41 . tcp . 80 : goto local-ULMVA6XW-ns1/svc1/tcp/p80 }}
add element ip nftrec service-nodeports {{ tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }}
add rule ip nftrec local-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add rule ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 2 map {{ 0 : 10.180.0.1 . 80 , 1 : 10.180.0.2 . 80 }}
add rule ip nftrec external-ULMVA6XW-ns1/svc1/tcp/p80 mark set mark or {MARK} comment "masquerade"
add rule ip nftrec external-ULMVA6XW-ns1/svc1/tcp/p80 goto service-ULMVA6XW-ns1/svc1/tcp/p80
""")
    # no local endpoint: ClusterIP dropped, NodePort still served by the cluster chain
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.2", "other"))])
    assert_lines(text, """
add element ip nftrec no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : drop }
add element ip nftrec service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add rule ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80
""")
    assert "local-ULMVA6XW" not in text and "no-endpoint-nodeports" not in "".join(lines(text, "add element"))


def test_itp_and_etp_local_without_local_endpoints():
    s = svc("ns2", "svc2", "LoadBalancer", ("172.30.0.42",), ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
            load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),), external_traffic_policy="Local",
            internal_traffic_policy="Local")
    text = script([s], [eps("ns2", "svc2", ep("10.180.0.2", "other"))])
    assert_lines(text, """
add element ip nftrec no-endpoint-services { 172.30.0.42 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip nftrec no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip nftrec no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip nftrec service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip nftrec service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add rule ip nftrec service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80
""")
    assert "service-ips { 172.30.0.42" not in text and "local-42NFTM6N" not in text
    assert not chain_rules(text, "ip", "external-42NFTM6N-ns2/svc2/tcp/p80")[-1].startswith("goto ")


def test_itp_local():
    s = svc("ns1", "svc1", internal_traffic_policy="Local")
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1"), ep("10.180.0.2", "other"))])
    assert_lines(text, """
add chain ip nftrec local-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip nftrec local-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto local-ULMVA6XW-ns1/svc1/tcp/p80 }
""")
    assert "service-ULMVA6XW" not in text
    # no local endpoint → ClusterIP dropped (endpoints exist elsewhere)
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.2", "other"))])
    assert_lines(text, 'add element ip nftrec no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : drop }')
    assert "local-ULMVA6XW" not in text and "service-ips { 172.30.0.41" not in text


# --- masquerade ---------------------------------------------------------------------------

def test_masquerade_all_and_bit():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8",), masquerade_all=True,
                     masquerade_bit=0)
    text = script(config=cfg)
    assert chain_rules(text, "ip", "services")[0] == \
        'ip daddr @cluster-ips mark set mark or 0x00000001 comment "masquerade all clusterIP traffic"'
    assert chain_rules(text, "ip", "masquerading")[0] == \
        "mark and 0x00000001 != 0 mark set mark xor 0x00000001 masquerade fully-random"


def test_multiple_cluster_cidrs_use_anonymous_set():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8", "100.64.0.0/10"))
    s = svc("ns2", "svc2", "NodePort", ports=(ServicePort("p80", "TCP", 80, 80, 3001),), external_traffic_policy="Local")
    text = script([s], [eps("ns2", "svc2", ep("10.1.0.1"))], config=cfg)
    assert chain_rules(text, "ip", "services")[0] == (
        f"ip daddr @cluster-ips ip saddr != {{ 10.0.0.0/8, 100.64.0.0/10 }} mark set mark or {MARK} "
        'comment "masquerade clusterIP traffic from outside cluster"')
    assert chain_rules(text, "ip", "external-42NFTM6N-ns2/svc2/tcp/p80")[0].startswith(
        "ip saddr { 10.0.0.0/8, 100.64.0.0/10 } goto service-42NFTM6N-ns2/svc2/tcp/p80")


# --- no endpoints -------------------------------------------------------------------------

def test_no_endpoints_reject_everywhere():
    s = svc("ns1", "svc1", "LoadBalancer", ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
            external_ips=("192.168.99.11",), load_balancer_ingress=(LoadBalancerIngress("1.2.3.4"),))
    text = script([s])
    assert_lines(text, """
add element ip nftrec cluster-ips { 172.30.0.41 }
add element ip nftrec no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip nftrec no-endpoint-services { 192.168.99.11 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip nftrec no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip nftrec no-endpoint-nodeports { tcp . 3001 comment "ns1/svc1:p80" : goto reject-chain }
""")
    assert "ULMVA6XW" not in text  # no chains at all
    assert not lines(text, "add element ip nftrec service-ips")


def test_not_ready_not_serving_counts_as_no_endpoints():
    s = svc("ns6", "svc6", ips=("172.30.0.46",))
    text = script([s], [eps("ns6", "svc6", ep("10.180.0.1", ready=False, serving=False, terminating=True))])
    assert "no-endpoint-services { 172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain }" in text


def test_long_comment_truncated_to_128_bytes():
    ns = "loft-acme-platform-services-team-dev-v-shared-workloads-ns-001"
    name = "my-api-svc-x-my-api-namespace-x-acme-shared-vcluster--a1b2c3d4e"
    s = Service(ns, name, "ClusterIP", ("172.30.0.47",), ports=(ServicePort("http", "TCP", 80, 80),))
    text = script([s])
    assert f'comment "{ns}/{name}:h" : goto reject-chain' in text


# --- endpoint selection ---------------------------------------------------------------------

def test_serving_terminating_fallback():
    s = svc("ns1", "svc1")
    text = script([s], [eps("ns1", "svc1",
                             ep("10.180.0.1", ready=False, serving=True, terminating=True),
                             ep("10.180.0.2", ready=False, serving=False, terminating=True),
                             ep("10.180.0.3", ready=False, serving=True, terminating=True, node="other"))])
    assert chain_rules(text, "ip", "service-ULMVA6XW-ns1/svc1/tcp/p80") == [
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.3 . 80 }"]
    # a ready endpoint wins over terminating ones
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1", ready=False, serving=True, terminating=True),
                             ep("10.180.0.9", node="other"))])
    assert chain_rules(text, "ip", "service-ULMVA6XW-ns1/svc1/tcp/p80") == ["meta l4proto tcp dnat to 10.180.0.9:80"]


def test_topology_zone_hints():
    s = svc("ns1", "svc1")
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8",), zone="zone-a")
    hinted = [ep("10.180.0.1", hint_zones=("zone-a",), node="n1"), ep("10.180.0.2", hint_zones=("zone-b",), node="n2"),
              ep("10.180.0.3", hint_zones=("zone-a", "zone-c"), node="n3")]
    text = script([s], [eps("ns1", "svc1", *hinted)], config=cfg)
    assert chain_rules(text, "ip", "service-ULMVA6XW-ns1/svc1/tcp/p80") == [
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.3 . 80 }"]
    # one ready endpoint without hints → hints ignored
    text = script([s], [eps("ns1", "svc1", *hinted, ep("10.180.0.4", node="n4"))], config=cfg)
    assert "mod 4 map" in chain_rules(text, "ip", "service-ULMVA6XW-ns1/svc1/tcp/p80")[0]
    # no endpoint hinted for our zone → hints ignored
    cfg_z = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), zone="zone-z")
    text = script([s], [eps("ns1", "svc1", *hinted)], config=cfg_z)
    assert "mod 3 map" in chain_rules(text, "ip", "service-ULMVA6XW-ns1/svc1/tcp/p80")[0]


def test_duplicate_endpoint_non_terminating_wins_and_sorted():
    s = svc("ns1", "svc1")
    a = eps("ns1", "svc1", ep("10.180.0.10", ready=False, serving=True, terminating=True), slice_name="a")
    b = eps("ns1", "svc1", ep("10.180.0.10"), ep("10.180.0.9"), slice_name="b")
    infos = endpoints_for_port([a, b], "ip", s.ports[0], NODE)
    assert [(e.string, e.terminating) for e in infos] == [("10.180.0.10:80", False), ("10.180.0.9:80", False)]


def test_port_matched_by_name_and_protocol():
    s = svc("ns1", "svc1", ports=(ServicePort("dns", "UDP", 53, "dns"), ServicePort("dns-tcp", "TCP", 53, 5353)))
    sl = eps("ns1", "svc1", ep("10.180.0.1"), ports=(EndpointPort("dns", "UDP", 1053), EndpointPort("dns-tcp", "TCP", 5353),
                                                     EndpointPort("dns", "TCP", 9999)))
    text = script([s], [sl])
    assert_lines(text, """
add rule ip nftrec service-QZ3SBBQD-ns1/svc1/udp/dns meta l4proto udp dnat to 10.180.0.1:1053
add element ip nftrec service-ips { 172.30.0.41 . udp . 53 : goto service-QZ3SBBQD-ns1/svc1/udp/dns }
add element ip nftrec hairpin-connections { 10.180.0.1 . 10.180.0.1 . udp . 1053 }
""".replace("QZ3SBBQD", _hash("ns1/svc1/udp/dns")))
    assert "9999" not in text


def _hash(s):
    from reconciler.compile.naming import hash_and_truncate
    return hash_and_truncate(s)[:8]


def test_sctp_and_unnamed_port():
    s = svc("ns1", "svc1", ports=(ServicePort("", "SCTP", 3868, 3868),))
    text = script([s], [eps("ns1", "svc1", ep("10.180.0.1"), port=EndpointPort("", "SCTP", 3868))])
    h = _hash("ns1/svc1/sctp/")
    assert_lines(text, f"""
add rule ip nftrec service-{h}-ns1/svc1/sctp/ meta l4proto sctp dnat to 10.180.0.1:3868
add element ip nftrec service-ips {{ 172.30.0.41 . sctp . 3868 : goto service-{h}-ns1/svc1/sctp/ }}
""")


# --- families ---------------------------------------------------------------------------

def test_dual_stack_split():
    s = svc("ns1", "svc1", "NodePort", ips=("172.30.0.41", "fd00:10:96::41"), ip_families=("IPv4", "IPv6"),
            ports=(ServicePort("p80", "TCP", 80, 80, 3001),), external_ips=("192.168.99.1", "2001:db8:99::1"))
    sl4 = eps("ns1", "svc1", ep("10.180.0.1"))
    sl6 = eps("ns1", "svc1", ep("fd00:10:180::1"), ep("fd00:10:180::2", node="other"), family="IPv6", slice_name="v6")
    text = script([s], [sl4, sl6])
    assert_lines(text, """
add element ip nftrec service-ips { 192.168.99.1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add rule ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip6 nftrec cluster-ips { fd00:10:96::41 }
add element ip6 nftrec service-ips { fd00:10:96::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec service-ips { 2001:db8:99::1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec hairpin-connections { fd00:10:180::1 . fd00:10:180::1 . tcp . 80 }
add rule ip6 nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:180::1 . 80 , 1 : fd00:10:180::2 . 80 }
add rule ip6 nftrec services ip6 daddr @cluster-ips ip6 saddr != fd00:10::/64 mark set mark or 0x00004000 comment "masquerade clusterIP traffic from outside cluster"
add rule ip6 nftrec cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment "Drop traffic to unallocated ClusterIPs"
add element ip6 nftrec nodeport-ips { 2001:db8::1 }
""")
    ip4 = text.split("\n\n")[0]
    assert not any(":" in l.split("{", 1)[1].split(" : ")[0] for l in lines(ip4, "add element"))


def test_single_stack_service_only_in_its_family():
    s = svc("ns1", "svc1", ips=("fd00:10:96::41",), ip_families=("IPv6",))
    text = script([s], [eps("ns1", "svc1", ep("fd00:10:180::1"), family="IPv6")])
    assert "add rule ip6 nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to [fd00:10:180::1]:80" in text
    assert "add chain ip nftrec service-ULMVA6XW" not in text
    # clusterIP without ipFamilies: used only in its own family
    s = svc("ns1", "svc1", ips=("172.30.0.41",))
    text = script([s], [eps("ns1", "svc1", ep("fd00:10:180::1"), family="IPv6")])
    assert "ip6 nftrec service-ULMVA6XW" not in text
    assert "no-endpoint-services { 172.30.0.41 . tcp . 80" in text


def test_dual_stack_ipv6_primary_family_order():
    # ipFamilies [IPv6, IPv4] with clusterIPs in that order; externalIPs, LB IPs and
    # source ranges of mixed families; each family gets only its own.
    s = svc("ns1", "svc1", "LoadBalancer", ips=("fd00:10:96::41", "172.30.0.41"), ip_families=("IPv6", "IPv4"),
            ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
            external_ips=("2001:db8:99::1", "192.168.99.1"),
            load_balancer_ingress=(LoadBalancerIngress("2001:db8:5::1"), LoadBalancerIngress("5.6.7.8")),
            load_balancer_source_ranges=("2001:db8::/64", "203.0.113.0/25"))
    sl4 = eps("ns1", "svc1", ep("10.180.0.1"))
    sl6 = eps("ns1", "svc1", ep("fd00:10:180::1"), family="IPv6", slice_name="v6")
    text = script([s], [sl6, sl4])
    assert_lines(text, """
add element ip nftrec cluster-ips { 172.30.0.41 }
add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip nftrec service-ips { 192.168.99.1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip nftrec service-ips { 5.6.7.8 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip nftrec firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
add rule ip nftrec firewall-ULMVA6XW-ns1/svc1/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add rule ip nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip6 nftrec cluster-ips { fd00:10:96::41 }
add element ip6 nftrec service-ips { fd00:10:96::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec service-ips { 2001:db8:99::1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec service-ips { 2001:db8:5::1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec firewall-ips { 2001:db8:5::1 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 nftrec hairpin-connections { fd00:10:180::1 . fd00:10:180::1 . tcp . 80 }
add rule ip6 nftrec firewall-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr != { 2001:db8::/64 , 2001:db8:5::1 } drop
add rule ip6 nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to [fd00:10:180::1]:80
""")
    ip4, ip6 = text.split("\n\n")
    assert not any(":" in l.split("{", 1)[1].split(" : ")[0] for l in lines(ip4, "add element"))
    assert "10.180.0.1" not in ip6 and "172.30.0.41" not in ip6
    # an LB with only other-family source ranges is open in this family (kube-proxy filters
    # the ranges by family and needs >= 1 of them for the firewall)
    s2 = svc("ns1", "svc1", "LoadBalancer", ips=("fd00:10:96::41", "172.30.0.41"), ip_families=("IPv6", "IPv4"),
             ports=(ServicePort("p80", "TCP", 80, 80, 3001),),
             load_balancer_ingress=(LoadBalancerIngress("2001:db8:5::1"), LoadBalancerIngress("5.6.7.8")),
             load_balancer_source_ranges=("2001:db8::/64",))
    text = script([s2], [sl6, sl4])
    assert "add chain ip nftrec firewall-ULMVA6XW" not in text and "add chain ip6 nftrec firewall-ULMVA6XW" in text


def test_ipv6_affinity_endpoint_chain():
    s = svc("ns1", "svc1", ips=("fd00:10:96::41",), ip_families=("IPv6",), session_affinity="ClientIP",
            affinity_timeout_seconds=300)
    text = script([s], [eps("ns1", "svc1", ep("fd00:10:180::1"), family="IPv6")])
    assert_lines(text, """
add set ip6 nftrec affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { type ipv6_addr ; flags dynamic,timeout ; timeout 300s ; }
add rule ip6 nftrec service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add rule ip6 nftrec endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 update @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { ip6 saddr }
add rule ip6 nftrec endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80
""")


def test_headless_and_externalname_produce_nothing():
    a = Service("ns", "headless", "ClusterIP", (), ports=(ServicePort("p", "TCP", 80, 80),))
    b = Service("ns", "ext", "ExternalName", (), ports=(ServicePort("p", "TCP", 80, 80),))
    assert script([a, b]) == script([])


def test_both_tables_always_present():
    text = script(config=NodeConfig(NODE, layout=KP))
    assert "add table ip nftrec" in text and "add table ip6 nftrec" in text


# --- nodePortAddresses and service CIDRs --------------------------------------------------

def test_nodeport_match_all():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2",), node_port_addresses=("0.0.0.0/0", "::/0"))
    text = script(config=cfg)
    assert "nodeport-ips" not in text
    assert chain_rules(text, "ip", "services")[-1] == \
        "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
    assert chain_rules(text, "ip6", "nodeport-endpoints-check") == \
        ["ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports"]


def test_nodeport_cidrs_pick_node_ips():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2", "192.168.1.2", "10.9.9.9", "127.0.0.1", "2001:db8::1"),
                     node_port_addresses=("192.168.0.0/16", "127.0.0.0/8"))
    text = script(config=cfg)
    assert lines(text, "add element ip nftrec nodeport-ips") == [
        "add element ip nftrec nodeport-ips { 192.168.0.2 }", "add element ip nftrec nodeport-ips { 192.168.1.2 }"]
    # no IPv6 CIDR given → IPv6 matches all (kube-proxy)
    assert "add set ip6 nftrec nodeport-ips" not in text


def test_nodeport_primary():
    cfg = NodeConfig(NODE, layout=KP, node_ips=("192.168.0.2", "192.168.1.2"), node_port_addresses=("primary",))
    text = script(config=cfg)
    assert lines(text, "add element ip nftrec nodeport-ips") == ["add element ip nftrec nodeport-ips { 192.168.0.2 }"]
    # primary with no IPv6 node IP: empty set (no IPv6 NodePorts), not match-all
    assert "add set ip6 nftrec nodeport-ips" in text
    assert not lines(text, "add element ip6 nftrec nodeport-ips")
    assert family_context(cfg, "ip6").nodeport_match_all is False


def test_service_cidrs_from_config_and_objects():
    cfg = NodeConfig(NODE, layout=KP, service_cidrs=("172.30.0.0/16",))
    text = script(config=cfg, cidrs=[ServiceCIDR("b", ("10.96.0.0/12", "fd00:96::/112")), ServiceCIDR("a", ("172.30.0.0/17",))])
    assert chain_rules(text, "ip", "cluster-ips-check")[1] == \
        'ip daddr { 10.96.0.0/12,172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"'
    assert chain_rules(text, "ip6", "cluster-ips-check")[1].startswith("ip6 daddr { fd00:96::/112 } drop")
    assert len(chain_rules(script(config=NodeConfig(NODE, layout=KP)), "ip", "cluster-ips-check")) == 1


# --- categorize_endpoints ----------------------------------------------------------------

def E(ip, ready=True, serving=True, terminating=False, local=False, zones=()):
    return EndpointInfo(ip, 80, ready, serving, terminating, local, frozenset(zones))


def ips(eps_):
    return None if eps_ is None else [e.ip for e in eps_]


def test_categorize_cluster_only():
    c = categorize_endpoints([E("1"), E("2", ready=False), E("3", local=True)], uses_cluster=True, uses_local=False, zone="")
    assert ips(c.cluster) == ["1", "3"] and c.local is None and ips(c.all_reachable) == ["1", "3"] and c.has_any


def test_categorize_local_only():
    c = categorize_endpoints([E("1"), E("2", local=True)], uses_cluster=False, uses_local=True, zone="")
    assert c.cluster is None and ips(c.local) == ["2"] and ips(c.all_reachable) == ["2"] and c.has_any
    c = categorize_endpoints([E("1")], uses_cluster=False, uses_local=True, zone="")
    assert ips(c.local) == [] and c.has_any and ips(c.all_reachable) == []


def test_categorize_local_serving_terminating_fallback_unions():
    eps_ = [E("1"), E("2", ready=False, terminating=True, local=True)]
    c = categorize_endpoints(eps_, uses_cluster=True, uses_local=True, zone="")
    assert ips(c.cluster) == ["1"] and ips(c.local) == ["2"] and ips(c.all_reachable) == ["1", "2"]


def test_categorize_topology_union():
    eps_ = [E("1", zones=("a",)), E("2", zones=("b",), local=True)]
    c = categorize_endpoints(eps_, uses_cluster=True, uses_local=True, zone="a")
    assert ips(c.cluster) == ["1"] and ips(c.local) == ["2"] and ips(c.all_reachable) == ["1", "2"]


def test_categorize_nothing_usable():
    c = categorize_endpoints([E("1", ready=False, serving=False, terminating=True)],
                             uses_cluster=True, uses_local=True, zone="")
    assert not c.has_any and ips(c.cluster) == [] and ips(c.local) == []
    assert categorize_endpoints([], uses_cluster=True, uses_local=False, zone="") .has_any is False


def test_categorize_serving_not_terminating_is_not_a_fallback():
    c = categorize_endpoints([E("1", ready=False, serving=True, terminating=False)],
                             uses_cluster=True, uses_local=False, zone="")
    assert not c.has_any


# --- refusing bad input -------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    dict(cluster_ips=("172.30.0.1; flush ruleset",)),
    dict(external_ips=("fe80::1%eth0",)),
    dict(ports=(ServicePort("p", "ICMP", 80, 80),)),
    dict(ports=(ServicePort("p", "TCP", 0, 80),)),
    dict(ports=(ServicePort("a/b", "TCP", 80, 80),)),
    dict(namespace="a b"),
])
def test_refuses_unsafe(bad):
    base = dict(namespace="ns", name="svc", type="ClusterIP", cluster_ips=("172.30.0.1",),
                ports=(ServicePort("p", "TCP", 80, 80),))
    base.update(bad)
    with pytest.raises(NftSyntaxError):
        compile_ruleset(Inventory((Service(**base),)), CFG)


def test_compile_error_is_nft_syntax_error():
    assert issubclass(CompileError, NftSyntaxError)


def test_no_node_name_means_no_local_endpoints():
    # endpointslicecache.isLocal: len(nodeName) > 0 && nodeName == endpoint.nodeName
    s = svc("ns1", "svc1")
    infos = endpoints_for_port([eps("ns1", "svc1", ep("10.180.0.1", node=""))], "ip", s.ports[0], "")
    assert [e.is_local for e in infos] == [False]


def test_property_fragments_union_owners_and_determinism():
    """Over random inventories: compile_service fragments (in any order) assemble to
    exactly compile_ruleset, every per-Service object has an owner, and input order
    does not matter."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_kernel_accepts import configs, inventories

    from reconciler.compile.layout import AFFINITY_SET, HAIRPIN_VMAP, hairpin_chain_of, is_hairpin_shard

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(inventories(), configs(), st.randoms(use_true_random=False))
    def check(inv, cfg, rnd):
        whole = compile_ruleset(inv, cfg)
        svcs = list(inv.services)
        rnd.shuffle(svcs)
        frags = [compile_service(s, inv.endpoint_slices, cfg) for s in svcs]
        parts = assemble(compile_static(cfg, inv), frags)[0]
        assert render_script(parts) == render_script(whole)
        assert parts.owners == whole.owners
        sl = list(inv.endpoint_slices)
        rnd.shuffle(sl)
        shuffled = compile_ruleset(Inventory(tuple(svcs), tuple(sl), inv.service_cidrs), cfg)
        assert render_script(shuffled) == render_script(whole) and shuffled.owners == whole.owners
        keys = {s.key for s in inv.services}
        for fam, t in whole.tables.items():
            for name in t.chains:
                assert ("/" in name) == (chain_id(fam, name) in whole.owners)
            for s in t.sets.values():
                if s.name == AFFINITY_SET:  # shared (sharded layout), filled by the kernel
                    assert set_id(fam, s.name) not in whole.owners and not s.elements
                elif s.name.startswith("affinity-"):
                    assert whole.owners[set_id(fam, s.name)] in keys
                elif s.name == HAIRPIN_VMAP:  # one element per shard that holds one: no owner
                    assert {v.value for v in s.elements.values()} == {
                        f"goto {hairpin_chain_of(n)}" for n in t.sets if is_hairpin_shard(n)}
                elif s.name not in STATIC_FILLED:  # elements of the static part
                    assert s.elements or not is_hairpin_shard(s.name)  # a shard exists while it holds one
                    for k in s.elements:
                        assert whole.owners[element_id(fam, s.name, k)] in keys

    check()


def test_property_patch_equals_assemble_or_leaves_the_ruleset_alone():
    """Over random inventories and random edits (Services dropped, renamed, their slices
    cut): assemble.patch of the changed Services' fragments into the assembled ruleset
    is exactly compile_ruleset(edited, previous=it), allocation included; where patch
    declines, the ruleset it was given is as it was."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_kernel_accepts import configs, inventories

    from reconciler.compile import allocation_of, digest
    from reconciler.compile.assemble import patch

    patched = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(inventories(), configs(), st.randoms(use_true_random=False))
    def check(inv, cfg, rnd):
        import dataclasses

        svcs = [s for s in inv.services if rnd.random() < 0.8]
        svcs = [dataclasses.replace(s, name=s.name + "-b") if rnd.random() < 0.1 else s for s in svcs]
        slices = [dataclasses.replace(sl, endpoints=sl.endpoints[:rnd.randrange(len(sl.endpoints) + 1)])
                  if rnd.random() < 0.3 else sl for sl in inv.endpoint_slices if rnd.random() < 0.9]
        edited = Inventory(tuple(svcs), tuple(slices), inv.service_cidrs)
        before = {s.key: compile_service(s, inv.endpoint_slices, cfg) for s in inv.services}
        after = {s.key: compile_service(s, edited.endpoint_slices, cfg) for s in edited.services}
        rs, alloc, shared = assemble(compile_static(cfg, inv), before.values())
        was = digest(rs)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        got = patch(rs, alloc, [before[k] for k in changed if k in before],
                    [after[k] for k in changed if k in after], shared)
        if got is None:
            assert digest(rs) == was
            return
        want = compile_ruleset(edited, cfg, previous=compile_ruleset(inv, cfg))
        assert rs == want and rs.owners == want.owners and digest(rs) == digest(want)
        assert got == allocation_of(want)
        patched.append(bool(changed))

    check()
    assert any(patched)  # some examples did patch a change


def test_with_elements_copies_every_field_of_a_named_set():
    """NamedSet.with_elements is dataclasses.replace(…, elements=…) written out (speed):
    a field added to NamedSet and not to it fails here."""
    import dataclasses

    from reconciler.compile.ruleset import Element, NamedSet

    s = NamedSet("affinity-clients", "ip saddr . numgen random mod 1", "verdict", ("dynamic", "timeout"), 600,
                 "a comment", {("1.2.3.4",): Element(("1.2.3.4",))}, True, 4096)
    assert {f.name for f in dataclasses.fields(NamedSet)} == {
        "name", "type", "value_type", "flags", "timeout", "comment", "elements", "typeof", "size"}
    new = {("5.6.7.8",): Element(("5.6.7.8",))}
    assert s.with_elements(new) == dataclasses.replace(s, elements=new) and s.with_elements(new).elements is new
