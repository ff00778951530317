"""UDP conntrack cleanup after endpoints go away, as kube-proxy does it. UDP has no
connection end, so a client that keeps sending stays pinned by its conntrack entry to an
endpoint that is gone. `stale_udp_targets` is pure; `cleanup_udp` deletes the entries of
frontends answered by a non-serving IP, over pyroute2's ctnetlink socket on a thread
inside the given namespace.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from reconciler.compile import (
    ips_of_family,
    cluster_ip_for,
    endpoints_for_port,
    slices_by_service,
)
from reconciler.intake import Inventory, NodeConfig
from reconciler.kernel.netns import NamespaceThread
from reconciler.compile import FAMILIES

_AF = {"ip": socket.AF_INET, "ip6": socket.AF_INET6}


class ConntrackError(RuntimeError):
    """Listing or deleting conntrack entries failed."""


Frontends = dict[tuple[str, int], set[str]]  # (canonical ip, port) → serving endpoint IPs
NodePorts = dict[int, set[str]]  # nodePort → serving endpoint IPs


def stale_udp_targets(inventory: Inventory, config: NodeConfig, family: str) -> tuple[Frontends, NodePorts]:
    """For every UDP Service port of `family`: each frontend `ip:port` (clusterIP, LB
    VIPs except ipMode Proxy, externalIPs) and its nodePort → the set of IPs of its
    *serving* endpoints (kube-proxy's `IsServing()`: ready or not, terminating or not).
    Service ports without any serving endpoint are left out: kube-proxy does not touch
    their entries. Frontends are the same ones compile/services.py programs into the ruleset."""
    if family not in FAMILIES:
        raise ValueError(f"unsupported family {family!r} (expected one of {FAMILIES})")
    frontends: Frontends = {}
    nodeports: NodePorts = {}
    by_svc = slices_by_service(inventory.endpoint_slices)
    for service in sorted(inventory.services, key=lambda s: (s.namespace, s.name)):
        cip = cluster_ip_for(service, family)
        if cip is None:  # headless, ExternalName, or not of this family: not proxied
            continue
        what = f"Service {service.key}"
        vips = [cip]
        vips += ips_of_family(
            (i.ip for i in service.load_balancer_ingress if i.ip and i.ip_mode in (None, "VIP")),
            family, what + " loadBalancer ingress")
        vips += ips_of_family(service.external_ips, family, what + " externalIPs")
        for port in service.ports:
            if port.protocol != "UDP":
                continue
            eps = endpoints_for_port(by_svc.get(service.key, ()), family, port, config.node_name)
            serving = {e.ip for e in eps if e.serving}
            if not serving:
                continue
            # A frontend shared by two Services (e.g. an externalIP equal to another
            # ClusterIP) keeps the union: never delete flows either one still serves.
            for ip in vips:
                frontends.setdefault((ip, port.port), set()).update(serving)
            if port.node_port:
                nodeports.setdefault(port.node_port, set()).update(serving)
    return frontends, nodeports


def _canon(addr) -> str:
    return str(ipaddress.ip_address(addr))


def _is_stale(entry, frontends: Frontends, nodeports: NodePorts) -> bool:
    """kube-proxy's two filters: (orig-dst ip:port is a frontend) or (orig-dst port is a
    NodePort), and the reply source is not one of that frontend's serving endpoints."""
    orig, reply = entry.tuple_orig, entry.tuple_reply
    if orig.proto != socket.IPPROTO_UDP:
        return False
    dst, dport, rsrc = _canon(orig.daddr), orig.dport, _canon(reply.saddr)
    allowed = frontends.get((dst, dport))
    if allowed is not None and rsrc not in allowed:
        return True
    allowed = nodeports.get(dport)
    return allowed is not None and rsrc not in allowed


def _cleanup_family(family: str, frontends: Frontends, nodeports: NodePorts) -> int:
    """Runs on the namespace thread: dump this family's UDP entries, delete stale ones."""
    from pyroute2.conntrack import Conntrack, NFCTAttrTuple
    from pyroute2.netlink.exceptions import NetlinkError

    af = _AF[family]
    deleted = 0
    with Conntrack(nfgen_family=af) as ct:
        try:
            # Kernel-side filter (CTA_FILTER) on UDP: a node may hold many TCP entries.
            stale = [e for e in ct.dump_entries(tuple_orig=NFCTAttrTuple(family=af, proto=socket.IPPROTO_UDP))
                     if _is_stale(e, frontends, nodeports)]
        except NetlinkError as e:
            raise ConntrackError(f"cannot list {family} conntrack entries: {e}") from e
        for entry in stale:
            try:
                # The zone is part of the entry's identity; None → default zone.
                ct.entry("del", tuple_orig=entry.tuple_orig, zone=entry.zone)
                deleted += 1
            except NetlinkError as e:
                if e.code == errno.ENOENT:  # expired or deleted meanwhile: fine
                    continue
                raise ConntrackError(f"cannot delete conntrack entry {entry}: {e}") from e
    return deleted


def cleanup_udp(netns: str | None, inventory: Inventory, config: NodeConfig) -> int:
    """Delete the stale UDP conntrack entries of both families in `netns` (None: this
    process' namespace); returns how many were deleted. Raises NftError when the
    namespace cannot be entered, ConntrackError when netlink refuses a dump/delete."""
    targets = {f: stale_udp_targets(inventory, config, f) for f in FAMILIES}
    if not any(fe or np for fe, np in targets.values()):
        return 0  # nothing to check: do not even open a socket
    worker = NamespaceThread(netns)
    try:
        return sum(worker.call(lambda f=f, t=t: _cleanup_family(f, *t)) for f, t in targets.items()
                   if t[0] or t[1])
    finally:
        worker.close()
