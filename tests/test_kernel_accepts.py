"""The real nft parser/kernel accepts every ruleset the compiler can produce.

Hypothesis builds random valid Inventories (Services of every type and policy, slices
with random conditions, both families) and NodeConfigs; each rendered script must pass
`nft -c -f` inside a throwaway user+net namespace. One rich script is then loaded for
real into a netns, listed, and loaded again (the add/delete/add preamble makes it
idempotent)."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsutil import in_ns, nft_scratch, nft_spelling
from reconciler.compile.services import compile_ruleset
from reconciler.intake.model import (
    Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, NftSpelling, NodeConfig, Service,
    ServiceCIDR, ServicePort,
)
from reconciler.compile.render import render_script

pytestmark = pytest.mark.kernel

NODE = "node-a"
V4 = {"cluster": "172.30.{}.{}", "ext": "192.168.99.{}", "lb": "5.6.7.{}", "ep": "10.{}.0.{}", "node": "192.168.0.{}"}
V6 = {"cluster": "fd00:96::{:x}:{:x}", "ext": "2001:db8:99::{:x}", "lb": "2001:db8:5::{:x}",
      "ep": "fd00:10:{:x}::{:x}", "node": "2001:db8::{:x}"}

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
octet = st.integers(1, 254)


def _ip(fam, kind, *nums):
    return (V4 if fam == 4 else V6)[kind].format(*nums)


@st.composite
def endpoint(draw, fam):
    ready = draw(st.booleans())
    return Endpoint(
        (_ip(fam, "ep", draw(st.integers(1, 3)), draw(octet)),),
        ready=ready,
        serving=ready or draw(st.booleans()),
        terminating=(not ready) and draw(st.booleans()),
        node_name=draw(st.sampled_from([NODE, "node-b", None])),
        zone=draw(st.sampled_from([None, "z1", "z2"])),
        hint_zones=draw(st.sampled_from([None, ("z1",), ("z2",), ("z1", "z2")])),
        hint_nodes=draw(st.sampled_from([None, None, (NODE,), ("node-b",), ("node-b", NODE)])),
    )


@st.composite
def service_with_slices(draw, idx):
    ns = draw(names)
    name = f"svc{idx}-{draw(names)}"
    fams = draw(st.sampled_from([(4,), (6,), (4, 6), (6, 4)]))
    # externalIPs/LB IPs/source ranges may be of a family the Service has no clusterIP in
    ip_fams = draw(st.sampled_from([fams, (4, 6)]))
    type_ = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    nports = draw(st.integers(1, 3))
    ports = []
    for i in range(nports):
        proto = draw(st.sampled_from(["TCP", "UDP", "SCTP"]))
        node_port = 30000 + idx * 10 + i if type_ != "ClusterIP" else 0
        ports.append(ServicePort("" if nports == 1 and draw(st.booleans()) else f"p{i}",
                                 proto, draw(st.integers(1, 65535)), draw(st.integers(1, 65535)), node_port))
    cluster_ips = tuple(_ip(f, "cluster", idx // 250, idx % 250 + 1) for f in fams)
    ext = tuple(_ip(f, "ext", draw(octet)) for f in ip_fams if draw(st.booleans()))
    lb = ()
    ranges = ()
    if type_ == "LoadBalancer":
        lb = tuple(LoadBalancerIngress(_ip(f, "lb", draw(octet)), draw(st.sampled_from([None, "VIP", "Proxy"])))
                   for f in ip_fams for _ in range(draw(st.integers(0, 2))))
        ranges = tuple(draw(st.lists(st.sampled_from(
            ["203.0.113.0/25", "192.168.0.0/24", "2001:db8::/64", "0.0.0.0/0", "2001:db8:abcd::/48"]),
            max_size=3, unique=True)))
    svc = Service(
        ns, name, type_, cluster_ips, tuple("IPv4" if f == 4 else "IPv6" for f in fams), tuple(ports),
        external_ips=ext, load_balancer_source_ranges=ranges, load_balancer_ingress=lb,
        external_traffic_policy=draw(st.sampled_from(["Cluster", "Local"])),
        internal_traffic_policy=draw(st.sampled_from(["Cluster", "Local"])),
        session_affinity=draw(st.sampled_from(["None", "ClientIP"])),
        affinity_timeout_seconds=draw(st.integers(1, 86400)),
        traffic_distribution=draw(st.sampled_from([None, "PreferClose", "PreferSameZone", "PreferSameNode"])),
    )
    slices = []
    for f in fams:
        for j in range(draw(st.integers(0, 2))):
            eps = tuple(draw(st.lists(endpoint(f), max_size=4)))
            sports = tuple(EndpointPort(p.name, p.protocol, draw(st.integers(1, 65535))) for p in ports
                           if draw(st.booleans()) or j == 0)
            slices.append(EndpointSlice(ns, f"{name}-{f}-{j}", name, "IPv4" if f == 4 else "IPv6", eps, sports))
    return svc, slices


@st.composite
def inventories(draw):
    n = draw(st.integers(0, 6))
    services, slices = [], []
    for i in range(n):
        s, sl = draw(service_with_slices(i))
        services.append(s)
        slices += sl
    cidrs = tuple(ServiceCIDR(f"c{i}", (c,)) for i, c in enumerate(
        draw(st.lists(st.sampled_from(["172.30.0.0/16", "10.96.0.0/12", "fd00:96::/64"]), max_size=2, unique=True))))
    return Inventory(tuple(services), tuple(slices), cidrs)


@st.composite
def configs(draw):
    return NodeConfig(
        NODE,
        node_ips=tuple(draw(st.lists(st.sampled_from(["192.168.0.2", "192.168.0.3", "2001:db8::1", "127.0.0.1"]),
                                     max_size=3, unique=True))),
        cluster_cidrs=tuple(draw(st.lists(st.sampled_from(["10.0.0.0/8", "100.64.0.0/10", "fd00:10::/48"]),
                                          max_size=3, unique=True))),
        service_cidrs=tuple(draw(st.lists(st.sampled_from(["172.30.0.0/16", "fd00:96::/64"]), max_size=2, unique=True))),
        node_port_addresses=draw(st.sampled_from([("primary",), ("0.0.0.0/0",), ("0.0.0.0/0", "::/0"),
                                                  ("192.168.0.0/24",), ("192.168.0.0/16", "2001:db8::/32"), ()])),
        masquerade_all=draw(st.booleans()),
        masquerade_bit=draw(st.integers(0, 31)),
        zone=draw(st.sampled_from(["", "z1", "z2"])),
        derive_topology_hints=draw(st.booleans()),
        layout=draw(st.sampled_from(["sharded", "kube-proxy"])),
    )


@st.composite
def spellings(draw):
    """Any spelling this nft accepts: kube-proxy's on every nft, nftrec's own where the
    probe found it."""
    return NftSpelling(index_maps=draw(st.booleans()) and nft_spelling().index_maps,
                       shared_affinity=draw(st.booleans()) and nft_spelling().shared_affinity)


def _nft_check(script: str) -> None:
    nft_scratch(script, check_only=True)


# CI-friendly default; a deeper local run: NFTREC_KERNEL_EXAMPLES=300 pytest tests/test_kernel_accepts.py
MAX_EXAMPLES = int(os.environ.get("NFTREC_KERNEL_EXAMPLES", "60"))


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(inventories(), configs(), spellings())
def test_kernel_accepts_random_rulesets(inventory, config, spelling):
    script = render_script(compile_ruleset(inventory, replace(config, spelling=spelling)))
    _nft_check(script)


# --- one rich script, loaded for real -----------------------------------------------------

def rich_inventory() -> tuple[Inventory, NodeConfig]:
    from test_compile import OVERALL_SERVICES, OVERALL_SLICES
    extra = (
        Service("dual", "web", "LoadBalancer", ("172.30.1.1", "fd00:96::1"), ("IPv4", "IPv6"),
                (ServicePort("http", "TCP", 80, "http", 31080), ServicePort("dns", "UDP", 53, 53, 31053),
                 ServicePort("sig", "SCTP", 3868, 3868, 31868)),
                external_ips=("192.168.99.7", "2001:db8:99::7"),
                load_balancer_source_ranges=("192.168.0.0/24", "192.168.0.5/32", "2001:db8::/64"),
                load_balancer_ingress=(LoadBalancerIngress("192.168.0.5"), LoadBalancerIngress("2001:db8::5")),
                external_traffic_policy="Local", session_affinity="ClientIP", affinity_timeout_seconds=60),
        Service("dual", "itp", "ClusterIP", ("172.30.1.2",), ports=(ServicePort("p", "TCP", 81, 81),),
                internal_traffic_policy="Local"),
    )
    eps4 = tuple(Endpoint((f"10.2.0.{i}",), ready=i != 3, serving=True, terminating=i == 3,
                          node_name=NODE if i % 2 else "node-b") for i in range(1, 5))
    eps6 = tuple(Endpoint((f"fd00:10:2::{i}",), node_name=NODE if i % 2 else "node-b") for i in range(1, 4))
    ports = (EndpointPort("http", "TCP", 8080), EndpointPort("dns", "UDP", 5353), EndpointPort("sig", "SCTP", 3868))
    slices = (EndpointSlice("dual", "web-4", "web", "IPv4", eps4, ports),
              EndpointSlice("dual", "web-6", "web", "IPv6", eps6, ports),
              EndpointSlice("dual", "itp-4", "itp", "IPv4", eps4[:2], (EndpointPort("p", "TCP", 81),)))
    cfg = NodeConfig(NODE, node_ips=("192.168.0.2", "2001:db8::1"), cluster_cidrs=("10.0.0.0/8", "fd00:10::/48"),
                     service_cidrs=("172.30.0.0/16",), node_port_addresses=("primary",), spelling=nft_spelling())
    return Inventory(OVERALL_SERVICES + extra, OVERALL_SLICES + slices,
                     (ServiceCIDR("v6", ("fd00:96::/64",)),)), cfg


def test_rich_script_loads_lists_and_reloads(netns, tmp_path):
    inv, cfg = rich_inventory()
    script = render_script(compile_ruleset(inv, cfg))
    path = tmp_path / "rich.nft"
    path.write_text(script)
    in_ns(netns, "nft", "-f", str(path))
    first = in_ns(netns, "nft", "list", "table", "ip", "nftrec").stdout
    first6 = in_ns(netns, "nft", "list", "table", "ip6", "nftrec").stdout
    assert "service-HVFWP5L3-ns5/svc5/tcp/p80" in first
    assert "set affinity-" in first6
    # nft before 1.0 lists a protocol by its number
    assert re.search(r"meta l4proto (udp|17) dnat to \[fd00:10:2::1\]:5353", first6)
    # a foreign table survives, and a second load is idempotent
    in_ns(netns, "nft", "add", "table", "inet", "other")
    in_ns(netns, "nft", "-f", str(path))
    assert in_ns(netns, "nft", "list", "table", "ip", "nftrec").stdout == first
    assert in_ns(netns, "nft", "list", "table", "ip6", "nftrec").stdout == first6
    assert "table inet other" in in_ns(netns, "nft", "list", "tables").stdout
