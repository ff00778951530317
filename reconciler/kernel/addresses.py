"""The node's interface addresses, read with two rtnetlink dumps over a plain socket.

`intake.discover_host_addresses` does the same through pyroute2, whose import alone
costs about 0.3 s: more than the rest of a no-op `plan`. This is what `plan` and `apply`
use (engine/desired.py); the result is the same tuple (tests/test_addresses.py compares
them in a namespace with addresses of both families).

Run it in the namespace to look in (a socket belongs to the namespace of the thread that
opens it): engine/desired.py calls it on the nft worker thread of the target namespace.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_GETADDR = 16, 18, 20, 22
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME = 3
IFA_ADDRESS, IFA_LOCAL = 1, 2
_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_RTA = struct.Struct("=HH")  # rtattr: len, type


class NetlinkError(OSError):
    pass


def _dump(sock: socket.socket, msg_type: int, body: bytes, seq: int):
    """(type, payload) of every message of one dump request."""
    sock.send(_HDR.pack(_HDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    while True:
        data = sock.recv(1 << 20)
        off = 0
        while off + _HDR.size <= len(data):
            length, typ, _flags, mseq, _pid = _HDR.unpack_from(data, off)
            if length < _HDR.size:
                raise NetlinkError(0, "malformed netlink message")
            payload = data[off + _HDR.size: off + length]
            off += (length + 3) & ~3
            if mseq != seq:
                continue
            if typ == NLMSG_DONE:
                return
            if typ == NLMSG_ERROR:
                err = -struct.unpack_from("=i", payload)[0]
                if err:
                    raise NetlinkError(err, os.strerror(err))
                return
            yield typ, payload


def _attrs(payload: bytes, start: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    off = start
    while off + _RTA.size <= len(payload):
        length, typ = _RTA.unpack_from(payload, off)
        if length < _RTA.size:
            break
        out.setdefault(typ & 0x3FFF, payload[off + _RTA.size: off + length])
        off += (length + 3) & ~3
    return out


def _ip(raw: bytes | None) -> str | None:
    """The canonical text of a 4- or 16-byte address; None for anything else and for an
    IPv4-mapped IPv6 address (as intake.parse_ip, which pyroute2's text goes through)."""
    if raw is None or len(raw) not in (4, 16):
        return None
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return None
    return str(ip)


def host_addresses() -> tuple[tuple[str, str], ...]:
    """Every address on this namespace's interfaces as (ifname, address), sorted:
    the same as intake.discover_host_addresses (IFA_LOCAL first: on a point-to-point link
    IFA_ADDRESS is the peer)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        names: dict[int, str] = {}
        for typ, payload in _dump(sock, RTM_GETLINK, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0), 1):
            if typ != RTM_NEWLINK or len(payload) < 16:
                continue
            index = struct.unpack_from("=i", payload, 4)[0]
            name = _attrs(payload, 16).get(IFLA_IFNAME, b"").split(b"\0", 1)[0]
            names[index] = name.decode("utf-8", "replace") or str(index)
        out = set()
        for typ, payload in _dump(sock, RTM_GETADDR, struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0), 2):
            if typ != RTM_NEWADDR or len(payload) < 8:
                continue
            index = struct.unpack_from("=I", payload, 4)[0]
            attrs = _attrs(payload, 8)
            ip = _ip(attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS))
            if ip is not None:
                out.add((names.get(index, str(index)), ip))
    return tuple(sorted(out))
