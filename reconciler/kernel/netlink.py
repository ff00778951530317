"""nf_tables over raw netlink, for what libnftables gives only after filling its cache of
every object (`nft list tables` costs a whole listing; the table dump, next to nothing),
not at all (the generation id), or not beside a table it cannot read (deleting one of
ours: `netlink_delete_table`). A socket opens in the namespace of the thread that first uses it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

from reconciler.kernel.interface import PERMISSION_HINT, NftError, NotFound

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_NEWTABLE, _NFT_MSG_GETTABLE, _NFT_MSG_DELTABLE, _NFT_MSG_NEWGEN, _NFT_MSG_GETGEN = 0, 1, 2, 15, 16
_NFNL_MSG_BATCH_BEGIN, _NFNL_MSG_BATCH_END = 0x10, 0x11
_SO_NETNS_COOKIE = 71
_REQUESTS = {_NFT_MSG_GETTABLE: "listing the nftables tables (NFT_MSG_GETTABLE)",
             _NFT_MSG_GETGEN: "reading the nftables ruleset generation (NFT_MSG_GETGEN)"}
_FAMILY_NAMES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}


class NfTablesSocket:
    """A NETLINK_NETFILTER socket, opened on first use, for nf_tables requests."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0

    def tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table: an NFT_MSG_GETTABLE dump."""
        out = []
        for mtype, data, off, length in self._request(_NFT_MSG_GETTABLE, dump=True):
            if mtype != (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWTABLE:
                continue
            fam = _FAMILY_NAMES.get(data[off + 16], str(data[off + 16]))
            name = _attr(data, off, length, 1)  # NFTA_TABLE_NAME
            if name is not None:
                out.append((fam, name.rstrip(b"\0").decode()))
        return out

    def generation(self) -> int:
        """The ruleset generation id: NFT_MSG_GETGEN."""
        for mtype, data, off, length in self._request(_NFT_MSG_GETGEN):
            if mtype == (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWGEN:
                gen = _attr(data, off, length, 1)  # NFTA_GEN_ID, big-endian u32
                if gen is not None:
                    return struct.unpack(">I", gen[:4])[0]
        raise NftError("NFT_MSG_GETGEN: no generation id in the kernel's answer")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _request(self, cmd: int, dump: bool = False) -> list[tuple[int, bytes, int, int]]:
        """One nf_tables request: (type, buffer, offset, length) of each answer message."""
        if self._sock is None:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
            self._sock.bind((0, 0))
        self._seq += 1
        flags = 1 | (0x300 if dump else 0)  # NLM_F_REQUEST [| NLM_F_DUMP]
        req = struct.pack("=IHHII", 20, (_NFNL_SUBSYS_NFTABLES << 8) | cmd, flags, self._seq, 0)
        req += struct.pack("=BBH", socket.AF_UNSPEC, 0, 0)  # nfgenmsg
        self._sock.send(req)
        msgs = []
        while True:
            data = self._sock.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if seq == self._seq:
                    if mtype == 3:  # NLMSG_DONE
                        return msgs
                    if mtype == 2:  # NLMSG_ERROR
                        (err,) = struct.unpack_from("=i", data, off + 16)
                        if err:
                            what = _REQUESTS.get(cmd, f"nf_tables netlink request {cmd}")
                            hint = f"; {PERMISSION_HINT}" if -err == errno.EPERM else ""
                            raise NftError(f"{what} failed: {os.strerror(-err)}{hint}")
                    else:
                        msgs.append((mtype, data, off, length))
                        if not dump:
                            return msgs
                off += (length + 3) & ~3


def _attr(data: bytes, off: int, length: int, want: int) -> bytes | None:
    """Payload of attribute `want` in the nfnetlink message at `off` (after nfgenmsg)."""
    a = off + 20
    while a + 4 <= off + length:
        alen, atype = struct.unpack_from("=HH", data, a)
        if alen < 4:
            break
        if atype & 0x7FFF == want:
            return data[a + 4 : a + alen]
        a += (alen + 3) & ~3
    return None


def netns_cookie() -> int | None:
    """The calling thread's namespace's SO_NETNS_COOKIE (Linux >= 5.14): unique for the boot
    and never reused, unlike a namespace's inode number, which a namespace deleted and
    re-created under the same name often gets back. None where the kernel lacks it."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER) as s:
        try:
            return struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8))[0]
        except OSError:
            return None


def own_portids() -> set[int]:
    """Netlink port ids of this process's NETLINK_NETFILTER sockets in the calling thread's
    namespace: a commit's nf_tables events carry its socket's, whatever pid namespace this
    process runs in (their pid is the committing thread's in the kernel's first one, or a
    child's that ran the command and is gone)."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open("/proc/thread-self/net/netlink") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return set()
    return {int(r[2]) for r in rows if len(r) >= 10 and r[1] == str(_NETLINK_NETFILTER) and r[9] in inodes}


def _message(mtype: int, flags: int, seq: int, family: int, attrs: bytes = b"", res_id: int = 0) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(res_id)) + attrs
    return struct.pack("=IHHII", 16 + len(body), mtype, flags, seq, 0) + body


def netlink_delete_table(family: str, name: str) -> None:
    """NFT_MSG_DELTABLE of one table, in a batch of its own, in the calling thread's
    namespace: the kernel deletes the table with everything in it, and no other table
    is read or named (libnftables fills its cache from every table first, and cannot
    beside one a newer nft wrote). NotFound when there is no such table."""
    fam = {v: k for k, v in _FAMILY_NAMES.items()}[family]
    attr = name.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(attr), 1) + attr  # NFTA_TABLE_NAME
    attr += b"\0" * (-len(attr) % 4)
    batch = (_message(_NFNL_MSG_BATCH_BEGIN, 1, 1, socket.AF_UNSPEC, res_id=_NFNL_SUBSYS_NFTABLES)
             + _message((_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_DELTABLE, 1 | 4, 2, fam, attr)  # REQUEST | ACK
             + _message(_NFNL_MSG_BATCH_END, 1, 3, socket.AF_UNSPEC, res_id=_NFNL_SUBSYS_NFTABLES))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER) as sock:
        sock.bind((0, 0))
        sock.send(batch)
        while True:
            data = sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if mtype == 2:  # NLMSG_ERROR: the ack of our request (0), or an errno
                    (err,) = struct.unpack_from("=i", data, off + 16)
                    if err == -errno.ENOENT:
                        raise NotFound(f"no table {family} {name}")
                    if err:
                        hint = f"; {PERMISSION_HINT}" if -err == errno.EPERM else ""
                        raise NftError(f"deleting table {family} {name} (NFT_MSG_DELTABLE) failed: "
                                       f"{os.strerror(-err)}{hint}")
                    if seq == 2:
                        return
                off += (length + 3) & ~3
