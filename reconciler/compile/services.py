"""Compile the model (Inventory + NodeConfig) into the desired Ruleset.

Pipeline position: model → **compile** → ruleset → render / diff.

The output is kube-proxy's current nftables layout (reference §2-§7 plus §12 items 1-5
and 7): one table per family, the static skeleton (base chains, jump chains, the shared
sets/maps), and per Service port its policy/external/firewall chains, affinity endpoint
chains, and elements in the shared sets/maps. With `layout: sharded` (the default) the
endpoint choice of a policy chain is an index range of a shared map instead of an
anonymous map (compile/layout.py); everything else is the same.

Pure and deterministic: no I/O, Services and slices are processed in sorted order, so the
same input in any order gives the identical Ruleset. The whole ruleset is
`static part + union of per-Service fragments` (`compile_static`, `compile_service`,
`assemble`), so the watch loop can recompile only the Services that changed.

Safety: every string that comes from input is parsed (IPs, CIDRs) or checked
(`check_name`, `check_comment`, `check_atom`) before it is placed into a rule body or
element; anything else raises `NftSyntaxError` (or `CompileError`, a subclass), never a
half-checked rule.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from reconciler.compile import layout, naming
from reconciler.compile.nodeports import NodePortAddressesError, select_nodeport_ips
from reconciler.compile.topology import available_for_topology, derive_hints, topology_mode
from reconciler.intake import Endpoint, EndpointSlice, Inventory, NodeConfig, Service, ServicePort
from reconciler.compile.ruleset import (
    FAMILIES,
    BaseHook,
    Chain,
    Element,
    NamedSet,
    NftSyntaxError,
    Rule,
    Ruleset,
    Table,
    chain_id,
    check_atom,
    check_comment,
    check_name,
    element_id,
    set_id,
)

TABLE_COMMENT = "rules for nftrec"

# static object names (reference §2, §3, §12)
CLUSTER_IPS = "cluster-ips"
NODEPORT_IPS = "nodeport-ips"
HAIRPIN = "hairpin-connections"
NO_EP_SERVICES = "no-endpoint-services"
NO_EP_NODEPORTS = "no-endpoint-nodeports"
FIREWALL_IPS = "firewall-ips"
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"

NODEPORT_EP_CHECK = "nodeport-endpoints-check"
SERVICE_EP_CHECK = "service-endpoints-check"
FIREWALL_CHECK = "firewall-check"
SERVICES = "services"
MASQUERADING = "masquerading"
CLUSTER_IPS_CHECK = "cluster-ips-check"
REJECT_CHAIN = "reject-chain"

FAMILY_OF_VERSION = {4: "ip", 6: "ip6"}
ADDRESS_TYPE_FAMILY = {"IPv4": "ip", "IPv6": "ip6"}
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


class CompileError(NftSyntaxError):
    """Input the compiler refuses to turn into rules (it would be unsafe or ambiguous)."""


# --- small parsing helpers: every input string passes one of these --------------------


def _ip(text: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # '%' would smuggle an IPv6 scope id (arbitrary text) through ipaddress.
    if not isinstance(text, str) or "%" in text:
        raise CompileError(f"{what}: not an IP address: {text!r}")
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise CompileError(f"{what}: not an IP address: {text!r}") from None


def _net(text: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(text, str) or "%" in text:
        raise CompileError(f"{what}: not a CIDR: {text!r}")
    try:
        # strict=False: net.IPNet.String() masks host bits (kube-proxy's rendering).
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise CompileError(f"{what}: not a CIDR: {text!r}") from None


def _fam(addr) -> str:
    return FAMILY_OF_VERSION[addr.version]


def _port(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise CompileError(f"{what}: not a port number: {value!r}")
    return value


def _proto(value: str, what: str) -> str:
    try:
        return PROTOCOLS[value]
    except (KeyError, TypeError):
        raise CompileError(f"{what}: unsupported protocol {value!r}") from None


def _name_part(value: str, what: str) -> str:
    # '/' separates the parts of kube-proxy's chain names; allowing it in a part would
    # let two Services produce the same chain name. The rest is checked by check_name
    # on the whole chain name and check_comment on the element comment.
    if not isinstance(value, str) or "/" in value:
        raise CompileError(f"{what}: not a valid name: {value!r}")
    return value


def _set_literal(items: Sequence[str], sep: str) -> str:
    return "{ " + sep.join(check_atom(i) for i in items) + " }"


# --- per-family parameters derived from the node config ------------------------------


@dataclass(frozen=True)
class FamilyContext:
    """Everything about one family's proxier that does not depend on a Service."""

    family: str  # "ip" | "ip6"
    node_name: str
    zone: str
    node_ip: str | None  # the primary node IP of this family (firewall allow-from-node)
    cluster_cidrs: tuple[str, ...]  # local-traffic detector; () = not implemented
    masquerade_all: bool
    mark: str  # "0x00004000"
    nodeport_match_all: bool
    nodeport_ips: tuple[str, ...]  # elements of nodeport-ips (when not match-all)
    layout: str = layout.DEFAULT_LAYOUT  # "sharded" | "kube-proxy" (compile/layout.py)

    @property
    def addr_type(self) -> str:
        return "ipv4_addr" if self.family == "ip" else "ipv6_addr"

    @property
    def not_localhost(self) -> str:
        return "ip daddr != 127.0.0.0/8" if self.family == "ip" else "ip6 daddr != ::1"

    @property
    def masquerade_rule(self) -> str:
        return f"mark set mark or {self.mark}"

    def saddr_in(self, cidrs: Sequence[str], negate: bool) -> str:
        """Detector text: `ip saddr 10.0.0.0/8`; several CIDRs as an anonymous set."""
        op = "!= " if negate else ""
        if len(cidrs) == 1:
            return f"{self.family} saddr {op}{check_atom(cidrs[0])}"
        return f"{self.family} saddr {op}{_set_literal(cidrs, ', ')}"

    @property
    def if_local(self) -> str:
        return self.saddr_in(self.cluster_cidrs, negate=False)

    @property
    def if_not_local(self) -> str:
        return self.saddr_in(self.cluster_cidrs, negate=True)


