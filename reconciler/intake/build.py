"""Validated documents -> the typed model (reconciler.intake.model), with Kubernetes' defaults.

Pipeline position: load -> validate -> **model** -> compile -> ...

Only documents that passed validation reach this stage, so nothing here re-checks input;
it fills in defaults the way the API server would and normalises IPs and CIDRs to the
canonical text form (`ipaddress`), so equal values compare equal downstream.
"""

from __future__ import annotations

from typing import Callable

from reconciler.intake import model
from reconciler.intake.load import Document
from reconciler.intake.probes import probe_from
from reconciler.intake.schemas import parse_cidr, parse_ip, parse_padded_cidr
from reconciler.intake.validate import SERVICE_NAME_LABEL, family


def _ip(text: str) -> str:
    return str(parse_ip(text))


def _cidr(text: str) -> str:
    return str(parse_cidr(text))  # network form: 10.1.2.3/8 -> 10.0.0.0/8


def _meta(doc: Document) -> tuple[str, str]:
    meta = doc.data.get("metadata") or {}
    return meta.get("namespace") or "default", meta["name"]


def service_from(doc: Document) -> model.Service:
    ns, name = _meta(doc)
    spec = doc.data.get("spec") or {}
    stype = spec.get("type") or "ClusterIP"
    cips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    if stype == "ExternalName" or "None" in cips:
        cips = []  # headless / ExternalName: no virtual IP
    cluster_ips = tuple(_ip(ip) for ip in cips)
    families = tuple(spec.get("ipFamilies") or (family(ip) for ip in cluster_ips))
    ports = tuple(
        model.ServicePort(
            name=p.get("name") or "",
            protocol=p.get("protocol") or "TCP",
            port=p["port"],
            target_port=p.get("targetPort") or p["port"],  # unset -> the port itself
            node_port=p.get("nodePort") or 0,
        )
        for p in spec.get("ports") or []
    )
    ingress = tuple(
        model.LoadBalancerIngress(ip=_ip(i["ip"]), ip_mode=i.get("ipMode"))
        for i in ((doc.data.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        if i.get("ip")  # hostname-only entries have nothing to program
    )
    timeout = ((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}).get("timeoutSeconds") or 10800
    if (spec.get("sessionAffinity") or "None") != "ClientIP":
        timeout = 10800  # SetDefaults_Service drops sessionAffinityConfig unless ClientIP
    return model.Service(
        namespace=ns,
        name=name,
        type=stype,
        cluster_ips=cluster_ips,
        ip_families=families if stype != "ExternalName" else (),
        ports=ports,
        external_ips=tuple(_ip(ip) for ip in spec.get("externalIPs") or []),
        # trimmed as Kubernetes and kube-proxy trim them; canonical, so no space reaches nft
        load_balancer_source_ranges=tuple(str(parse_padded_cidr(c)) for c in spec.get("loadBalancerSourceRanges") or []),
        load_balancer_ingress=ingress,
        external_traffic_policy=spec.get("externalTrafficPolicy") or "Cluster",
        internal_traffic_policy=spec.get("internalTrafficPolicy") or "Cluster",
        session_affinity=spec.get("sessionAffinity") or "None",
        affinity_timeout_seconds=timeout,
        health_check_node_port=spec.get("healthCheckNodePort") or 0,
        traffic_distribution=spec.get("trafficDistribution") or None,
        readiness_probe=probe_from(doc.data),
        source=doc.source,
    )


def _endpoint_port(p: dict) -> model.EndpointPort:
    return model.EndpointPort(name=p.get("name") or "", protocol=p.get("protocol") or "TCP", port=p["port"])


def slice_from(doc: Document) -> model.EndpointSlice:
    ns, name = _meta(doc)
    data = doc.data
    at = data["addressType"]
    endpoints = []
    for ep in data.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        ready = cond.get("ready")
        serving = cond.get("serving")
        hints = ep.get("hints")
        zones = nodes = None
        if isinstance(hints, dict):
            if hints.get("forZones") is not None:
                zones = tuple(z["name"] for z in hints["forZones"])
            if hints.get("forNodes") is not None:
                nodes = tuple(n["name"] for n in hints["forNodes"])
        endpoints.append(model.Endpoint(
            addresses=tuple(_ip(a) if at != "FQDN" else a for a in ep["addresses"]),
            # Kubernetes' nil defaults, as kube-proxy's endpointslicecache reads them
            ready=ready is None or ready,
            serving=serving is None or serving,
            terminating=bool(cond.get("terminating")),
            node_name=ep.get("nodeName"),
            zone=ep.get("zone"),
            hint_zones=zones,
            hint_nodes=nodes,
        ))
    return model.EndpointSlice(
        namespace=ns, name=name, service_name=data["metadata"]["labels"][SERVICE_NAME_LABEL], address_type=at,
        endpoints=tuple(endpoints), ports=tuple(_endpoint_port(p) for p in data.get("ports") or []), source=doc.source,
    )


def slices_from_endpoints(doc: Document) -> list[model.EndpointSlice]:
    """Legacy v1 Endpoints -> one slice per subset and family, as Kubernetes' mirroring
    controller does: notReadyAddresses become ready=False (serving stays nil -> True)."""
    ns, name = _meta(doc)
    out = []
    for s, subset in enumerate(doc.data.get("subsets") or []):
        ports = tuple(_endpoint_port(p) for p in subset.get("ports") or [])
        addrs = [(a, True) for a in subset.get("addresses") or []] + [(a, False) for a in subset.get("notReadyAddresses") or []]
        for fam in ("IPv4", "IPv6"):
            eps = tuple(
                model.Endpoint(addresses=(_ip(a["ip"]),), ready=ready, node_name=a.get("nodeName"))
                for a, ready in addrs if family(_ip(a["ip"])) == fam
            )
            if eps:
                out.append(model.EndpointSlice(
                    namespace=ns, name=f"{name}-subset{s}-{fam.lower()}", service_name=name, address_type=fam,
                    endpoints=eps, ports=ports, source=doc.source,
                ))
    return out


def service_cidr_from(doc: Document) -> model.ServiceCIDR:
    return model.ServiceCIDR(name=doc.data["metadata"]["name"], cidrs=tuple(_cidr(c) for c in doc.data["spec"]["cidrs"]),
                             source=doc.source)


def model_objects(o) -> list:
    """The model objects one validated document (validate.Obj) makes: a legacy Endpoints
    makes one slice per subset and family, every other kind exactly one object."""
    if o.kind == "Service":
        return [service_from(o.doc)]
    if o.kind == "EndpointSlice":
        return [slice_from(o.doc)]
    if o.kind == "Endpoints":
        return slices_from_endpoints(o.doc)
    return [service_cidr_from(o.doc)]


def build_inventory(objects, revision: str, make: Callable[[object], list] = model_objects) -> model.Inventory:
    """The model from the valid objects of a validation run (`make` lets the watch loop
    reuse model objects of unchanged documents)."""
    services, slices, cidrs = [], [], []
    for o in objects:
        for m in make(o):
            if isinstance(m, model.Service):
                services.append(m)
            elif isinstance(m, model.EndpointSlice):
                slices.append(m)
            else:
                cidrs.append(m)
    return model.Inventory(services=tuple(services), endpoint_slices=tuple(slices), service_cidrs=tuple(cidrs),
                           revision=revision)
