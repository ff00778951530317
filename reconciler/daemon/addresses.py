"""The daemon's second source of triggers: the node's addresses, from a netlink socket
in the target namespace (address and route groups: a DHCP client changes the default
route, hence the primary address). After a burst settles, the addresses are listed again
and handed to `on_change(primary_ips, addresses)`. pyroute2 opens its socket in the thread
that first uses it, so all netlink work runs on one thread inside the namespace.
"""

from __future__ import annotations

import struct
import time
from typing import Callable

from reconciler import logs
from reconciler.intake import discover_host_addresses, discover_node_ips
from reconciler.daemon.listener import NetlinkListener, open_netlink

SETTLE = 0.05  # seconds of quiet after an event before the addresses are listed again
SETTLE_MAX = 0.3  # a continuous stream of events is listed at least this often

Addresses = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]  # (primary IPs, (ifname, address) pairs)


NETLINK_ROUTE = 0
RTM_NEWADDR, RTM_DELADDR, RTM_NEWROUTE, RTM_DELROUTE = 20, 21, 24, 25
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid


def relevant_messages(buf: bytes) -> int:
    """How many netlink messages in one datagram matter: address adds/deletes, and
    default routes (rtmsg dst_len 0: the discovered primary may move with them)."""
    n, off = 0, 0
    while off + _NLMSGHDR.size <= len(buf):
        length, kind = _NLMSGHDR.unpack_from(buf, off)[:2]
        if length < _NLMSGHDR.size:
            break
        if kind in (RTM_NEWADDR, RTM_DELADDR):
            n += 1
        elif kind in (RTM_NEWROUTE, RTM_DELROUTE) and off + _NLMSGHDR.size + 2 <= len(buf):
            if buf[off + _NLMSGHDR.size + 1] == 0:  # struct rtmsg: family, dst_len, ...
                n += 1
        off += (length + 3) & ~3
    return n


class AddressWatcher(NetlinkListener):
    """Netlink address (and default-route) events in network namespace `netns` (None: the host)."""

    thread_name = "nftrec-addresses"

    def __init__(self, netns: str | None, on_change: Callable[[tuple, tuple], None], *,
                 settle: float = SETTLE, settle_max: float = SETTLE_MAX):
        from pyroute2 import IPRoute
        from pyroute2.netlink.rtnl import (
            RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE,
        )

        groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE

        def open_sockets():
            # Events: a plain netlink socket, read with recv(); pyroute2 0.9's IPRoute
            # reads through its own event loop and buffers messages out of select()'s sight.
            events = open_netlink(NETLINK_ROUTE, 1 << 20, groups)
            try:
                return events, IPRoute()  # listings: pyroute2, on this thread only
            except BaseException:
                events.close()
                raise

        super().__init__(netns, open_sockets)
        self._events, self._query = self.sockets
        self.on_change = on_change
        self.settle, self.settle_max = settle, settle_max
        self.events = 0  # relevant netlink messages seen
        self.listings = 0  # address listings done after events

    def _list(self) -> Addresses:
        return discover_node_ips(self._query), discover_host_addresses(self._query)

    def snapshot(self) -> Addresses:
        """The addresses now (before start(): the loop owns the namespace thread after)."""
        return self.call(self._list)

    def _drain(self) -> bool:
        """Read everything the socket holds; True when a message matters."""
        relevant = False
        while True:
            try:
                buf = self._events.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return relevant
            except OSError as e:  # ENOBUFS: events were lost; list again to be sure
                logs.log.debug(f"netlink: {e}")
                relevant = True
                continue
            n = relevant_messages(buf)
            self.events += n
            relevant = relevant or n > 0

    def _loop(self) -> None:
        try:
            while True:
                if self.wait(self._events, None) == "stop":
                    return
                if not self._drain():
                    continue
                first = last = time.monotonic()
                while True:  # settle: the rest of the burst
                    now = time.monotonic()
                    left = min(last + self.settle, first + self.settle_max) - now
                    if left <= 0:
                        break
                    w = self.wait(self._events, left)
                    if w == "stop":
                        return
                    if w == "event" and self._drain():
                        last = time.monotonic()
                self.listings += 1
                self.on_change(*self._list())
        except Exception as e:  # never take the daemon down: the periodic full sync still re-reads
            if not self.stopped:
                logs.log.error(f"the node address watcher stopped: {e}; address changes are picked up by "
                               f"the next full sync (fullSyncPeriod) only",
                               extra={"fields": {"event": "addresses", "ok": False}})
