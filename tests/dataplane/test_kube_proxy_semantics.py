"""kube-proxy's nftables semantics, proven with real packets.

Each test builds model objects in Python, compiles them with
`reconciler.compile.services.compile_ruleset`, renders with `reconciler.compile.render.render_script`,
loads the script into the node namespace (`nft -f`) and sends real TCP/UDP traffic
from the client / pod / node namespaces to the echo servers behind the node. The
topology and its addresses are described in dp_topology.py.

Error kinds seen by the probe: "refused" = a reject (RST / ICMP port unreachable),
"timeout" = a drop, "unreachable" = the packet left the node un-DNATed and hit the
upstream sink (i.e. the node did nothing with it).
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from dp_topology import (
    CLIENT_A4, CLIENT_B4, CLUSTER_CIDR4, CLUSTER_CIDR6, EP4, EP6, NODE_BE4,
    NODE_BE6, NODE_IP4, NODE_IP6, NODE_LISTEN_PORT, NODE_NAME, POD4, POD6, SERVICE_CIDR4,
    SERVICE_CIDR6, nsx,
)
from reconciler.intake.model import (
    Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, NodeConfig,
    Service, ServiceCIDR, ServicePort,
)

pytestmark = pytest.mark.dataplane

NS = "default"
REMOTE_NODE = "node-b"
LB_IP = "203.0.113.10"
LB_IP_LOCAL = "203.0.113.11"
EXTERNAL_IP = "203.0.113.20"
LB_IP_EMPTY = "203.0.113.12"
LB_IP6 = "fd00:cafe::10"


# --- model builders ------------------------------------------------------------------------


def config(**kw) -> NodeConfig:
    base = dict(node_name=NODE_NAME, node_ips=(NODE_IP4, NODE_IP6),
                cluster_cidrs=(CLUSTER_CIDR4, CLUSTER_CIDR6),
                service_cidrs=(SERVICE_CIDR4, SERVICE_CIDR6))
    base.update(kw)
    return NodeConfig(**base)


def sport(port: int, target: int, proto: str = "TCP", node_port: int = 0, name: str = "") -> ServicePort:
    return ServicePort(name=name, protocol=proto, port=port, target_port=target, node_port=node_port)


def service(name: str, cluster_ips: tuple[str, ...], *ports: ServicePort, type: str = "ClusterIP",
            **kw) -> Service:
    fams = tuple("IPv6" if ":" in ip else "IPv4" for ip in cluster_ips)
    return Service(namespace=NS, name=name, type=type, cluster_ips=cluster_ips,
                   ip_families=fams, ports=ports, **kw)


def eps(svc: str, ips: tuple[str, ...], ports: tuple[EndpointPort, ...] = (EndpointPort("", "TCP", 8080),),
        node: str | tuple[str, ...] = NODE_NAME, suffix: str = "") -> EndpointSlice:
    """One EndpointSlice of `svc` with `ips` (nodeName per endpoint or for all)."""
    nodes = node if isinstance(node, tuple) else (node,) * len(ips)
    family = "IPv6" if ips and ":" in ips[0] else "IPv4"
    return EndpointSlice(
        namespace=NS, name=f"{svc}-{family.lower()}{suffix}", service_name=svc,
        address_type=family,
        endpoints=tuple(Endpoint(addresses=(ip,), node_name=n) for ip, n in zip(ips, nodes)),
        ports=ports)


def inv(*objs) -> Inventory:
    return Inventory(
        services=tuple(o for o in objs if isinstance(o, Service)),
        endpoint_slices=tuple(o for o in objs if isinstance(o, EndpointSlice)),
        service_cidrs=tuple(o for o in objs if isinstance(o, ServiceCIDR)),
    )


# --- assertion helpers ---------------------------------------------------------------------


def replies(results) -> list:
    bad = [r for r in results if r.reply is None]
    assert not bad, f"{len(bad)}/{len(results)} attempts failed: {results}"
    return [r.reply for r in results]


def servers(results) -> Counter:
    return Counter(r.server_ip for r in replies(results))


def peers(results) -> set[str]:
    return {r.peer_ip for r in replies(results)}


def errors(results) -> set[str]:
    return {r.error for r in results}


# --- 1. ClusterIP ----------------------------------------------------------------------------


def test_clusterip_spreads_over_all_endpoints(dp):
    """ClusterIP with 3 endpoints: new connections are spread randomly over all of them,
    DNATed to the endpoint's targetPort; host-originated traffic works too (nat-output)."""
    dp.load(inv(service("web", ("10.96.0.10",), sport(80, 8080)), eps("web", EP4)), config())
    res = dp.probe("clientA", "10.96.0.10", 80, count=60)
    seen = servers(res)
    assert set(seen) == set(EP4), f"endpoints reached: {seen}"
    assert {r.server_port for r in replies(res)} == {8080}
    # host-originated (node namespace) traffic is DNATed in nat-output
    assert set(servers(dp.probe("node", "10.96.0.10", 80, count=10))) <= set(EP4)
    flows = dp.conntrack("-p", "tcp", "--orig-dst", "10.96.0.10")
    assert {f.reply_src for f in flows} == set(EP4), flows
    assert {f.reply_sport for f in flows} == {8080}, flows