def _collapse(nets: Iterable) -> tuple[str, ...]:
    """Sorted, overlap-free CIDR strings (same packets matched, nft never sees overlap)."""
    return tuple(str(n) for n in ipaddress.collapse_addresses(sorted(set(nets))))


def family_context(config: NodeConfig, family: str) -> FamilyContext:
    if family not in FAMILIES:
        raise CompileError(f"unsupported family {family!r}")
    if not 0 <= config.masquerade_bit <= 31:
        raise CompileError(f"masqueradeBit must be 0..31, got {config.masquerade_bit!r}")
    node_ips = [_ip(ip, "nodeIPs") for ip in config.node_ips]
    fam_ips = [ip for ip in node_ips if _fam(ip) == family]
    primary = next((ip for ip in fam_ips if not ip.is_loopback), None)

    cluster = [_net(c, "clusterCIDRs") for c in config.cluster_cidrs]
    cluster = _collapse(n for n in cluster if _fam(n) == family)

    # nodePortAddresses (reference §6, compile/nodeports.py): the node's interface
    # addresses inside the CIDRs; without a look at the interfaces (render), the node IPs.
    addresses = config.host_addresses
    if addresses is None:
        addresses = tuple(("nodeIPs", str(ip)) for ip in node_ips)
    try:
        sel = select_nodeport_ips(config.node_port_addresses, [str(ip) for ip in node_ips], addresses, family)
    except NodePortAddressesError as e:
        raise CompileError(f"nodePortAddresses: {e}") from None
    match_all, nodeport_ips = sel.match_all, sel.ips

    return FamilyContext(
        family=family,
        node_name=config.node_name,
        zone=config.zone or "",
        node_ip=str(primary) if primary is not None else None,
        cluster_cidrs=cluster,
        masquerade_all=bool(config.masquerade_all),
        mark="0x%08x" % (1 << config.masquerade_bit),
        nodeport_match_all=match_all,
        nodeport_ips=nodeport_ips,
        layout=_layout(config),
    )


def _layout(config: NodeConfig) -> str:
    value = getattr(config, "layout", layout.DEFAULT_LAYOUT)
    if value not in layout.LAYOUTS:
        raise CompileError(f"layout must be one of {', '.join(layout.LAYOUTS)}, got {value!r}")
    return value


# --- the static part ---------------------------------------------------------------------

BASE_CHAINS = (  # reference §2.1, in creation order
    ("filter-prerouting-pre-dnat", BaseHook("filter", "prerouting", -110)),
    ("filter-output-pre-dnat", BaseHook("filter", "output", -110)),
    ("filter-input", BaseHook("filter", "input", 0)),
    ("filter-forward", BaseHook("filter", "forward", 0)),
    ("filter-output", BaseHook("filter", "output", 0)),
    ("nat-prerouting", BaseHook("nat", "prerouting", -100)),
    ("nat-output", BaseHook("nat", "output", -100)),
    ("nat-postrouting", BaseHook("nat", "postrouting", 100)),
)

