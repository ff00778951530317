"""nodePortAddresses: which of the node's addresses accept NodePorts, as kube-proxy's
nodeport_addresses.go, one pure function so compile, render and the address watcher
agree. Unset → `primary` (the node IP per family); a family with no CIDR or a zero CIDR
matches all (`fib daddr type local`); else the interface addresses inside the CIDRs,
loopback left out. One deviation: `primary` without a node IP of a family → empty set."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PRIMARY = "primary"


class NodePortAddressesError(ValueError):
    """A nodePortAddresses list kube-proxy refuses (its message)."""


@dataclass(frozen=True)
class NodePortSelection:
    """The outcome for one family."""

    match_all: bool  # no nodeport-ips set: every local address (fib daddr type local)
    ips: tuple[str, ...] = ()  # nodeport-ips elements, canonical, sorted
    loopback: tuple[str, ...] = ()  # matched a CIDR but skipped: loopback NodePorts unsupported
    cidrs: tuple[str, ...] = ()  # the CIDRs in effect for this family


def _version(family: str) -> int:
    return {"ip": 4, "ip6": 6}[family]


def _address(text: str):
    """An interface address as pyroute2 / `ip addr` give it ("10.0.0.1", "10.0.0.1/24",
    "fe80::1%eth0"): the address itself, or None when it does not parse."""
    text = text.split("/", 1)[0].split("%", 1)[0].strip()
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def family_cidrs(entries: Sequence[str], primary_ips: Iterable[str], family: str) -> tuple[bool, tuple]:
    """(match_all, networks) of `entries` for `family` (kube-proxy's NewNodePortAddresses,
    after cmd/kube-proxy replaced `primary`)."""
    entries = tuple(entries) or (PRIMARY,)
    version = _version(family)
    if PRIMARY in entries:
        if entries != (PRIMARY,):
            raise NodePortAddressesError("can't use both 'primary' and CIDRs")
        nets = []
        for text in primary_ips:
            ip = _address(text)
            if ip is not None and ip.version == version and not ip.is_loopback:
                nets.append(ipaddress.ip_network(ip))
                break  # one node IP per family, as kube-proxy's NodeIPs map
        return False, tuple(nets)  # deviation: none of this family → empty set, not match-all
    nets = []
    for text in entries:
        try:
            net = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise NodePortAddressesError(f"{text!r} must be a valid CIDR") from None
        if net.version != version:
            continue
        if net.prefixlen == 0:
            return True, (net,)  # a zero CIDR: everything else is ignored
        nets.append(net)
    if not nets:
        return True, (ipaddress.ip_network("0.0.0.0/0" if version == 4 else "::/0"),)
    return False, tuple(nets)


def select_nodeport_ips(entries: Sequence[str], primary_ips: Iterable[str],
                        addresses: Iterable[tuple[str, str]], family: str) -> NodePortSelection:
    """kube-proxy's nodeport-ips for `family`: `entries` is nodePortAddresses, `primary_ips`
    the node IPs (nodeIPs, configured or discovered), `addresses` every (ifname, address)
    on the node's interfaces (the interface name is informational: kube-proxy matches
    addresses, `lo` included)."""
    match_all, nets = family_cidrs(entries, primary_ips, family)
    shown = tuple(str(n) for n in nets)
    if match_all:
        return NodePortSelection(True, cidrs=shown)
    found, loop = set(), set()
    for _ifname, text in addresses:
        ip = _address(text)
        if ip is None or ip.version != _version(family) or not any(ip in n for n in nets):
            continue
        (loop if ip.is_loopback else found).add(ip)
    return NodePortSelection(False, tuple(str(i) for i in sorted(found)), tuple(str(i) for i in sorted(loop)), shown)


def _primary(node_ips: Iterable[str], version: int) -> str | None:
    for text in node_ips:
        ip = _address(text)
        if ip is not None and ip.version == version and not ip.is_loopback:
            return str(ip)
    return None


def node_address_view(config) -> tuple | None:
    """What the ruleset takes from the node's addresses, per family: (match-all,
    nodeport-ips, primary node IP). Two configs with the same view compile to the same
    ruleset; the watch daemon syncs on an address event only when the view changed.
    None: nodePortAddresses is invalid (the config check reports it)."""
    addresses = config.host_addresses
    if addresses is None:
        addresses = tuple(("nodeIPs", ip) for ip in config.node_ips)
    out = []
    for family in ("ip", "ip6"):
        try:
            sel = select_nodeport_ips(config.node_port_addresses, config.node_ips, addresses, family)
        except NodePortAddressesError:
            return None
        out.append((sel.match_all, sel.ips, _primary(config.node_ips, _version(family))))
    return tuple(out)


def describe_view_change(old: tuple | None, new: tuple | None) -> str:
    """One line for the sync log: `nodeport-ips ip +192.0.2.9 -192.0.2.7; primary ip6 ...`."""
    if old is None or new is None:
        return "node addresses changed"
    parts = []
    for family, (om, oips, oprim), (nm, nips, nprim) in zip(("ip", "ip6"), old, new):
        added = [f"+{i}" for i in nips if i not in oips]
        gone = [f"-{i}" for i in oips if i not in nips]
        if added or gone:
            parts.append(f"nodeport-ips {family} {' '.join(added + gone)}")
        if oprim != nprim:
            parts.append(f"primary {family} {oprim or 'none'} -> {nprim or 'none'}")
    return "node addresses changed: " + ("; ".join(parts) if parts else "no effect")