# --- 2. NodePort -------------------------------------------------------------------------------


def test_nodeport_reaches_endpoint_on_node_ip_only(dp):
    """NodePort: node IP:nodePort is DNATed to an endpoint. With nodePortAddresses
    [primary] only the primary node IP accepts it: the same port on another local
    address of the node is not DNATed (nothing listens there → RST)."""
    dp.load(inv(service("np", ("10.96.0.20",), sport(80, 8080, node_port=30080), type="NodePort"),
                eps("np", EP4)), config())
    assert set(servers(dp.probe("clientA", NODE_IP4, 30080, count=10))) <= set(EP4)
    assert set(servers(dp.probe("clientB", NODE_IP4, 30080, count=3))) <= set(EP4)
    # 198.51.100.129 is the node's address on clientB's link: not a NodePort address
    assert errors(dp.probe("clientB", "198.51.100.129", 30080)) == {"refused"}
    # the ClusterIP of the NodePort Service works as well
    assert set(servers(dp.probe("clientA", "10.96.0.20", 80, count=3))) <= set(EP4)


def test_nodeport_all_addresses(dp):
    """nodePortAddresses 0.0.0.0/0: every local address of the node accepts the NodePort."""
    dp.load(inv(service("np", ("10.96.0.20",), sport(80, 8080, node_port=30080), type="NodePort"),
                eps("np", EP4)),
            config(node_port_addresses=("0.0.0.0/0", "::/0")))
    assert set(servers(dp.probe("clientB", "198.51.100.129", 30080, count=3))) <= set(EP4)
    assert set(servers(dp.probe("clientA", NODE_IP4, 30080, count=3))) <= set(EP4)


# --- 3. LoadBalancer source ranges ----------------------------------------------------------


def test_loadbalancer_source_ranges(dp):
    """loadBalancerSourceRanges admit client A (198.51.100.0/25) and not client B: A
    connects to the LB IP, B's packets are dropped before DNAT (never confirmed in
    conntrack). The NodePort of the same Service is not firewalled."""
    svc = service("lb", ("10.96.0.30",), sport(80, 8080, node_port=30081), type="LoadBalancer",
                  load_balancer_ingress=(LoadBalancerIngress(LB_IP),),
                  load_balancer_source_ranges=("198.51.100.0/25",))
    dp.load(inv(svc, eps("lb", EP4)), config())
    assert set(servers(dp.probe("clientA", LB_IP, 80, count=5))) <= set(EP4)
    assert errors(dp.probe("clientB", LB_IP, 80, timeout=1.0)) == {"timeout"}
    assert dp.conntrack("--orig-src", CLIENT_B4, "--orig-dst", LB_IP) == []
    assert {f.reply_src for f in dp.conntrack("--orig-src", CLIENT_A4, "--orig-dst", LB_IP)} <= set(EP4)
    assert dp.conntrack("--orig-src", CLIENT_A4, "--orig-dst", LB_IP)
    # NodePorts are never subject to the firewall
    assert set(servers(dp.probe("clientB", NODE_IP4, 30081, count=2))) <= set(EP4)


def test_loadbalancer_source_ranges_ipv6(dp):
    """The same for IPv6: fd00:a::/64 (client A) admitted, client B (fd00:b::2) dropped."""
    svc = service("lb6", ("10.96.0.31", "fd00:96::31"), sport(80, 8080, node_port=30084),
                  type="LoadBalancer", load_balancer_ingress=(LoadBalancerIngress(LB_IP6),),
                  load_balancer_source_ranges=("fd00:a::/64",))
    dp.load(inv(svc, eps("lb6", EP4), eps("lb6", EP6)), config())
    assert set(servers(dp.probe("clientA", LB_IP6, 80, count=3))) <= set(EP6)
    assert errors(dp.probe("clientB", LB_IP6, 80)) == {"timeout"}


