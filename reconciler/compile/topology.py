"""Endpoint selection, as kube-proxy's pkg/proxy/topology.go: the endpoints of a Service
port (`endpoints_for_port`), which of them the Cluster and Local policies use
(`categorize_endpoints`), and which topology hints are followed (`topology_mode`). On an
edge node no EndpointSlice controller writes the hints of `trafficDistribution`:
`derive_hints` writes the ones it would (explicit hints on a ready endpoint win)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from reconciler.compile import naming
from reconciler.compile.parse import ADDRESS_TYPE_FAMILY, family_of, parse_ip, parse_port
from reconciler.intake import Endpoint, EndpointSlice, NodeConfig, Service, ServicePort

PREFER_SAME_NODE = "PreferSameNode"
PREFER_SAME_ZONE = "PreferSameZone"
# the trafficDistribution values the controller's preferCloseHeuristic handles
CLOSE_TRAFFIC_DISTRIBUTION = frozenset({"PreferClose", PREFER_SAME_ZONE, PREFER_SAME_NODE})


class _Hinted(Protocol):
    ready: bool
    zone_hints: frozenset[str]
    node_hints: frozenset[str]


def topology_mode(endpoints: Sequence[_Hinted], zone: str, node_name: str) -> str:
    """kube-proxy's topologyModeFromHints: "PreferSameNode", "PreferSameZone" or ""."""
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return ""
    if all(e.node_hints for e in ready) and any(node_name in e.node_hints for e in ready):
        return PREFER_SAME_NODE
    if all(e.zone_hints for e in ready) and any(zone in e.zone_hints for e in ready):
        return PREFER_SAME_ZONE
    return ""


def available_for_topology(e: _Hinted, mode: str, zone: str, node_name: str) -> bool:
    """kube-proxy's availableForTopology (no fallback here: that is in the mode)."""
    if mode == "":
        return True
    if mode == PREFER_SAME_NODE:
        return node_name in e.node_hints
    if mode == PREFER_SAME_ZONE:
        return zone in e.zone_hints
    return False


def _has_hints(ep) -> bool:
    return bool(ep.hint_zones) or bool(ep.hint_nodes)


def derive_slice(sl: EndpointSlice, same_node: bool) -> EndpointSlice | None:
    """`sl` with the hints the controller would write, or None when nothing is derived
    (explicit hints on a ready endpoint, or no ready endpoint with a zone/nodeName)."""
    if any(ep.ready and _has_hints(ep) for ep in sl.endpoints):
        return None
    changed = False
    endpoints = []
    for ep in sl.endpoints:
        if ep.ready:
            zones = (ep.zone,) if ep.zone is not None else None
            nodes = (ep.node_name,) if same_node and ep.node_name is not None else None
            if zones is not None or nodes is not None:
                ep = replace(ep, hint_zones=zones, hint_nodes=nodes)
                changed = True
        endpoints.append(ep)
    return replace(sl, endpoints=tuple(endpoints)) if changed else None


def derive_hints(service: Service, slices: Iterable[EndpointSlice], config: NodeConfig
                 ) -> tuple[list[EndpointSlice], tuple[str, ...]]:
    """(the slices to compile with, names of the slices whose hints were derived)."""
    slices = list(slices)
    if not config.derive_topology_hints or service.traffic_distribution not in CLOSE_TRAFFIC_DISTRIBUTION:
        return slices, ()
    same_node = service.traffic_distribution == PREFER_SAME_NODE
    out, derived = [], []
    for sl in slices:
        new = derive_slice(sl, same_node) if sl.address_type != "FQDN" else None
        if new is None:
            out.append(sl)
        else:
            out.append(new)
            derived.append(sl.name)
    return out, tuple(sorted(derived))