JUMPS = (  # reference §2.2: (from, extra, to), in order
    ("filter-input", "ct state new", NODEPORT_EP_CHECK),
    ("filter-input", "ct state new", SERVICE_EP_CHECK),
    ("filter-forward", "ct state new", SERVICE_EP_CHECK),
    ("filter-output", "ct state new", SERVICE_EP_CHECK),
    ("filter-prerouting-pre-dnat", "ct state new", FIREWALL_CHECK),
    ("filter-output-pre-dnat", "ct state new", FIREWALL_CHECK),
    ("nat-output", "", SERVICES),
    ("nat-prerouting", "", SERVICES),
    ("nat-postrouting", "", MASQUERADING),
    ("filter-forward", "ct state new", CLUSTER_IPS_CHECK),
    ("filter-output", "ct state new", CLUSTER_IPS_CHECK),
)


def _static_sets(ctx: FamilyContext) -> list[NamedSet]:
    a = ctx.addr_type
    sets = [
        NamedSet(CLUSTER_IPS, a, comment="Active ClusterIPs"),
    ]
    if not ctx.nodeport_match_all:
        nodeport = NamedSet(NODEPORT_IPS, a, comment="IPs that accept NodePort traffic")
        for ip in ctx.nodeport_ips:
            nodeport.add(Element((ip,)))
        sets.append(nodeport)
    if sharded_hairpin(ctx):
        sets += layout.hairpin_sets(ctx.family, a)
    else:
        sets.append(NamedSet(HAIRPIN, f"{a} . {a} . inet_proto . inet_service",
                             comment="service hairpin connections"))
    sets += [
        NamedSet(NO_EP_SERVICES, f"{a} . inet_proto . inet_service", "verdict",
                 comment="vmap to drop or reject packets to services with no endpoints"),
        NamedSet(NO_EP_NODEPORTS, "inet_proto . inet_service", "verdict",
                 comment="vmap to drop or reject packets to service nodeports with no endpoints"),
        NamedSet(FIREWALL_IPS, f"{a} . inet_proto . inet_service", "verdict",
                 comment="destinations that are subject to LoadBalancerSourceRanges"),
        NamedSet(SERVICE_IPS, f"{a} . inet_proto . inet_service", "verdict",
                 comment="ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        NamedSet(SERVICE_NODEPORTS, "inet_proto . inet_service", "verdict",
                 comment="NodePort traffic"),
    ]
    if shared_affinity(ctx):
        sets.append(layout.affinity_set(ctx.family, ctx.addr_type))
    return sets


def shared_affinity(ctx: FamilyContext) -> bool:
    """ClientIP affinity through the one shared set (compile/layout.py) instead of
    kube-proxy's set per endpoint."""
    return ctx.layout == "sharded"


def sharded_hairpin(ctx: FamilyContext) -> bool:
    """hairpin-connections as HAIRPIN_SHARDS sets behind a vmap (compile/layout.py)
    instead of kube-proxy's one set."""
    return ctx.layout == "sharded"


def hairpin_set_of(ctx: FamilyContext, ip: str) -> str:
    """The set holding the hairpin element of local endpoint `ip`."""
    return layout.hairpin_set(ip) if sharded_hairpin(ctx) else HAIRPIN