def test_loadbalancer_without_source_ranges_open_to_all(dp):
    svc = service("lb", ("10.96.0.30",), sport(80, 8080, node_port=30081), type="LoadBalancer",
                  load_balancer_ingress=(LoadBalancerIngress(LB_IP),))
    dp.load(inv(svc, eps("lb", EP4)), config())
    assert set(servers(dp.probe("clientB", LB_IP, 80, count=3))) <= set(EP4)


# --- 4./5./6. reject and drop ---------------------------------------------------------------


def test_no_endpoints_rejected(dp):
    """A Service without endpoints: connections to ClusterIP:port, LB IP:port and
    externalIP:port are rejected (fast, ICMP port unreachable → ECONNREFUSED), TCP and
    UDP, IPv4 and IPv6, from outside and from the node itself; its NodePort is rejected
    even though a local process listens on that port of the node."""
    svc = service("empty", ("10.96.0.40", "fd00:96::40"),
                  sport(80, 8080, node_port=NODE_LISTEN_PORT, name="http"),
                  sport(53, 9090, "UDP", node_port=NODE_LISTEN_PORT, name="dns"),
                  type="LoadBalancer", load_balancer_ingress=(LoadBalancerIngress(LB_IP_EMPTY),),
                  external_ips=(EXTERNAL_IP,))
    # control: before loading, the node's own listener answers on NODE_LISTEN_PORT
    assert replies(dp.probe("clientA", NODE_IP4, NODE_LISTEN_PORT))[0].server_ip == NODE_IP4
    assert replies(dp.probe("clientA", NODE_IP4, NODE_LISTEN_PORT, proto="udp"))[0].server_ip == NODE_IP4
    dp.load(inv(svc), config())
    assert errors(dp.probe("clientA", "10.96.0.40", 80, count=3)) == {"refused"}
    assert errors(dp.probe("clientA", "10.96.0.40", 53, proto="udp", count=3)) == {"refused"}
    assert errors(dp.probe("clientA", "fd00:96::40", 80)) == {"refused"}
    assert errors(dp.probe("node", "10.96.0.40", 80)) == {"refused"}
    assert errors(dp.probe("clientA", NODE_IP4, NODE_LISTEN_PORT)) == {"refused"}
    assert errors(dp.probe("clientA", NODE_IP4, NODE_LISTEN_PORT, proto="udp")) == {"refused"}
    # LB IP and externalIP (not in cluster-ips: only @no-endpoint-services rejects them)
    assert errors(dp.probe("clientA", LB_IP_EMPTY, 80)) == {"refused"}
    assert errors(dp.probe("clientA", EXTERNAL_IP, 53, proto="udp")) == {"refused"}


def test_bad_port_on_valid_clusterip_rejected(dp):
    """A port the Service does not have, on a ClusterIP that exists: rejected. (Without
    the rule the packet would leave the node towards the upstream: "unreachable".)"""
    dp.load(inv(service("web", ("10.96.0.10", "fd00:96::10"), sport(80, 8080)),
                eps("web", EP4), eps("web", EP6)), config())
    assert errors(dp.probe("clientA", "10.96.0.10", 81)) == {"refused"}
    assert errors(dp.probe("clientA", "10.96.0.10", 80, proto="udp")) == {"refused"}
    assert errors(dp.probe("clientA", "fd00:96::10", 443)) == {"refused"}
    assert errors(dp.probe("node", "10.96.0.10", 81)) == {"refused"}
    assert set(servers(dp.probe("clientA", "10.96.0.10", 80))) <= set(EP4)  # the valid one


