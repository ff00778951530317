"""The typed model: plain data built from validated manifests and the node config.

Pipeline position: load → validate → **model** → compile → ...
Every value here is already checked and normalised (IPs in canonical form, protocols
upper-case as Kubernetes spells them, Kubernetes' defaults filled in), so the compiler
never re-validates and never sees raw YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """Where a document (or a field inside it) came from; lines and columns are 1-based."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


# --- Service ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A Kubernetes readiness Probe from the annotation probe.nftrec.io/readiness,
    with the kubelet's defaults filled in. `handler` is "httpGet", "tcpSocket" or "grpc";
    `port` a number or the name of an EndpointSlice port (resolved per slice)."""

    handler: str
    port: int | str
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    grpc_service: str = ""
    initial_delay_seconds: int = 0
    timeout_seconds: int = 1
    period_seconds: int = 10
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True)
class ServicePort:
    name: str  # "" when the Service has a single unnamed port
    protocol: str  # "TCP" | "UDP" | "SCTP"
    port: int
    target_port: int | str  # a number, or the name of an endpoint port
    node_port: int = 0  # 0: none


@dataclass(frozen=True)
class LoadBalancerIngress:
    ip: str
    ip_mode: str | None = None  # None or "VIP": proxied; "Proxy": skipped by the compiler


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    type: str  # "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    cluster_ips: tuple[str, ...] = ()  # canonical IPs, in clusterIPs order; () = headless/none
    ip_families: tuple[str, ...] = ()  # "IPv4" | "IPv6", parallel to cluster_ips when given
    ports: tuple[ServicePort, ...] = ()
    external_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()  # canonical CIDRs (network form)
    load_balancer_ingress: tuple[LoadBalancerIngress, ...] = ()
    external_traffic_policy: str = "Cluster"  # "Cluster" | "Local"
    internal_traffic_policy: str = "Cluster"  # "Cluster" | "Local"
    session_affinity: str = "None"  # "None" | "ClientIP"
    affinity_timeout_seconds: int = 10800
    health_check_node_port: int = 0
    # spec.trafficDistribution: "PreferClose" | "PreferSameZone" | "PreferSameNode"; None: unset.
    # kube-proxy never reads it (only the hints the EndpointSlice controller derives from
    # it); nftrec derives those hints itself when no slice has any (compile.topology).
    traffic_distribution: str | None = None
    readiness_probe: Probe | None = None  # annotation probe.nftrec.io/readiness (`nftrec watch` probes)
    source: Source = field(default=Source("<none>"), compare=False)

    @property
    def key(self) -> str:
        """`namespace/name`, the identity used in plans, logs and ownership."""
        return f"{self.namespace}/{self.name}"

    @property
    def headless(self) -> bool:
        return not self.cluster_ips


# --- EndpointSlice -----------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    addresses: tuple[str, ...]  # canonical IPs; kube-proxy uses the first
    ready: bool = True  # Kubernetes' nil default: ready
    serving: bool = True  # nil: serving
    terminating: bool = False  # nil: not terminating
    node_name: str | None = None
    zone: str | None = None
    hint_zones: tuple[str, ...] | None = None  # hints.forZones[].name; None: no hints
    hint_nodes: tuple[str, ...] | None = None  # hints.forNodes[].name; None: no hints


@dataclass(frozen=True)
class EndpointPort:
    name: str  # "" for the unnamed port
    protocol: str  # "TCP" | "UDP" | "SCTP"
    port: int


@dataclass(frozen=True)
class EndpointSlice:
    namespace: str
    name: str
    service_name: str  # label kubernetes.io/service-name
    address_type: str  # "IPv4" | "IPv6" | "FQDN" (FQDN slices are ignored by the compiler)
    endpoints: tuple[Endpoint, ...] = ()
    ports: tuple[EndpointPort, ...] = ()
    source: Source = field(default=Source("<none>"), compare=False)

    @property
    def service_key(self) -> str:
        return f"{self.namespace}/{self.service_name}"


@dataclass(frozen=True)
class ServiceCIDR:
    name: str
    cidrs: tuple[str, ...]  # canonical CIDRs
    source: Source = field(default=Source("<none>"), compare=False)


# --- Node config -------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthCheck:
    """One check after a confirmed apply (intake/healthchecks.py): `cmd` (a shell command's
    exit status), `url` (an HTTP GET answered 2xx) or `tcp` (a connect to HOST:PORT)."""

    kind: str
    target: str

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


@dataclass(frozen=True)
class NftSpelling:
    """Which spellings of the sharded layout's constructs the target's nft accepts (found
    by a check transaction at the first contact with a namespace, kernel/features.py).
    True: nftrec's own; False: kube-proxy's spelling of the same packet path."""

    # `typeof numgen random mod 1 : verdict` (and `: ip daddr . tcp dport`) maps indexed by
    # ranges; else an anonymous map per Service port, as kube-proxy writes it
    index_maps: bool = True
    # the shared affinity set keyed `ip saddr . numgen … . numgen …`; else kube-proxy's
    # dynamic set per endpoint
    shared_affinity: bool = True


@dataclass(frozen=True)
class Verify:
    """The node config's `verify`: apply only revisions signed by one of `keys` (files)."""

    mode: str = "HEAD"  # HEAD | Tag | TagAndHEAD
    keys: tuple[str, ...] = ()
    allow_rollback: bool = False


