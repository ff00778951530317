"""kernel/addresses.py (rtnetlink over a plain socket) lists exactly what
intake.discover_host_addresses (pyroute2) lists, in a namespace with addresses of both
families, a secondary address, a point-to-point peer and a long interface name."""

from __future__ import annotations

import pytest

from nsutil import in_ns
from reconciler.intake import discover_host_addresses
from reconciler.kernel import Libnftables, host_addresses

pytestmark = pytest.mark.kernel


def test_same_addresses_as_pyroute2(netns):
    for cmd in ("ip link set lo up",
                "ip link add veth-longname0 type veth peer name vp0", "ip link set veth-longname0 up",
                "ip addr add 192.168.99.2/24 dev veth-longname0",
                "ip addr add 192.168.99.3/24 dev veth-longname0",
                "ip addr add fd00:99::2/64 dev veth-longname0 nodad",
                "ip link add d1 type veth peer name d1p", "ip link set d1 up",
                "ip addr add 10.9.9.1 peer 10.9.9.2 dev d1"):
        in_ns(netns, *cmd.split())
    nft = Libnftables(netns)
    try:
        ours = nft.in_namespace(host_addresses)
        theirs = nft.in_namespace(discover_host_addresses)
    finally:
        nft.close()
    assert ours == theirs
    assert ("veth-longname0", "fd00:99::2") in ours and ("d1", "10.9.9.1") in ours and ("lo", "127.0.0.1") in ours