@pytest.mark.parametrize("where", ["nodeconfig", "servicecidr-object"])
def test_unallocated_clusterip_dropped(dp, where):
    """An address inside the service CIDRs that no Service has: dropped (timeout), from
    the config's serviceCIDRs or from ServiceCIDR objects; addresses outside the
    service CIDRs are not touched."""
    objs = [service("web", ("10.96.0.10",), sport(80, 8080)), eps("web", EP4)]
    if where == "nodeconfig":
        cfg = config()
    else:
        cfg = config(service_cidrs=())
        objs.append(ServiceCIDR("kubernetes", (SERVICE_CIDR4, SERVICE_CIDR6)))
    dp.load(inv(*objs), cfg)
    assert errors(dp.probe("clientA", "10.96.0.99", 80)) == {"timeout"}
    assert errors(dp.probe("clientA", "10.96.0.99", 80, proto="udp")) == {"timeout"}
    assert errors(dp.probe("clientA", "fd00:96::99", 80)) == {"timeout"}
    assert errors(dp.probe("node", "10.96.0.99", 80)) == {"timeout"}


def test_unallocated_clusterip_not_dropped_without_service_cidrs(dp):
    """Control for the drop test: with no service CIDRs the packet leaves the node."""
    dp.load(inv(service("web", ("10.96.0.10",), sport(80, 8080)), eps("web", EP4)),
            config(service_cidrs=()))
    assert errors(dp.probe("clientA", "10.96.0.99", 80)) == {"unreachable"}


# --- 7. externalTrafficPolicy Local --------------------------------------------------------


def _etp_local_service(node_port: int = 30082) -> Service:
    return service("loc", ("10.96.0.80",), sport(80, 8080, node_port=node_port), type="LoadBalancer",
                   load_balancer_ingress=(LoadBalancerIngress(LB_IP_LOCAL),),
                   external_traffic_policy="Local", health_check_node_port=32000)


def test_etp_local_only_local_endpoint_and_client_ip_kept(dp):
    """eTP Local: external traffic (NodePort and LB IP) goes only to the endpoint on this
    node (nodeName == node-a), never to the remote one, and is not masqueraded: the
    backend sees the real client address. ClusterIP traffic still uses both."""
    local, remote = EP4[0], EP4[1]
    dp.load(inv(_etp_local_service(), eps("loc", (local, remote), node=(NODE_NAME, REMOTE_NODE))),
            config())
    for dst, port in ((NODE_IP4, 30082), (LB_IP_LOCAL, 80)):
        res = dp.probe("clientA", dst, port, count=30)
        assert servers(res) == Counter({local: 30}), f"{dst}:{port} -> {servers(res)}"
        assert peers(res) == {CLIENT_A4}, f"{dst}:{port}: masqueraded? {peers(res)}"
    flows = dp.conntrack("-p", "tcp", "--orig-dst", LB_IP_LOCAL)
    assert flows and {(f.reply_src, f.reply_dst) for f in flows} == {(local, CLIENT_A4)}, flows
    # internal traffic (iTP Cluster) still reaches both endpoints
    assert set(servers(dp.probe("pod", "10.96.0.80", 80, count=40))) == {local, remote}


def test_etp_local_without_local_endpoints_drops_external(dp):
    """eTP Local and every endpoint on another node: external traffic is dropped
    (timeout, not reject); the ClusterIP still works, and so does traffic from the node
    itself ("short-circuit local traffic")."""
    dp.load(inv(_etp_local_service(), eps("loc", (EP4[1], EP4[2]), node=REMOTE_NODE)), config())
    assert errors(dp.probe("clientA", NODE_IP4, 30082)) == {"timeout"}
    assert errors(dp.probe("clientA", LB_IP_LOCAL, 80)) == {"timeout"}
    assert set(servers(dp.probe("pod", "10.96.0.80", 80, count=5))) <= {EP4[1], EP4[2]}
    # the node's own traffic to the LB IP / NodePort is short-circuited to the
    # cluster-wide endpoints (and masqueraded)
    for dst, port in ((LB_IP_LOCAL, 80), (NODE_IP4, 30082)):
        res = dp.probe("node", dst, port, count=3)
        assert set(servers(res)) <= {EP4[1], EP4[2]}, f"{dst}:{port}"
        # source 198.51.100.1 for the NodePort, 10.244.1.1 for the LB IP: masqueraded,
        # the backend sees the node's address on its own link either way
        assert peers(res) == {NODE_BE4}, f"{dst}:{port}"


def test_etp_local_short_circuits_pod_traffic(dp):
    """eTP Local: traffic from a source inside clusterCIDRs to the LB IP is short-circuited
    to the cluster-wide chain: it may reach the remote endpoint too."""
    dp.load(inv(_etp_local_service(), eps("loc", (EP4[0], EP4[1]), node=(NODE_NAME, REMOTE_NODE))),
            config())
    res = dp.probe("pod", LB_IP_LOCAL, 80, count=40)
    assert set(servers(res)) == {EP4[0], EP4[1]}
    assert peers(res) == {POD4}