@dataclass(frozen=True)
class OciSettings:
    """The node config's `oci`: how `oci://` sources are fetched (intake/oci.py)."""

    interval: float = 60.0  # seconds between two resolves of a watched tag
    insecure: bool = False  # allow plain HTTP (registries on loopback, labs)
    ca_file: str = ""  # an extra PEM CA bundle; the system CAs are always trusted too
    credentials_file: str = ""  # a docker-style config.json ("auths"); "": anonymous
    max_size: int = 100 << 20  # bytes an artifact may unpack to (Flux's default, 100 MiB)


@dataclass(frozen=True)
class StatusSettings:
    """The node config's `status`: the git remote each node pushes its status records to
    (refs/nftrec/status/<nodeName>) and an SSH key file (optional; else the remote's own
    authentication)."""

    remote: str
    ssh_key: str | None = None


@dataclass(frozen=True)
class NodeConfig:
    node_name: str
    node_labels: tuple[tuple[str, str], ...] = ()  # nodeLabels, sorted (key, value): a fleet's selectors match them
    node_ips: tuple[str, ...] = ()  # canonical; at most one primary per family is used
    cluster_cidrs: tuple[str, ...] = ()  # local-traffic detector; () = no detector
    service_cidrs: tuple[str, ...] = ()  # unallocated-ClusterIP drop; () = no drop rule
    node_port_addresses: tuple[str, ...] = ("primary",)  # ("primary",) or CIDRs
    # Every (ifname, address) on the node's interfaces in the target namespace, found with
    # pyroute2 by plan/apply/watch (kube-proxy's GetNodeIPs input); None when not looked
    # up (render, validate): then nodeIPs stand in for the interface addresses.
    host_addresses: tuple[tuple[str, str], ...] | None = None
    node_ips_discovered: bool = False  # nodeIPs were not configured but discovered
    masquerade_all: bool = False
    masquerade_bit: int = 14
    table_name: str = "nftrec"
    # How a Service port picks its endpoint: "sharded" (shared index-range maps, nftrec's
    # default) or "kube-proxy" (kube-proxy's anonymous map per Service port); compile/layout.py
    layout: str = "sharded"
    zone: str = ""
    derive_topology_hints: bool = True  # trafficDistribution + slices without hints: derive them
    field_validation: str = "strict"  # unknown manifest fields: "strict" | "warn" | "ignore" (validate.settle)
    allow_empty: bool = False  # a revision with no Service at all may be applied
    removal_guard: int = 50  # percent of the applied Services a revision may remove (100: no guard)
    min_sync_period: float = 1.0  # seconds
    sync_period: float = 30.0
    full_sync_period: float = 3600.0
    # watch: checks after each new revision's apply; failing = rolled back
    health_checks: tuple[HealthCheck, ...] = ()
    health_check_timeout: float = 30.0  # seconds
    verify: Verify | None = None  # signed revisions only; None: no signature checks
    oci: OciSettings = OciSettings()  # oci:// sources
    status: StatusSettings | None = None  # status records on git; None: none pushed
    # what the target's nft accepts (discovered, like host_addresses; never from the file)
    spelling: NftSpelling = NftSpelling()
    source: Source = field(default=Source("<defaults>"), compare=False)


# --- The whole input ---------------------------------------------------------------------


@dataclass(frozen=True)
class Inventory:
    """Everything read from one revision of the manifest directory."""

    services: tuple[Service, ...] = ()
    endpoint_slices: tuple[EndpointSlice, ...] = ()
    service_cidrs: tuple[ServiceCIDR, ...] = ()
    revision: str = ""  # git commit of the synced worktree, else a content digest
    # id(model object) -> (that object, its file's intake cache key, the document's index
    # in the file, the object's index among the document's): for the objects the intake
    # cache read or parsed. The same key and indexes, the same object (source aside: the
    # key is of the bytes and the code, not the path). compile_oneshot takes a Service's
    # input digest from the last compile's memo when its and its slices' keys are the
    # memo's. The object is kept beside its key so that an id is never taken for another
    # object's (a replaced Service has a new id, hence no key). Empty: no keys known.
    origins: dict = field(default_factory=dict, compare=False, repr=False)
