"""The static skeleton of both tables (kube-proxy's base chains, jump chains and shared
sets and maps), and the per-family parameters derived from the node config that every
Service's objects are built with as well (`FamilyContext`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.compile import layout
from reconciler.compile.nodeports import NodePortAddressesError, select_nodeport_ips
from reconciler.compile.parse import CompileError, collapse_nets, family_of, parse_ip, parse_net, set_literal
from reconciler.compile.ruleset import FAMILIES, BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table, \
    check_atom, check_name
from reconciler.intake import Inventory, NftSpelling, NodeConfig

TABLE_COMMENT = "rules for nftrec"

# kube-proxy's static object names
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
    spelling: NftSpelling = NftSpelling()  # what the target's nft accepts

    @property
    def sharded(self) -> bool:
        """The sharded layout: endpoint maps, the shared affinity set and hairpin shards."""
        return self.layout == "sharded"

    @property
    def index_maps(self) -> bool:
        """The sharded layout's endpoint maps by index range (else kube-proxy's anonymous
        map per Service port: nft before 1.0 writes no `typeof … : verdict`)."""
        return self.sharded and self.spelling.index_maps

    @property
    def shared_affinity(self) -> bool:
        """The sharded layout's one affinity set (else kube-proxy's set per endpoint: nft
        before 1.0 puts no numgen in a concatenation)."""
        return self.sharded and self.spelling.shared_affinity

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
        return f"{self.family} saddr {op}{set_literal(cidrs, ', ')}"

    @property
    def if_local(self) -> str:
        return self.saddr_in(self.cluster_cidrs, negate=False)

    @property
    def if_not_local(self) -> str:
        return self.saddr_in(self.cluster_cidrs, negate=True)


def family_context(config: NodeConfig, family: str) -> FamilyContext:
    if family not in FAMILIES:
        raise CompileError(f"unsupported family {family!r}")
    if not 0 <= config.masquerade_bit <= 31:
        raise CompileError(f"masqueradeBit must be 0..31, got {config.masquerade_bit!r}")
    node_ips = [parse_ip(ip, "nodeIPs") for ip in config.node_ips]
    fam_ips = [ip for ip in node_ips if family_of(ip) == family]
    primary = next((ip for ip in fam_ips if not ip.is_loopback), None)

    cluster = [parse_net(c, "clusterCIDRs") for c in config.cluster_cidrs]
    cluster = collapse_nets(n for n in cluster if family_of(n) == family)

    # nodePortAddresses (compile/nodeports.py): the node's interface
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
        spelling=config.spelling,
    )


def _layout(config: NodeConfig) -> str:
    value = getattr(config, "layout", layout.DEFAULT_LAYOUT)
    if value not in layout.LAYOUTS:
        raise CompileError(f"layout must be one of {', '.join(layout.LAYOUTS)}, got {value!r}")
    return value


# --- the static part ---------------------------------------------------------------------

BASE_CHAINS = (  # kube-proxy's, in creation order
    ("filter-prerouting-pre-dnat", BaseHook("filter", "prerouting", -110)),
    ("filter-output-pre-dnat", BaseHook("filter", "output", -110)),
    ("filter-input", BaseHook("filter", "input", 0)),
    ("filter-forward", BaseHook("filter", "forward", 0)),
    ("filter-output", BaseHook("filter", "output", 0)),
    ("nat-prerouting", BaseHook("nat", "prerouting", -100)),
    ("nat-output", BaseHook("nat", "output", -100)),
    ("nat-postrouting", BaseHook("nat", "postrouting", 100)),
)

JUMPS = (  # kube-proxy's (from, extra, to), in order
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
    if ctx.sharded:
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
    if ctx.shared_affinity:
        sets.append(layout.affinity_set(ctx.family, ctx.addr_type))
    return sets


def hairpin_set_of(ctx: FamilyContext, ip: str) -> str:
    """The set holding the hairpin element of local endpoint `ip`."""
    return layout.hairpin_set(ip) if ctx.sharded else HAIRPIN


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
            Rule(layout.hairpin_dispatch(ipx) if ctx.sharded else
                 f"ct status dnat {ipx} saddr . {ipx} daddr . meta l4proto . th dport "
                 f"@{HAIRPIN} masquerade fully-random"),
        )),
        Chain(CLUSTER_IPS_CHECK, tuple(cluster_check)),
        Chain(REJECT_CHAIN, (Rule("reject"),),
              comment="helper for @no-endpoint-services / @no-endpoint-nodeports"),
    ]
    if ctx.sharded:
        chains += layout.hairpin_chains(ctx.family)
    return chains


def service_cidrs_for(config: NodeConfig, inventory: Inventory, family: str) -> tuple[str, ...]:
    """config.serviceCIDRs plus every ServiceCIDR object's CIDRs, this family only."""
    nets = [parse_net(c, "serviceCIDRs") for c in config.service_cidrs]
    for sc in inventory.service_cidrs:
        nets += [parse_net(c, f"ServiceCIDR {sc.name}") for c in sc.cidrs]
    return collapse_nets(n for n in nets if family_of(n) == family)


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