# --- 8. session affinity --------------------------------------------------------------------


def test_session_affinity_client_ip(dp):
    """ClientIP affinity: every connection from one client lands on the same endpoint
    (and the client's address is recorded in an affinity set); a Service without
    affinity over the same endpoints spreads."""
    sticky = service("sticky", ("10.96.0.50",), sport(80, 8080), session_affinity="ClientIP",
                     affinity_timeout_seconds=300)
    plain = service("plain", ("10.96.0.51",), sport(80, 8080))
    dp.load(inv(sticky, eps("sticky", EP4), plain, eps("plain", EP4)), config())
    for role in ("clientA", "pod"):
        seen = servers(dp.probe(role, "10.96.0.50", 80, count=20))
        assert len(seen) == 1, f"{role}: affinity broken: {seen}"
    table = dp.nft_list()
    assert re.search(r"set affinity-[^{]*\{[^}]*elements = \{[^}]*" + re.escape(CLIENT_A4), table), \
        "client A's address is in no affinity set"
    assert len(servers(dp.probe("clientA", "10.96.0.51", 80, count=20))) > 1


# --- 9. masquerade ---------------------------------------------------------------------------


@pytest.mark.parametrize("bit", [14, 0, 31])
def test_masquerade_nodeport_etp_cluster(dp, bit):
    """eTP Cluster: external traffic to a NodePort is masqueraded — the backend sees the
    node's address on its link, and conntrack shows the reply going to the node (with
    the default and the extreme masqueradeBit values)."""
    dp.load(inv(service("np", ("10.96.0.20",), sport(80, 8080, node_port=30080), type="NodePort"),
                eps("np", EP4)), config(masquerade_bit=bit))
    res = dp.probe("clientA", NODE_IP4, 30080, count=5)
    assert peers(res) == {NODE_BE4}
    flows = dp.conntrack("-p", "tcp", "--orig-src", CLIENT_A4, "--orig-dst", NODE_IP4)
    assert flows and {f.reply_dst for f in flows} == {NODE_BE4}, flows
    assert {f.reply_src for f in flows} <= set(EP4), flows


def test_masquerade_clusterip_by_local_detector(dp):
    """ClusterIP traffic: from inside clusterCIDRs (pod) the source is kept; from outside
    (client A) it is masqueraded. IPv4 and IPv6 (each family has its own detector)."""
    dp.load(inv(service("web", ("10.96.0.10", "fd00:96::10"), sport(80, 8080)),
                eps("web", EP4), eps("web", EP6)), config())
    assert peers(dp.probe("pod", "10.96.0.10", 80, count=5)) == {POD4}
    assert peers(dp.probe("clientA", "10.96.0.10", 80, count=5)) == {NODE_BE4}
    assert peers(dp.probe("pod", "fd00:96::10", 80, count=3)) == {POD6}
    assert peers(dp.probe("clientA", "fd00:96::10", 80, count=3)) == {NODE_BE6}
    flows = dp.conntrack("-p", "tcp", "--orig-src", POD4, "--orig-dst", "10.96.0.10")
    assert flows and {f.reply_dst for f in flows} == {POD4}, flows
    flows = dp.conntrack("-p", "tcp", "--orig-src", CLIENT_A4, "--orig-dst", "10.96.0.10")
    assert flows and {f.reply_dst for f in flows} == {NODE_BE4}, flows


def test_no_masquerade_without_detector(dp):
    """No clusterCIDRs (no local-traffic detector) and masqueradeAll off: ClusterIP
    traffic from outside keeps its source address."""
    dp.load(inv(service("web", ("10.96.0.10",), sport(80, 8080)), eps("web", EP4)),
            config(cluster_cidrs=()))
    assert peers(dp.probe("clientA", "10.96.0.10", 80, count=5)) == {CLIENT_A4}


def test_masquerade_all(dp):
    """masqueradeAll: even traffic from inside clusterCIDRs is masqueraded."""
    dp.load(inv(service("web", ("10.96.0.10",), sport(80, 8080)), eps("web", EP4)),
            config(masquerade_all=True))
    assert peers(dp.probe("pod", "10.96.0.10", 80, count=5)) == {NODE_BE4}


