"""The benchmark's Service mix: N Services x M endpoints as Kubernetes manifests.

Service i is a LoadBalancer when i % 10 == 9, a NodePort when i % 10 is 7 or 8, else a
ClusterIP; half of the LoadBalancers have loadBalancerSourceRanges; every tenth Service has
ClientIP affinity; a quarter of the NodePort/LoadBalancer Services externalTrafficPolicy
Local. 100 Services per file, their EndpointSlices in a second file. Standard library only.
"""

from __future__ import annotations

import ipaddress
import math
from pathlib import Path

SVC_NET = ipaddress.ip_network("172.30.0.0/16")     # serviceCIDRs (ClusterIPs)
EP_NET = ipaddress.ip_network("10.128.0.0/9")       # clusterCIDRs; endpoints from here
LB_NET = ipaddress.ip_network("198.18.0.0/15")      # LoadBalancer ingress IPs
NODE_PORT_BASE = 30000   # one node port per NodePort/LoadBalancer Service, counting up;
                         # past 32767 at N > ~9,200 (nftrec accepts any port number)
HEALTH_PORT_BASE = 60000  # healthCheckNodePort of the eTP Local LoadBalancers
PER_FILE = 100            # Services per file (and EndpointSlices per file)
NODE = "bench-node"       # endpoint 0 of every slice is on this node

NODE_CONFIG = f"""\
apiVersion: nftrec/v1alpha1
kind: NodeConfig
nodeName: {NODE}
nodeIPs: [192.168.99.2]
clusterCIDRs: [{EP_NET}]
serviceCIDRs: [{SVC_NET}]
nodePortAddresses: [primary]
tableName: nftrec
minSyncPeriod: 0s
syncPeriod: 1s
fullSyncPeriod: 1h
"""


def svc_type(i: int) -> str:
    r = i % 10
    return "LoadBalancer" if r == 9 else "NodePort" if r >= 7 else "ClusterIP"


def external_index(i: int) -> int:
    """The position of NodePort/LoadBalancer Service i among those Services (its node port)."""
    return i // 10 * 3 + i % 10 - 7