def _static_chains(ctx: FamilyContext, service_cidrs: Sequence[str]) -> list[Chain]:
    ipx = ctx.family
    rules: dict[str, list[Rule]] = {name: [] for name, _ in BASE_CHAINS}
    for src, extra, dst in JUMPS:
        rules[src].append(Rule(f"{extra} jump {dst}".strip()))

    if ctx.nodeport_match_all:
        np_check = f"{ctx.not_localhost} meta l4proto . th dport vmap @{NO_EP_NODEPORTS}"
        np_dispatch = (f"fib daddr type local {ctx.not_localhost} "
                       f"meta l4proto . th dport vmap @{SERVICE_NODEPORTS}")
    else:
        np_check = f"{ipx} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{NO_EP_NODEPORTS}"
        np_dispatch = f"{ipx} daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"

    services: list[Rule] = []
    if ctx.masquerade_all:
        services.append(Rule(f"{ipx} daddr @{CLUSTER_IPS} {ctx.masquerade_rule}",
                             "masquerade all clusterIP traffic"))
    elif ctx.cluster_cidrs:
        services.append(Rule(f"{ipx} daddr @{CLUSTER_IPS} {ctx.if_not_local} {ctx.masquerade_rule}",
                             "masquerade clusterIP traffic from outside cluster"))
    services.append(Rule(f"{ipx} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"))
    services.append(Rule(np_dispatch))

    cluster_check = [Rule(f"{ipx} daddr @{CLUSTER_IPS} reject",
                          "Reject traffic to invalid ports of ClusterIPs")]
    if service_cidrs:
        # kube-proxy joins with "," and no spaces: `ip daddr { 172.30.0.0/16 } drop`
        cidr_list = ",".join(check_atom(c) for c in service_cidrs)
        cluster_check.append(Rule(f"{ipx} daddr {{ {cidr_list} }} drop",
                                  "Drop traffic to unallocated ClusterIPs"))

    chains = [Chain(name, tuple(rules[name]), base=hook) for name, hook in BASE_CHAINS]
    chains += [
        Chain(NODEPORT_EP_CHECK, (Rule(np_check),)),
        Chain(SERVICE_EP_CHECK, (Rule(f"{ipx} daddr . meta l4proto . th dport vmap @{NO_EP_SERVICES}"),)),
        Chain(FIREWALL_CHECK, (Rule(f"{ipx} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"),)),
        Chain(SERVICES, tuple(services)),
        Chain(MASQUERADING, (
            Rule(f"mark and {ctx.mark} != 0 mark set mark xor {ctx.mark} masquerade fully-random"),
            Rule(layout.hairpin_dispatch(ipx) if sharded_hairpin(ctx) else
                 f"ct status dnat {ipx} saddr . {ipx} daddr . meta l4proto . th dport "
                 f"@{HAIRPIN} masquerade fully-random"),
        )),
        Chain(CLUSTER_IPS_CHECK, tuple(cluster_check)),
        Chain(REJECT_CHAIN, (Rule("reject"),),
              comment="helper for @no-endpoint-services / @no-endpoint-nodeports"),
    ]
    if sharded_hairpin(ctx):
        chains += layout.hairpin_chains(ctx.family)
    return chains


def service_cidrs_for(config: NodeConfig, inventory: Inventory, family: str) -> tuple[str, ...]:
    """config.serviceCIDRs plus every ServiceCIDR object's CIDRs, this family only."""
    nets = [_net(c, "serviceCIDRs") for c in config.service_cidrs]
    for sc in inventory.service_cidrs:
        nets += [_net(c, f"ServiceCIDR {sc.name}") for c in sc.cidrs]
    return _collapse(n for n in nets if _fam(n) == family)


def compile_static(config: NodeConfig, inventory: Inventory | None = None) -> Ruleset:
    """The Service-independent skeleton: both tables with base chains, jump chains and
    the shared sets/maps (only nodeport-ips has elements here). Owns nothing."""
    inventory = inventory or Inventory()
    table_name = check_name(config.table_name)
    rs = Ruleset()
    for family in FAMILIES:
        ctx = family_context(config, family)
        t = Table(family, table_name, comment=TABLE_COMMENT)
        for s in _static_sets(ctx):
            t.sets[s.name] = s
        for c in _static_chains(ctx, service_cidrs_for(config, inventory, family)):
            t.chains[c.name] = c
        rs.tables[family] = t
    return rs


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
        eport = _port(sport.port, f"EndpointSlice {sl.namespace}/{sl.name} port {sport.name!r}")
        for ep in sl.endpoints:
            if not ep.addresses:
                continue
            ip = _ip(ep.addresses[0], f"EndpointSlice {sl.namespace}/{sl.name} address")
            if _fam(ip) != family:
                continue  # wrong family inside the slice: never put into this table
            info = _endpoint_info(ep, str(ip), eport, node_name)
            prev = chosen.get(info.string)
            if prev is None or (prev.terminating and not info.terminating):
                chosen[info.string] = info
    return sorted(chosen.values(), key=lambda e: e.string)


def _slice_order(slices: Iterable[EndpointSlice]) -> list[EndpointSlice]:
    """Slices by (namespace, name), then by their whole content (repr) where two share
    a name. repr is taken only then: for every slice it cost ~10 % of a cold compile."""
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
    """kube-proxy's CategorizeEndpoints (reference §4.7): usable = ready, falling back
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


# --- one Service -------------------------------------------------------------------------


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
    """GetClusterIPByFamily (reference §1): with ipFamilies, the clusterIPs entry at the
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
    ip = _ip(candidate, f"Service {service.key} clusterIP")
    return str(ip) if _fam(ip) == family else None