def test_hairpin_to_local_endpoint_is_masqueraded(dp):
    """An endpoint connecting to its own Service and landing on itself (hairpin): the
    connection is masqueraded to the node, otherwise the endpoint would see a packet
    from its own address and the connection could not work."""
    dp.load(inv(service("self", ("10.96.0.90",), sport(80, 8080)), eps("self", (EP4[0],))),
            config())
    res = dp.probe("backend", "10.96.0.90", 80, src=EP4[0], count=3)
    assert servers(res) == Counter({EP4[0]: 3})
    assert peers(res) == {NODE_BE4}


# --- 10. IPv6 ---------------------------------------------------------------------------------


def test_ipv6_clusterip_and_nodeport(dp):
    """Dual-stack Service: the IPv6 ClusterIP reaches the IPv6 endpoints (ip6 table),
    the IPv6 NodePort on the node's IPv6 address too; IPv4 keeps working alongside."""
    svc = service("dual", ("10.96.0.60", "fd00:96::60"), sport(80, 8080, node_port=30083),
                  type="NodePort")
    dp.load(inv(svc, eps("dual", EP4), eps("dual", EP6)), config())
    assert set(servers(dp.probe("clientA", "fd00:96::60", 80, count=40))) == set(EP6)
    assert set(servers(dp.probe("clientA", NODE_IP6, 30083, count=5))) <= set(EP6)
    assert set(servers(dp.probe("clientA", "10.96.0.60", 80, count=5))) <= set(EP4)
    flows = dp.conntrack("-p", "tcp", "--orig-dst", "fd00:96::60", family="ipv6")
    assert {f.reply_src for f in flows} == set(EP6), flows


# --- 11. UDP ----------------------------------------------------------------------------------


def test_udp_clusterip(dp):
    """A Service with a UDP and a TCP port of the same number: UDP datagrams are DNATed
    to the UDP targetPort (9090) over all endpoints, TCP to its own (8080)."""
    svc = service("dns", ("10.96.0.70", "fd00:96::70"), sport(53, 9090, "UDP", name="dns"),
                  sport(53, 8080, "TCP", name="dns-tcp"))
    ports = (EndpointPort("dns", "UDP", 9090), EndpointPort("dns-tcp", "TCP", 8080))
    dp.load(inv(svc, eps("dns", EP4, ports), eps("dns", EP6, ports)), config())
    res = dp.probe("clientA", "10.96.0.70", 53, proto="udp", count=40)
    assert set(servers(res)) == set(EP4)
    assert {r.server_port for r in replies(res)} == {9090}
    assert {r.server_port for r in replies(dp.probe("clientA", "10.96.0.70", 53, count=3))} == {8080}
    res6 = dp.probe("clientA", "fd00:96::70", 53, proto="udp", count=5)
    assert set(servers(res6)) <= set(EP6) and {r.server_port for r in replies(res6)} == {9090}
    flows = dp.conntrack("-p", "udp", "--orig-dst", "10.96.0.70")
    assert {f.reply_src for f in flows} == set(EP4) and {f.reply_sport for f in flows} == {9090}, flows


# --- more of §3: externalIPs, internalTrafficPolicy, endpoint conditions -------------------


def test_external_ip(dp):
    """externalIPs: traffic to externalIP:port is DNATed to the endpoints and, with
    eTP Cluster, masqueraded; other ports of that address are not touched."""
    svc = service("ext", ("10.96.0.100",), sport(80, 8080), external_ips=(EXTERNAL_IP,))
    dp.load(inv(svc, eps("ext", EP4)), config())
    res = dp.probe("clientA", EXTERNAL_IP, 80, count=5)
    assert set(servers(res)) <= set(EP4) and peers(res) == {NODE_BE4}
    assert errors(dp.probe("clientA", EXTERNAL_IP, 81)) == {"unreachable"}  # left the node