def derived_topology_hints(services: Iterable[Service], slices: Iterable[EndpointSlice],
                           config: NodeConfig) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Service key → (its trafficDistribution, the slices whose hints nftrec derived),
    for every Service that got derived hints (what `nftrec plan` reports)."""
    if not config.derive_topology_hints:
        return {}
    wanted = {s.key: s for s in services if s.traffic_distribution in CLOSE_TRAFFIC_DISTRIBUTION
              and not s.headless and s.type != "ExternalName"}  # those have no rules to steer
    if not wanted:
        return {}
    mine: dict[str, list[EndpointSlice]] = {}
    for sl in slices:
        if sl.service_key in wanted:
            mine.setdefault(sl.service_key, []).append(sl)
    out = {}
    for key in sorted(mine):
        svc = wanted[key]
        _, names = derive_hints(svc, mine[key], config)
        if names:
            out[key] = (svc.traffic_distribution, names)
    return out


# --- endpoints -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EndpointInfo:
    """One endpoint of one Service port (kube-proxy's endpointInfo)."""

    ip: str  # canonical
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    is_local: bool = False
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()

    @property
    def string(self) -> str:
        """Endpoint.String(): `10.0.0.1:80` / `[fd00::1]:80` — identity and sort key."""
        return naming.join_host_port(self.ip, self.port)


def endpoints_for_port(
    slices: Iterable[EndpointSlice], family: str, port: ServicePort, node_name: str
) -> list[EndpointInfo]:
    """The endpoints of one Service port in one family, as kube-proxy's endpoint cache
    builds them: slices of this address type; the slice port with the Service port's
    name and protocol gives the port; first address; duplicate ip:port → the
    non-terminating one wins; sorted by the `ip:port` string."""
    chosen: dict[str, EndpointInfo] = {}
    # Sorted so a tie (two equal-status duplicates) resolves the same way every time.
    for sl in _slice_order(slices):
        if ADDRESS_TYPE_FAMILY.get(sl.address_type) != family:
            continue
        sport = next((p for p in sl.ports
                      if p.name == port.name and p.protocol == port.protocol), None)
        if sport is None:
            continue
        eport = parse_port(sport.port, f"EndpointSlice {sl.namespace}/{sl.name} port {sport.name!r}")
        for ep in sl.endpoints:
            if not ep.addresses:
                continue
            ip = parse_ip(ep.addresses[0], f"EndpointSlice {sl.namespace}/{sl.name} address")
            if family_of(ip) != family:
                continue  # wrong family inside the slice: never put into this table
            info = _endpoint_info(ep, str(ip), eport, node_name)
            prev = chosen.get(info.string)
            if prev is None or (prev.terminating and not info.terminating):
                chosen[info.string] = info
    return sorted(chosen.values(), key=lambda e: e.string)


def _slice_order(slices: Iterable[EndpointSlice]) -> list[EndpointSlice]:
    """Slices by (namespace, name), then by their whole content (repr) where two share
    a name (repr formats every field: taken only then)."""
    slices = list(slices)
    names = {(s.namespace, s.name) for s in slices}
    if len(names) == len(slices):
        return sorted(slices, key=lambda s: (s.namespace, s.name))
    return sorted(slices, key=lambda s: (s.namespace, s.name, repr(s)))


def _endpoint_info(ep: Endpoint, ip: str, port: int, node_name: str) -> EndpointInfo:
    return EndpointInfo(
        ip=ip,
        port=port,
        ready=bool(ep.ready),
        serving=bool(ep.serving),
        terminating=bool(ep.terminating),
        is_local=bool(node_name) and ep.node_name == node_name,
        zone_hints=frozenset(ep.hint_zones or ()),
        node_hints=frozenset(ep.hint_nodes or ()),
    )


@dataclass(frozen=True)
class Categorized:
    cluster: tuple[EndpointInfo, ...] | None  # None: the port never uses Cluster policy
    local: tuple[EndpointInfo, ...] | None  # None: the port never uses Local policy
    all_reachable: tuple[EndpointInfo, ...]
    has_any: bool  # usable endpoints anywhere (even if none reachable from here)


def categorize_endpoints(
    endpoints: Sequence[EndpointInfo], *, uses_cluster: bool, uses_local: bool, zone: str,
    node_name: str = "",
) -> Categorized:
    """kube-proxy's CategorizeEndpoints: usable = ready, falling back
    to serving+terminating independently for Cluster and Local policy; Cluster policy
    follows node or zone hints (topology.topology_mode)."""
    if not endpoints:
        return Categorized(None, None, (), False)
    has_any = False
    cluster: list[EndpointInfo] | None = None
    local: list[EndpointInfo] | None = None
    mode = ""
    serving_terminating = False

    if uses_cluster:
        mode = topology_mode(endpoints, zone, node_name)
        cluster = [e for e in endpoints
                   if e.ready and available_for_topology(e, mode, zone, node_name)]
        if not cluster:  # no ready endpoint anywhere: use terminating-but-serving ones
            cluster = [e for e in endpoints if e.serving and e.terminating]
        has_any = bool(cluster)

    if not uses_local:
        return Categorized(tuple(cluster or ()), None, tuple(cluster or ()), has_any)

    local_ready = local_st = False
    for e in endpoints:
        if e.ready:
            has_any = True
            local_ready |= e.is_local
        elif e.serving and e.terminating:
            has_any = True
            local_st |= e.is_local
    if local_ready:
        local = [e for e in endpoints if e.is_local and e.ready]
    elif local_st:
        serving_terminating = True
        local = [e for e in endpoints if e.is_local and e.serving and e.terminating]
    else:
        local = []

    if not uses_cluster:
        return Categorized(None, tuple(local), tuple(local), has_any)
    assert cluster is not None
    if mode == "" and not serving_terminating:
        return Categorized(tuple(cluster), tuple(local), tuple(cluster), has_any)
    union = {e.string: e for e in cluster}
    union.update({e.string: e for e in local})
    return Categorized(tuple(cluster), tuple(local),
                       tuple(sorted(union.values(), key=lambda e: e.string)), has_any)
