"""Readiness probe results as an input to compile. `probe_targets`: the endpoints to probe
(Services annotated `probe.nftrec.io/readiness`; an endpoint neither ready nor serving
is skipped: a probe can only take readiness away). `with_probe_results`: the inventory
with the endpoints that failed made not ready and not serving; only those Services'
slices are replaced, so an incremental compile recompiles only them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from reconciler.intake import EndpointSlice, Inventory, Probe

ADDRESS_TYPES = ("IPv4", "IPv6")


@dataclass(frozen=True)
class ProbeTarget:
    """One endpoint to probe. `port` is 0 when a named port does not resolve (`error` says
    why); such a probe fails, as the kubelet's does."""

    service: str  # namespace/name
    address: str  # canonical IP
    port: int
    probe: Probe
    error: str = ""

    @property
    def key(self) -> tuple:
        return self.service, self.address, self.port, self.probe


def _resolve(probe: Probe, sl: EndpointSlice) -> tuple[int, str]:
    if isinstance(probe.port, int):
        return probe.port, ""
    ports = sorted((p for p in sl.ports if p.name == probe.port), key=lambda p: p.protocol != "TCP")
    if not ports:
        names = ", ".join(sorted(p.name for p in sl.ports if p.name)) or "none"
        return 0, (f"the probe's port {probe.port!r} is not a port name of EndpointSlice {sl.namespace}/{sl.name} "
                   f"(its names: {names})")
    return ports[0].port, ""


def probe_targets(inventory: Inventory) -> list[ProbeTarget]:
    probed = {s.key: s.readiness_probe for s in inventory.services
              if s.readiness_probe is not None and not s.headless}
    out: dict[tuple, ProbeTarget] = {}
    for sl in sorted(inventory.endpoint_slices, key=lambda s: (s.namespace, s.name)):
        probe = probed.get(sl.service_key)
        if probe is None or sl.address_type not in ADDRESS_TYPES:
            continue
        port, error = _resolve(probe, sl)
        for ep in sl.endpoints:
            if not ep.addresses or not (ep.ready or ep.serving):
                continue
            t = ProbeTarget(sl.service_key, ep.addresses[0], port, probe, error)
            out.setdefault((t.service, t.address), t)
    return list(out.values())


def with_probe_results(inventory: Inventory, down: Mapping[str, frozenset[str] | set[str]]) -> Inventory:
    """`inventory` with the endpoints in `down` taken out of readiness (see module doc)."""
    if not any(down.values()):
        return inventory
    slices = []
    changed = False
    for sl in inventory.endpoint_slices:
        gone = down.get(sl.service_key)
        if gone and any(ep.addresses and ep.addresses[0] in gone for ep in sl.endpoints):
            sl = replace(sl, endpoints=tuple(
                replace(ep, ready=False, serving=False) if ep.addresses and ep.addresses[0] in gone else ep
                for ep in sl.endpoints))
            changed = True
        slices.append(sl)
    return replace(inventory, endpoint_slices=tuple(slices)) if changed else inventory