def test_external_ip_etp_local_on_a_clusterip_service(dp):
    """kube-proxy applies eTP Local to any externally reachable Service, including a
    ClusterIP Service with externalIPs: only the local endpoint, client address kept;
    with no local endpoint, external traffic is dropped."""
    local, remote = EP4[0], EP4[1]
    svc = service("extloc", ("10.96.0.101",), sport(80, 8080), external_ips=(EXTERNAL_IP,),
                  external_traffic_policy="Local")
    dp.load(inv(svc, eps("extloc", (local, remote), node=(NODE_NAME, REMOTE_NODE))), config())
    res = dp.probe("clientA", EXTERNAL_IP, 80, count=20)
    assert servers(res) == Counter({local: 20}) and peers(res) == {CLIENT_A4}
    dp.load(inv(svc, eps("extloc", (remote,), node=REMOTE_NODE)), config())
    assert errors(dp.probe("clientA", EXTERNAL_IP, 80)) == {"timeout"}


def test_internal_traffic_policy_local(dp):
    """iTP Local: ClusterIP traffic goes only to endpoints on this node; with none
    there it is dropped (timeout, not reject)."""
    svc = service("itp", ("10.96.0.110",), sport(80, 8080), internal_traffic_policy="Local")
    dp.load(inv(svc, eps("itp", EP4, node=(NODE_NAME, REMOTE_NODE, REMOTE_NODE))), config())
    assert servers(dp.probe("pod", "10.96.0.110", 80, count=20)) == Counter({EP4[0]: 20})
    dp.load(inv(svc, eps("itp", EP4, node=REMOTE_NODE)), config())
    assert errors(dp.probe("pod", "10.96.0.110", 80)) == {"timeout"}


def test_endpoint_conditions(dp):
    """Only ready endpoints get traffic; when none is ready, serving+terminating ones
    are used as a fallback; not-serving ones never."""
    def slice_of(*conds):
        return EndpointSlice(
            namespace=NS, name="cond-ipv4", service_name="cond", address_type="IPv4",
            endpoints=tuple(Endpoint(addresses=(ip,), node_name=NODE_NAME, ready=r, serving=sv,
                                     terminating=t) for ip, (r, sv, t) in zip(EP4, conds)),
            ports=(EndpointPort("", "TCP", 8080),))
    svc = service("cond", ("10.96.0.120",), sport(80, 8080))
    ready, not_ready, serving_term, gone = (True, True, False), (False, False, False), \
        (False, True, True), (False, False, True)
    dp.load(inv(svc, slice_of(ready, not_ready, serving_term)), config())
    assert servers(dp.probe("clientA", "10.96.0.120", 80, count=20)) == Counter({EP4[0]: 20})
    dp.load(inv(svc, slice_of(gone, not_ready, serving_term)), config())
    assert servers(dp.probe("clientA", "10.96.0.120", 80, count=10)) == Counter({EP4[2]: 10})
    dp.load(inv(svc, slice_of(gone, not_ready, gone)), config())
    assert errors(dp.probe("clientA", "10.96.0.120", 80)) == {"refused"}


def test_endpoints_from_several_slices(dp):
    """A Service's endpoints may be split over several EndpointSlices: all are used."""
    svc = service("multi", ("10.96.0.130",), sport(80, 8080))
    dp.load(inv(svc, eps("multi", EP4[:2], suffix="-a"), eps("multi", EP4[2:], suffix="-b")),
            config())
    assert set(servers(dp.probe("clientA", "10.96.0.130", 80, count=40))) == set(EP4)


def test_reload_replaces_previous_ruleset(dp):
    """Loading a new rendered script over the old tables (no delete in between) replaces
    them: a removed Service's ClusterIP stops working (now unallocated: dropped), a new
    one starts working."""
    old = service("old", ("10.96.0.140",), sport(80, 8080))
    new = service("new", ("10.96.0.141",), sport(80, 8080))
    dp.load(inv(old, eps("old", EP4)), config())
    assert set(servers(dp.probe("clientA", "10.96.0.140", 80))) <= set(EP4)
    dp.load(inv(new, eps("new", EP4)), config())
    assert errors(dp.probe("clientA", "10.96.0.140", 80)) == {"timeout"}
    assert set(servers(dp.probe("clientA", "10.96.0.141", 80))) <= set(EP4)
    for family in ("ip", "ip6"):  # exactly one table per family, no leftovers
        tables = nsx(dp.node, "nft", "list", "tables", family).stdout.split()
        assert tables.count("nftrec") == 1, tables