def has_affinity(i: int) -> bool:
    return i % 10 == (i // 10) % 10           # every tenth Service, spread over the types


def has_local_policy(i: int) -> bool:
    return svc_type(i) != "ClusterIP" and (i // 10) % 4 == 1


def has_source_ranges(i: int) -> bool:
    return svc_type(i) == "LoadBalancer" and (i // 10) % 2 == 0


def cluster_ip(i: int) -> str:
    return str(ipaddress.ip_address(int(SVC_NET.network_address) + 10 + i))


def ep_ips(i: int, m: int) -> list[str]:
    base = int(EP_NET.network_address) + 1 + i * m
    return [str(ipaddress.ip_address(base + j)) for j in range(m)]


def fresh_ip(n: int, m: int, k: int) -> str:
    """The k-th address never used by the generator (edits move endpoints here)."""
    return str(ipaddress.ip_address(int(EP_NET.network_address) + 1 + n * m + 1000 + k))


def edit_service(n: int) -> int:
    """A ClusterIP Service without affinity from the middle of the table."""
    k = n // 2
    while svc_type(k) != "ClusterIP" or has_affinity(k):
        k += 1
    return k


def service_doc(i: int) -> str:
    typ = svc_type(i)
    extra, ports_extra, status = "", "", ""
    if typ != "ClusterIP":
        ports_extra = f"\n      nodePort: {NODE_PORT_BASE + external_index(i)}"
    if has_local_policy(i):
        extra += "  externalTrafficPolicy: Local\n"
        if typ == "LoadBalancer":
            extra += f"  healthCheckNodePort: {HEALTH_PORT_BASE + i // 10 // 4}\n"
    if has_source_ranges(i):
        extra += "  loadBalancerSourceRanges: [192.168.50.0/24, 203.0.113.0/24]\n"
    if has_affinity(i):
        extra += "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n"
    if typ == "LoadBalancer":
        status = (f"status:\n  loadBalancer:\n    ingress:\n"
                  f"      - ip: {ipaddress.ip_address(int(LB_NET.network_address) + 1 + i)}\n")
    return (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n"
            f"  namespace: ns-{i // 500}\n  labels: {{app: svc-{i}}}\nspec:\n  type: {typ}\n"
            f"  clusterIP: {cluster_ip(i)}\n  selector: {{app: svc-{i}}}\n{extra}"
            f"  ports:\n    - name: http\n      protocol: TCP\n      port: 80\n"
            f"      targetPort: 8080{ports_extra}\n{status}")


def slice_doc(i: int, ips: list[str]) -> str:
    eps = "".join(f"  - addresses: [{ip}]\n    conditions: {{ready: true, serving: true, "
                  f"terminating: false}}\n    nodeName: {NODE if j == 0 else f'node-{j}'}\n"
                  for j, ip in enumerate(ips))
    return (f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n"
            f"  name: svc-{i}-abcde\n  namespace: ns-{i // 500}\n  labels:\n"
            f"    kubernetes.io/service-name: svc-{i}\naddressType: IPv4\nports:\n"
            f"  - name: http\n    protocol: TCP\n    port: 8080\nendpoints:\n{eps}")


def slice_file(root: Path, i: int) -> Path:
    """The file holding Service i's EndpointSlice."""
    return root / "endpointslices" / f"eps-{i // PER_FILE:04d}.yaml"


def write_slice_file(root: Path, i: int, n: int, m: int, moved: dict[int, list[str]] | None = None) -> Path:
    """(Re)write the EndpointSlice file holding Service i; `moved`: Service → its addresses."""
    moved = moved or {}
    f = i // PER_FILE
    idx = range(f * PER_FILE, min(n, (f + 1) * PER_FILE))
    p = slice_file(root, i)
    p.write_text("---\n".join(slice_doc(k, moved.get(k) or ep_ips(k, m)) for k in idx))
    return p


def generate(root: Path, n: int, m: int) -> None:
    """N Services x M endpoints under root/services and root/endpointslices."""
    if n + 10 > SVC_NET.num_addresses - 2 or n * m + 10_000 > EP_NET.num_addresses - 2:
        raise SystemExit("too many Services/endpoints for the synthetic address plan")
    (root / "services").mkdir(parents=True)
    (root / "endpointslices").mkdir()
    for f in range(math.ceil(n / PER_FILE)):
        idx = range(f * PER_FILE, min(n, (f + 1) * PER_FILE))
        (root / "services" / f"svc-{f:04d}.yaml").write_text("---\n".join(service_doc(i) for i in idx))
        write_slice_file(root, f * PER_FILE, n, m)


def counts(n: int) -> dict:
    """How many Services of each kind the first n are."""
    types = [svc_type(i) for i in range(n)]
    return {"ClusterIP": types.count("ClusterIP"), "NodePort": types.count("NodePort"),
            "LoadBalancer": types.count("LoadBalancer"),
            "sourceRanges": sum(map(has_source_ranges, range(n))),
            "affinity": sum(map(has_affinity, range(n))),
            "etpLocal": sum(map(has_local_policy, range(n)))}


def read(root: Path, config_text: str = NODE_CONFIG):
    """(Inventory, NodeConfig) of a generated tree, through nftrec's own intake; raises
    on any error (the node config is written next to the tree)."""
    from reconciler.intake import load_node_config, read_inventory

    cfg_path = root.parent / f"{root.name}-node.yaml"
    cfg_path.write_text(config_text)
    cfg, problems = load_node_config(str(cfg_path), discover=False)
    res = read_inventory(root)
    errors = [*problems, *(p for p in res.problems if p.is_error)]
    if errors:
        raise RuntimeError(f"the generated mix does not read cleanly: {errors[:3]}")
    return res.inventory, cfg
