"""One Service's objects (its fragment): per Service port and family, kube-proxy's
policy, external and firewall chains, its endpoint chains for ClientIP affinity, and its
elements of the skeleton's shared sets and maps; and the whole desired ruleset, the
skeleton with every Service's fragment assembled into it (`compile_ruleset`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from reconciler.compile import layout, naming
from reconciler.compile.assemble import assemble
from reconciler.compile.parse import CompileError, family_of, name_part, parse_ip, parse_net, parse_port, \
    parse_proto, set_literal
from reconciler.compile.ruleset import FAMILIES, Chain, Element, NamedSet, Rule, Ruleset, check_atom, \
    check_comment, check_name
from reconciler.compile.skeleton import CLUSTER_IPS, FIREWALL_IPS, NO_EP_NODEPORTS, NO_EP_SERVICES, \
    REJECT_CHAIN, SERVICE_IPS, SERVICE_NODEPORTS, FamilyContext, compile_static, family_context, \
    hairpin_set_of
from reconciler.compile.topology import EndpointInfo, categorize_endpoints, derive_hints, endpoints_for_port
from reconciler.intake import EndpointSlice, Inventory, NodeConfig, Service, ServicePort

@dataclass
class FamilyFragment:
    """One Service's objects in one family's table."""

    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, NamedSet] = field(default_factory=dict)  # affinity sets
    # (static set/map name, element key) → element
    elements: dict[tuple[str, tuple[str, ...]], Element] = field(default_factory=dict)
    # layout "sharded": endpoint selections by index range, placed by `assemble`
    # (the chain holds the offset-0 rule text until then)
    picks: list[layout.Pick] = field(default_factory=list)

    def add_chain(self, chain: Chain) -> None:
        check_name(chain.name)
        self.chains.setdefault(chain.name, chain)

    def add_element(self, set_name: str, element: Element) -> None:
        self.elements.setdefault((set_name, element.key), element)


@dataclass
class ServiceFragment:
    service_key: str  # "namespace/name"
    families: dict[str, FamilyFragment] = field(default_factory=dict)


def cluster_ip_for(service: Service, family: str) -> str | None:
    """kube-proxy's GetClusterIPByFamily: with ipFamilies, the clusterIPs entry at the
    index of this family; without, the (first) clusterIP if its family matches."""
    if service.type == "ExternalName" or service.headless:
        return None
    if service.ip_families:
        want = "IPv4" if family == "ip" else "IPv6"
        for i, fam in enumerate(service.ip_families):
            if fam == want and i < len(service.cluster_ips):
                candidate = service.cluster_ips[i]
                break
        else:
            return None
    else:
        candidate = service.cluster_ips[0]
    if candidate in ("", "None"):
        return None
    ip = parse_ip(candidate, f"Service {service.key} clusterIP")
    return str(ip) if family_of(ip) == family else None


def ips_of_family(values: Iterable[str], family: str, what: str) -> list[str]:
    out: list[str] = []
    for v in values:
        ip = parse_ip(v, what)
        if family_of(ip) == family and str(ip) not in out:
            out.append(str(ip))
    return out


def compile_service(
    service: Service, slices: Iterable[EndpointSlice], config: NodeConfig,
    contexts: dict[str, FamilyContext] | None = None,
) -> ServiceFragment:
    """All objects of one Service in both families. `slices` may hold any slices; only
    those of this Service are used. `contexts` lets callers reuse family_context()."""
    key = f"{name_part(service.namespace, 'namespace')}/{name_part(service.name, 'Service name')}"
    mine = [s for s in slices if s.namespace == service.namespace and s.service_name == service.name]
    # trafficDistribution without hints: the hints the EndpointSlice controller would write
    mine, _derived = derive_hints(service, mine, config)
    frag = ServiceFragment(key)
    for family in FAMILIES:
        ctx = (contexts or {}).get(family) or family_context(config, family)
        ff = FamilyFragment()
        cip = cluster_ip_for(service, family)
        if cip is not None:
            # Ports sorted: the output must not depend on the manifest's port order.
            for port in sorted(service.ports, key=lambda p: (p.name, p.protocol, p.port)):
                _compile_port(service, port, cip, mine, ctx, ff)
        frag.families[family] = ff
    return frag


def _compile_port(service: Service, port: ServicePort, cluster_ip: str,
                  slices: Sequence[EndpointSlice], ctx: FamilyContext, ff: FamilyFragment) -> None:
    fam = ctx.family
    what = f"Service {service.key} port {port.name!r}"
    proto = parse_proto(port.protocol, what)
    svc_port = str(parse_port(port.port, what))
    node_port = parse_port(port.node_port, what + " nodePort") if port.node_port else 0
    pname = name_part(port.name, what + " name")
    comment = check_comment(naming.truncate_comment(
        naming.service_port_name(service.namespace, service.name, pname)))

    base = naming.service_port_chain_base(service.namespace, service.name, pname, proto)
    cluster_chain = check_name(naming.service_chain(base))
    local_chain = check_name(naming.local_chain(base))
    ext_chain = check_name(naming.external_chain(base))
    fw_chain = check_name(naming.firewall_chain(base))

    external_ips = ips_of_family(service.external_ips, fam, f"Service {service.key} externalIPs")
    lb_vips = ips_of_family(
        (i.ip for i in service.load_balancer_ingress if i.ip and i.ip_mode in (None, "VIP")),
        fam, f"Service {service.key} loadBalancer ingress")
    ranges = _dedupe(
        n for n in (parse_net(r, f"Service {service.key} loadBalancerSourceRanges")
                    for r in service.load_balancer_source_ranges) if family_of(n) == fam)

    # apiservice.ExternalPolicyLocal: eTP counts for a Service that is ExternallyAccessible
    # as a whole (type NodePort or LoadBalancer, or type ClusterIP with externalIPs of
    # any family); UsesLocalEndpoints below also needs this family to be reachable.
    etp_local = (service.type in ("NodePort", "LoadBalancer")
                 or (service.type == "ClusterIP" and bool(service.external_ips))
                 ) and service.external_traffic_policy == "Local"
    itp_local = service.internal_traffic_policy == "Local"
    externally_accessible = bool(node_port or lb_vips or external_ips)
    uses_cluster = not itp_local or externally_accessible
    uses_local = itp_local or (etp_local and externally_accessible)
    affinity = service.session_affinity == "ClientIP"

    endpoints = endpoints_for_port(slices, fam, port, ctx.node_name)
    cat = categorize_endpoints(endpoints, uses_cluster=uses_cluster, uses_local=uses_local,
                               zone=ctx.zone, node_name=ctx.node_name)
    cluster_eps = cat.cluster or ()
    local_eps = cat.local or ()
    has_eps = cat.has_any

    def ep_base(ep: EndpointInfo) -> str:
        return naming.endpoint_chain_base(service.namespace, service.name, pname, proto, ep.string)

    # hairpin-connections: every local endpoint reachable from here
    for ep in cat.all_reachable:
        if ep.is_local:
            ff.add_element(hairpin_set_of(ctx, ep.ip), Element((ep.ip, ep.ip, proto, str(ep.port))))

    uses_cluster_chain = bool(cluster_eps) and uses_cluster
    uses_local_chain = bool(local_eps) and uses_local

    internal_chain, has_internal = cluster_chain, has_eps
    if itp_local:
        internal_chain, has_internal = local_chain, bool(local_eps)
        has_internal = has_internal and has_eps
    external_policy_chain, has_external = cluster_chain, has_eps
    if etp_local:
        external_policy_chain, has_external = local_chain, bool(local_eps) and has_eps
    uses_ext_chain = has_eps and externally_accessible

    if not has_eps:
        internal_verdict = external_verdict = f"goto {REJECT_CHAIN}"
    else:
        internal_verdict = external_verdict = "drop"

    # --- elements ---
    ff.add_element(CLUSTER_IPS, Element((cluster_ip,)))
    ckey = (cluster_ip, proto, svc_port)
    if has_internal:
        ff.add_element(SERVICE_IPS, Element(ckey, f"goto {internal_chain}"))
    else:
        ff.add_element(NO_EP_SERVICES, Element(ckey, internal_verdict, comment))
    for ip in external_ips:
        k = (ip, proto, svc_port)
        if has_eps:
            ff.add_element(SERVICE_IPS, Element(k, f"goto {ext_chain}"))
        if not has_external:
            ff.add_element(NO_EP_SERVICES, Element(k, external_verdict, comment))
    uses_fw = bool(lb_vips) and bool(ranges)
    for ip in lb_vips:
        k = (ip, proto, svc_port)
        if has_eps:
            ff.add_element(SERVICE_IPS, Element(k, f"goto {ext_chain}"))
        if uses_fw:
            ff.add_element(FIREWALL_IPS, Element(k, f"goto {fw_chain}"))
        if not has_external:
            ff.add_element(NO_EP_SERVICES, Element(k, external_verdict, comment))
    if node_port:
        k = (proto, str(node_port))
        if has_eps:
            ff.add_element(SERVICE_NODEPORTS, Element(k, f"goto {ext_chain}"))
        if not has_external:
            ff.add_element(NO_EP_NODEPORTS, Element(k, external_verdict, comment))

    # --- chains ---
    affinity_chains: list[Chain] = []
    if affinity:
        timeout = int(service.affinity_timeout_seconds)
        if not 1 <= timeout <= 86400:
            raise CompileError(f"Service {service.key}: sessionAffinity timeout {timeout} "
                               "is outside 1..86400 seconds")
        shared = ctx.shared_affinity
        for ep in cat.all_reachable:
            b = ep_base(ep)
            aset = check_name(naming.affinity_set(b))
            if shared:  # the same update, into the shared set, with the Service's timeout
                update = (f"update @{layout.AFFINITY_SET} {{ {layout.affinity_key(fam, aset)} "
                          f"timeout {timeout}s }}")
            else:
                ff.sets.setdefault(aset, NamedSet(aset, ctx.addr_type, flags=("dynamic", "timeout"),
                                                  timeout=timeout))
                update = f"update @{aset} {{ {fam} saddr }}"
            affinity_chains.append(Chain(check_name(naming.endpoint_chain(b)), (
                Rule(update),
                Rule(f"meta l4proto {proto} dnat to {check_atom(ep.string)}"),
            )))


    def policy_rules(chain: str, eps: Sequence[EndpointInfo]) -> tuple[Rule, ...]:
        # kube-proxy writes an anonymous map for N > 1 endpoints, and for ClientIP
        # affinity an anonymous vmap for any N: each becomes an index range here
        if ctx.index_maps and (affinity or len(eps) > 1):
            if affinity:
                pick = layout.vmap_pick(fam, chain, tuple(
                    f"goto {check_name(naming.endpoint_chain(ep_base(e)))}" for e in eps))
                jumps = _affinity_jumps(fam, eps, ep_base, ctx.shared_affinity)[:-1]
            else:
                pick = layout.dnat_pick(fam, chain, proto, tuple(f"{check_atom(e.ip)} . {e.port}" for e in eps))
                jumps = ()
            ff.picks.append(pick)
            return jumps + (layout.pick_rule(pick, 0),)
        if affinity:
            return _affinity_jumps(fam, eps, ep_base, ctx.shared_affinity)
        return (_dnat_rule(fam, proto, eps),)

    if uses_cluster_chain:
        ff.add_chain(Chain(cluster_chain, policy_rules(cluster_chain, cluster_eps)))
    if uses_local_chain:
        ff.add_chain(Chain(local_chain, policy_rules(local_chain, local_eps)))
    if uses_ext_chain:
        rules: list[Rule] = []
        if not etp_local:
            rules.append(Rule(ctx.masquerade_rule, "masquerade"))
        else:
            if ctx.cluster_cidrs:
                rules.append(Rule(f"{ctx.if_local} goto {cluster_chain}", "short-circuit pod traffic"))
            rules.append(Rule(f"fib saddr type local {ctx.masquerade_rule}", "masquerade local traffic"))
            rules.append(Rule(f"fib saddr type local goto {cluster_chain}", "short-circuit local traffic"))
        if has_external:
            rules.append(Rule(f"goto {external_policy_chain}"))
        ff.add_chain(Chain(ext_chain, tuple(rules)))
    if uses_fw:
        sources = list(ranges)
        if ctx.node_ip is not None and any(
                ipaddress.ip_address(ctx.node_ip) in ipaddress.ip_network(r) for r in ranges):
            # VIP-style LBs loop node-originated traffic back with the VIP as source.
            sources += [ip for ip in lb_vips if ip not in sources]
        if ctx.sharded and len(sources) <= layout.FIREWALL_RULES_MAX:
            # the same test without kube-proxy's anonymous set (layout.py): `return`
            # leaves this goto'd chain exactly as running off its end does
            fw_rules = tuple(Rule(f"{fam} saddr {check_atom(src)} return") for src in sources) + (Rule("drop"),)
        else:
            fw_rules = (Rule(f"{fam} saddr != {set_literal(sources, ' , ')} drop"),)
        ff.add_chain(Chain(fw_chain, fw_rules))
    for c in affinity_chains:
        ff.add_chain(c)


def _dedupe(nets: Iterable) -> tuple[str, ...]:
    """Source ranges in the Service's order (kube-proxy's text), duplicates dropped."""
    out: list[str] = []
    for n in nets:
        if str(n) not in out:
            out.append(str(n))
    return tuple(out)


def _dnat_rule(fam: str, proto: str, eps: Sequence[EndpointInfo]) -> Rule:
    """1 endpoint → plain `dnat to`; N → one numgen map (as kube-proxy since it dropped the per-endpoint rules)."""
    if len(eps) == 1:
        return Rule(f"meta l4proto {proto} dnat to {check_atom(eps[0].string)}")
    elems = " , ".join(f"{i} : {check_atom(e.ip)} . {e.port}" for i, e in enumerate(eps))
    return Rule(f"meta l4proto {proto} dnat {fam} addr . port to "
                f"numgen random mod {len(eps)} map {{ {elems} }}")


def _affinity_jumps(fam: str, eps: Sequence[EndpointInfo], ep_base, shared: bool) -> tuple[Rule, ...]:
    rules = []
    vmap = []
    for i, ep in enumerate(eps):
        b = ep_base(ep)
        aset, echain = check_name(naming.affinity_set(b)), naming.endpoint_chain(b)
        lookup = f"{layout.affinity_key(fam, aset)} @{layout.AFFINITY_SET}" if shared else f"{fam} saddr @{aset}"
        rules.append(Rule(f"{lookup} goto {check_name(echain)}"))
        vmap.append(f"{i} : goto {echain}")
    rules.append(Rule(f"numgen random mod {len(eps)} vmap {{ {' , '.join(vmap)} }}"))
    return tuple(rules)


def slices_by_service(slices: Iterable[EndpointSlice]) -> dict[str, list[EndpointSlice]]:
    out: dict[str, list[EndpointSlice]] = {}
    for s in slices:
        out.setdefault(s.service_key, []).append(s)
    return out


def compile_ruleset(inventory: Inventory, config: NodeConfig, previous: Ruleset | None = None,
                    fragment=compile_service) -> Ruleset:
    """The whole desired ruleset: both tables, always (see docs for why). `previous`
    (layout "sharded"): a ruleset whose index ranges are kept where they fit, e.g. the
    last applied one; None allocates from scratch (a pure function of the input).
    `fragment`: compile_service, or a memo of its results (the fleet review's)."""
    contexts = {f: family_context(config, f) for f in FAMILIES}
    by_svc = slices_by_service(inventory.endpoint_slices)
    fragments = [fragment(svc, by_svc.get(svc.key, ()), config, contexts)
                 for svc in sorted(inventory.services, key=lambda s: (s.namespace, s.name))]
    return assemble(compile_static(config, inventory), fragments, layout.allocation_of(previous))[0]
