"""Topology-aware routing: which hints kube-proxy follows, and hints nobody else writes.

Pipeline position: model → **compile** (services.categorize_endpoints asks `topology_mode`
and `available_for_topology`; services.compile_service asks `derive_hints` first).

kube-proxy 1.35 (pkg/proxy/topology.go, topologyModeFromHints; PreferSameTrafficDistribution
is GA there, so node hints are always read), over the *ready* endpoints of a Service port:
- `PreferSameNode` when every ready endpoint has node hints (`hints.forNodes`) and one
  names this node; then only ready endpoints whose forNodes name this node are used;
- else `PreferSameZone` when every ready endpoint has zone hints (`hints.forZones`) and
  one names this node's zone; then only ready endpoints hinted for the zone are used;
- else "" (no topology: every ready endpoint).
No ready endpoint → "". The fallback to serving+terminating endpoints ignores topology
(services.categorize_endpoints). kube-proxy only logs when it ignores hints; nftrec does
the same, silently.

Beyond kube-proxy (`derive_hints`): in a cluster the EndpointSlice controller writes the
hints from `spec.trafficDistribution` (k8s.io/endpointslice/trafficdist,
preferCloseHeuristic). On an edge node no controller runs, so nftrec plays its part
when `NodeConfig.derive_topology_hints` is on (the default):
- only for a Service whose `trafficDistribution` is PreferClose, PreferSameZone or
  PreferSameNode;
- per EndpointSlice: a slice where any *ready* endpoint already carries hints (a
  non-empty forZones or forNodes) is left exactly as written: explicit hints win;
- otherwise every ready endpoint gets `forZones: [zone]` when it has a `zone`, and for
  PreferSameNode also `forNodes: [nodeName]` when it has a `nodeName`; an endpoint with
  neither stays without hints; endpoints that are not ready are left alone (as the
  controller does; kube-proxy never reads their hints).
"Ready" is kube-proxy's reading (an unset `conditions.ready` is ready); the controller
always sets the condition, so the two agree on every slice it writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from reconciler.intake import EndpointSlice, NodeConfig, Service

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