def ips_of_family(values: Iterable[str], family: str, what: str) -> list[str]:
    out: list[str] = []
    for v in values:
        ip = _ip(v, what)
        if _fam(ip) == family and str(ip) not in out:
            out.append(str(ip))
    return out


def compile_service(
    service: Service, slices: Iterable[EndpointSlice], config: NodeConfig,
    contexts: dict[str, FamilyContext] | None = None,
) -> ServiceFragment:
    """All objects of one Service in both families. `slices` may hold any slices; only
    those of this Service are used. `contexts` lets callers reuse family_context()."""
    key = f"{_name_part(service.namespace, 'namespace')}/{_name_part(service.name, 'Service name')}"
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
    proto = _proto(port.protocol, what)
    svc_port = str(_port(port.port, what))
    node_port = _port(port.node_port, what + " nodePort") if port.node_port else 0
    pname = _name_part(port.name, what + " name")
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
        n for n in (_net(r, f"Service {service.key} loadBalancerSourceRanges")
                    for r in service.load_balancer_source_ranges) if _fam(n) == fam)

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

    # hairpin-connections: every local endpoint reachable from here (§12 item 2)
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

    # --- elements (reference §3.1) ---
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

    # --- chains (reference §4, §12) ---
    affinity_chains: list[Chain] = []
    if affinity:
        timeout = int(service.affinity_timeout_seconds)
        if not 1 <= timeout <= 86400:
            raise CompileError(f"Service {service.key}: sessionAffinity timeout {timeout} "
                               "is outside 1..86400 seconds")
        shared = shared_affinity(ctx)
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

    sharded = ctx.layout == "sharded"

    def policy_rules(chain: str, eps: Sequence[EndpointInfo]) -> tuple[Rule, ...]:
        # kube-proxy writes an anonymous map for N > 1 endpoints, and for ClientIP
        # affinity an anonymous vmap for any N: each becomes an index range here
        if sharded and (affinity or len(eps) > 1):
            if affinity:
                pick = layout.vmap_pick(fam, chain, tuple(
                    f"goto {check_name(naming.endpoint_chain(ep_base(e)))}" for e in eps))
                jumps = _affinity_jumps(fam, eps, ep_base, shared_affinity(ctx))[:-1]
            else:
                pick = layout.dnat_pick(fam, chain, proto, tuple(f"{check_atom(e.ip)} . {e.port}" for e in eps))
                jumps = ()
            ff.picks.append(pick)
            return jumps + (layout.pick_rule(pick, 0),)
        if affinity:
            return _affinity_jumps(fam, eps, ep_base, shared_affinity(ctx))
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
        if sharded and len(sources) <= layout.FIREWALL_RULES_MAX:
            # the same test without kube-proxy's anonymous set (layout.py): `return`
            # leaves this goto'd chain exactly as running off its end does
            fw_rules = tuple(Rule(f"{fam} saddr {check_atom(src)} return") for src in sources) + (Rule("drop"),)
        else:
            fw_rules = (Rule(f"{fam} saddr != {_set_literal(sources, ' , ')} drop"),)
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
    """1 endpoint → plain `dnat to`; N → one numgen map (§12 item 5, after #140723)."""
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


# --- assembling -------------------------------------------------------------------------


def add_fragment(ruleset: Ruleset, fragment: ServiceFragment) -> None:
    """Merge one Service's objects into `ruleset` and record their owner.

    Shared elements: the same hairpin-connections / cluster-ips element can come from
    several Services; it is kept once and owned by the first Service merged (fragments
    are merged in sorted key order). A map key claimed by two Services with different
    values (e.g. the same externalIP:port on two Services; validation reports it) keeps
    the first value, deterministically."""
    owner = fragment.service_key
    for family, ff in fragment.families.items():
        table = ruleset.tables[family]
        for name, s in ff.sets.items():
            if name in table.sets:
                raise CompileError(f"set {name} produced by two Services ({owner})")
            table.sets[name] = s
            ruleset.owners[set_id(family, name)] = owner
        for name, c in ff.chains.items():
            if name in table.chains:
                raise CompileError(f"chain {name} produced by two Services ({owner})")
            table.chains[name] = c
            ruleset.owners[chain_id(family, name)] = owner
        for (set_name, key), e in ff.elements.items():
            target = table.sets[set_name]
            if key in target.elements:
                continue
            target.add(e)
            ruleset.owners[element_id(family, set_name, key)] = owner


