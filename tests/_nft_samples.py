"""Sample inputs for the nft/live/diff tests: a rich Inventory that exercises every rule
shape the compiler writes, and helpers to edit it one Service at a time."""

from __future__ import annotations

from dataclasses import replace

from reconciler.intake.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Inventory,
    LoadBalancerIngress,
    NodeConfig,
    Service,
    ServicePort,
)


def svc(ns, name, typ="ClusterIP", cips=(), ports=(), **kw) -> Service:
    return Service(namespace=ns, name=name, type=typ, cluster_ips=tuple(cips), ports=tuple(ports), **kw)


def sp(port, proto="TCP", name="", node_port=0) -> ServicePort:
    return ServicePort(name=name, protocol=proto, port=port, target_port=port, node_port=node_port)


def sl(ns, svc_name, eps, ports, fam="IPv4", name=None) -> EndpointSlice:
    return EndpointSlice(namespace=ns, name=name or f"{svc_name}-{fam.lower()}", service_name=svc_name,
                         address_type=fam, endpoints=tuple(eps), ports=tuple(ports))


def ep(ip, node=None, **kw) -> Endpoint:
    return Endpoint(addresses=(ip,), node_name=node, **kw)


def epp(port, proto="TCP", name="") -> EndpointPort:
    return EndpointPort(name=name, protocol=proto, port=port)


CONFIG = NodeConfig(
    node_name="edge-7",
    node_ips=("192.168.0.2", "2001:db8::2"),
    cluster_cidrs=("10.0.0.0/8", "fd00:10::/64"),
    service_cidrs=("172.30.0.0/16", "fd00:30::/112"),
)


def rich_inventory() -> Inventory:
    S, E = [], []
    # ClusterIP, one local endpoint (hairpin element, single `dnat to`)
    S.append(svc("ns1", "one", cips=("172.30.0.41",), ports=[sp(80, name="http")]))
    E.append(sl("ns1", "one", [ep("10.180.0.1", "edge-7")], [epp(8080, name="http")]))
    # ClusterIP, UDP + SCTP ports, numgen map DNAT, a terminating endpoint
    S.append(svc("ns1", "multi", cips=("172.30.0.42",), ports=[sp(53, "UDP", "dns"), sp(9000, "SCTP", "s")]))
    E.append(sl("ns1", "multi", [ep("10.180.0.3"), ep("10.180.0.2"), ep("10.180.0.4", terminating=True, ready=False)],
                [epp(5353, "UDP", "dns"), epp(9001, "SCTP", "s")]))
    # NodePort, externalTrafficPolicy Local (short-circuit rules, local- chain)
    S.append(svc("ns2", "np", "NodePort", cips=("172.30.0.43",), ports=[sp(80, node_port=30080)],
                 external_traffic_policy="Local"))
    E.append(sl("ns2", "np", [ep("10.180.1.1", "edge-7"), ep("10.180.1.2", "other")], [epp(80)]))
    # LoadBalancer: source ranges (incl. the node IP → VIP appended), externalIP, affinity
    S.append(svc("ns3", "lb", "LoadBalancer", cips=("172.30.0.44",), ports=[sp(443, name="https", node_port=30443)],
                 external_ips=("203.0.113.9",), load_balancer_source_ranges=("203.0.113.0/25", "192.168.0.0/24"),
                 load_balancer_ingress=(LoadBalancerIngress("198.51.100.7"),), session_affinity="ClientIP",
                 affinity_timeout_seconds=600))
    E.append(sl("ns3", "lb", [ep("10.180.2.1"), ep("10.180.2.2", "edge-7")], [epp(8443, name="https")]))
    # no endpoints at all: no-endpoint elements with comments, goto reject-chain
    S.append(svc("ns4", "empty", "NodePort", cips=("172.30.0.45",), ports=[sp(81, node_port=30081)]))
    # internalTrafficPolicy Local without local endpoints: drop verdict
    S.append(svc("ns4", "itp", cips=("172.30.0.46",), ports=[sp(82)], internal_traffic_policy="Local"))
    E.append(sl("ns4", "itp", [ep("10.180.3.1", "other")], [epp(82)]))
    # dual stack
    S.append(svc("ns5", "v6", cips=("fd00:30::10", "172.30.0.47"), ip_families=("IPv6", "IPv4"),
                 ports=[sp(80)], external_ips=("2001:db8::99",)))
    E.append(sl("ns5", "v6", [ep("fd00:10::1", "edge-7"), ep("fd00:10::2")], [epp(8080)], fam="IPv6"))
    E.append(sl("ns5", "v6", [ep("10.180.5.1")], [epp(8080)]))
    # IPv6 with affinity
    S.append(svc("ns5", "v6aff", cips=("fd00:30::11",), ports=[sp(80)], session_affinity="ClientIP"))
    E.append(sl("ns5", "v6aff", [ep("fd00:10::5", "edge-7")], [epp(8080)], fam="IPv6"))
    return Inventory(services=tuple(S), endpoint_slices=tuple(E))


def with_service(inv: Inventory, key: str, **changes) -> Inventory:
    """`inv` with Service `key` changed (or removed, with remove=True)."""
    remove = changes.pop("remove", False)
    out = []
    for s in inv.services:
        if s.key == key:
            if remove:
                continue
            s = replace(s, **changes)
        out.append(s)
    slices = inv.endpoint_slices if not remove else tuple(x for x in inv.endpoint_slices if x.service_key != key)
    return replace(inv, services=tuple(out), endpoint_slices=slices)


def with_endpoints(inv: Inventory, key: str, fam: str, endpoints) -> Inventory:
    """`inv` with the `fam` slice of Service `key` holding `endpoints`."""
    out = []
    for s in inv.endpoint_slices:
        if s.service_key == key and s.address_type == fam:
            s = replace(s, endpoints=tuple(endpoints))
        out.append(s)
    return replace(inv, endpoint_slices=tuple(out))


def add_service(inv: Inventory, service: Service, *slices: EndpointSlice) -> Inventory:
    return replace(inv, services=inv.services + (service,), endpoint_slices=inv.endpoint_slices + slices)


# Two Services, each with one local endpoint (node edge-7) in the same hairpin shard,
# hairpin-connections-28 (layout sharded), which no rich_inventory() endpoint uses
HAIRPIN_A = (svc("ns9", "a", cips=("172.30.0.91",), ports=[sp(80)]), sl("ns9", "a", [ep("10.180.9.40", "edge-7")], [epp(80)]))
HAIRPIN_B = (svc("ns9", "b", cips=("172.30.0.92",), ports=[sp(80)]), sl("ns9", "b", [ep("10.180.8.40", "edge-7")], [epp(80)]))