def test_session_affinity_expires(dp):
    """The affinity entry carries the Service's timeout: after it, the client is
    forgotten (the element leaves the dynamic set)."""
    sticky = service("sticky", ("10.96.0.50",), sport(80, 8080), session_affinity="ClientIP",
                     affinity_timeout_seconds=1)
    dp.load(inv(sticky, eps("sticky", EP4)), config())
    assert len(servers(dp.probe("clientA", "10.96.0.50", 80, count=5))) == 1
    assert CLIENT_A4 in dp.nft_list()
    deadline = time.monotonic() + 5
    while CLIENT_A4 in dp.nft_list() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert CLIENT_A4 not in dp.nft_list(), "affinity entry did not expire"


def test_topology_hints(dp):
    """Topology-aware routing: when every ready endpoint has zone hints and some are
    hinted for this node's zone, only those get traffic; a zone no endpoint is hinted
    for falls back to all endpoints."""
    def hinted(zones):
        return EndpointSlice(
            namespace=NS, name="topo-ipv4", service_name="topo", address_type="IPv4",
            endpoints=tuple(Endpoint(addresses=(ip,), node_name=REMOTE_NODE, zone=z,
                                     hint_zones=(z,)) for ip, z in zip(EP4, zones)),
            ports=(EndpointPort("", "TCP", 8080),))
    svc = service("topo", ("10.96.0.150",), sport(80, 8080))
    slc = hinted(("zone-a", "zone-b", "zone-b"))
    dp.load(inv(svc, slc), config(zone="zone-a"))
    assert servers(dp.probe("clientA", "10.96.0.150", 80, count=20)) == Counter({EP4[0]: 20})
    dp.load(inv(svc, slc), config(zone="zone-b"))
    assert set(servers(dp.probe("clientA", "10.96.0.150", 80, count=30))) == {EP4[1], EP4[2]}
    dp.load(inv(svc, slc), config(zone="zone-c"))
    assert set(servers(dp.probe("clientA", "10.96.0.150", 80, count=40))) == set(EP4)


def test_topology_node_hints(dp):
    """Node hints (hints.forNodes, kube-proxy 1.35 PreferSameNode): when every ready
    endpoint has node hints and some name this node, only those get traffic; when no
    hint names this node (and there are no zone hints) all endpoints do."""
    hints = ((NODE_NAME,), ("node-b",), ("node-c", NODE_NAME))
    slc = EndpointSlice(
        namespace=NS, name="nodetopo-ipv4", service_name="nodetopo", address_type="IPv4",
        endpoints=tuple(Endpoint(addresses=(ip,), node_name=REMOTE_NODE, hint_nodes=h)
                        for ip, h in zip(EP4, hints)),
        ports=(EndpointPort("", "TCP", 8080),))
    svc = service("nodetopo", ("10.96.0.151",), sport(80, 8080))
    dp.load(inv(svc, slc), config())
    assert set(servers(dp.probe("clientA", "10.96.0.151", 80, count=40))) == {EP4[0], EP4[2]}
    dp.load(inv(svc, slc), config(node_name="node-b"))
    assert servers(dp.probe("clientA", "10.96.0.151", 80, count=20)) == Counter({EP4[1]: 20})
    dp.load(inv(svc, slc), config(node_name="node-z"))
    assert set(servers(dp.probe("clientA", "10.96.0.151", 80, count=40))) == set(EP4)


def test_topology_hints_derived_from_traffic_distribution(dp):
    """Beyond kube-proxy: trafficDistribution PreferSameNode on slices without hints.
    nftrec derives the hints the EndpointSlice controller would write (forNodes from
    nodeName), so only this node's endpoint gets traffic; deriveTopologyHints: false
    gives kube-proxy's behaviour without a controller: every endpoint."""
    svc = service("samenode", ("10.96.0.152",), sport(80, 8080), traffic_distribution="PreferSameNode")
    slc = eps("samenode", EP4, ports=(EndpointPort("", "TCP", 8080),),
              node=(REMOTE_NODE, NODE_NAME, REMOTE_NODE))
    assert all(e.hint_nodes is None and e.hint_zones is None for e in slc.endpoints)
    dp.load(inv(svc, slc), config())
    assert servers(dp.probe("clientA", "10.96.0.152", 80, count=20)) == Counter({EP4[1]: 20})
    assert set(servers(dp.probe("node", "10.96.0.152", 80, count=10))) == {EP4[1]}
    dp.load(inv(svc, slc), config(derive_topology_hints=False))
    assert set(servers(dp.probe("clientA", "10.96.0.152", 80, count=40))) == set(EP4)