def slices_by_service(slices: Iterable[EndpointSlice]) -> dict[str, list[EndpointSlice]]:
    out: dict[str, list[EndpointSlice]] = {}
    for s in slices:
        out.setdefault(s.service_key, []).append(s)
    return out


def assemble(static: Ruleset, fragments: Iterable[ServiceFragment],
             previous: layout.Allocation | None = None) -> Ruleset:
    """static part + union of fragments (merged in Service-key order), then the index
    ranges of the sharded layout placed, keeping `previous`'s where they fit
    (layout.allocate; None: from scratch), and the hairpin shards no fragment filled
    dropped (layout.prune_hairpin). `static` is modified in place and returned."""
    return assemble_placed(static, fragments, previous)[0]


def assemble_placed(static: Ruleset, fragments: Iterable[ServiceFragment],
                    previous: layout.Allocation | None = None) -> tuple[Ruleset, layout.Allocation]:
    """assemble(), also returning the allocation made."""
    picks: list[layout.Pick] = []
    owners: dict[tuple[str, str], str] = {}
    for frag in sorted(fragments, key=lambda f: f.service_key):
        add_fragment(static, frag)
        for ff in frag.families.values():
            for p in ff.picks:
                picks.append(p)
                owners[(p.family, p.chain)] = frag.service_key
    for t in static.tables.values():
        layout.prune_hairpin(t)  # layout sharded: only the shards that hold an element
    alloc = layout.place(static, picks, owners, previous or {}) if picks else {}
    _check_references(static)
    return static, alloc


def compile_ruleset(inventory: Inventory, config: NodeConfig, previous: Ruleset | None = None) -> Ruleset:
    """The whole desired ruleset: both tables, always (see docs for why). `previous`
    (layout "sharded"): a ruleset whose index ranges are kept where they fit, e.g. the
    last applied one; None allocates from scratch (a pure function of the input)."""
    contexts = {f: family_context(config, f) for f in FAMILIES}
    by_svc = slices_by_service(inventory.endpoint_slices)
    fragments = [compile_service(svc, by_svc.get(svc.key, ()), config, contexts)
                 for svc in sorted(inventory.services, key=lambda s: (s.namespace, s.name))]
    return assemble(compile_static(config, inventory), fragments, layout.allocation_of(previous))


def check_fragment_references(ruleset: Ruleset, fragment: ServiceFragment) -> None:
    """_check_references for one Service's chains and elements in an assembled ruleset
    (an incremental assembly: the rest was checked when it was assembled)."""
    for family, ff in fragment.families.items():
        table = ruleset.tables[family]
        _check_chains(table, [table.chains[n] for n in ff.chains])
        for set_name, key in ff.elements:
            e = table.sets[set_name].elements.get(key)
            if e is not None and e.value and e.value.startswith("goto ") and e.value[5:] not in table.chains:
                raise CompileError(f"{table.family} {set_name}: goto missing chain {e.value[5:]}")
        for p in ff.picks:
            for v in p.values:
                if v.startswith("goto ") and v[5:] not in table.chains:
                    raise CompileError(f"{table.family} {p.map}: goto missing chain {v[5:]}")


def _check_chains(table, chains) -> None:
    for chain in chains:
        for rule in chain.rules:
            words = rule.body.replace("{", " ").replace("}", " ").split()
            for i, w in enumerate(words[:-1]):
                if w in ("goto", "jump") and words[i + 1] not in table.chains:
                    raise CompileError(f"{table.family} chain {chain.name}: "
                                       f"{w} to missing chain {words[i + 1]}")
            for w in words:
                if w.startswith("@") and w[1:] not in table.sets:
                    raise CompileError(f"{table.family} chain {chain.name}: "
                                       f"missing set {w}")


def _check_references(ruleset: Ruleset) -> None:
    """Every jump/goto target and every @set in a rule must exist: catches compiler bugs
    before nft does (a dangling goto would fail the whole transaction)."""
    for table in ruleset.tables.values():
        _check_chains(table, table.chains.values())
        for s in table.sets.values():
            for e in s.elements.values():
                if e.value and e.value.startswith("goto ") and e.value[5:] not in table.chains:
                    raise CompileError(f"{table.family} {s.name}: goto missing chain {e.value[5:]}")
