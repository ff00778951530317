"""A thread inside a network namespace that waits on netlink sockets opened there (a
netlink socket belongs to the namespace it was created in) until asked to stop: the
base of the daemon's address watcher (addresses.py) and nftables event watcher
(repair.py), which read their sockets on it.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Callable

from reconciler.kernel import NamespaceThread

SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
SO_RCVBUFFORCE = 33


def open_netlink(protocol: int, rcvbuf: int, groups: int = 0, group: int | None = None) -> socket.socket:
    """A non-blocking netlink socket of `protocol`, subscribed to the `groups` bitmask or
    to multicast group number `group` (groups past 32 need the latter)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except OSError:  # without CAP_NET_ADMIN: what net.core.rmem_max allows
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, groups))
        if group is not None:
            sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise


class NetlinkListener:
    """`open_sockets()` runs in namespace `netns` (None: the host); its sockets are
    `self.sockets`. `start()` runs the subclass's `_loop()` on the namespace's thread;
    `_loop` waits with `wait()` and returns when it says "stop"."""

    thread_name = "nftrec-netlink"

    def __init__(self, netns: str | None, open_sockets: Callable[[], tuple]):
        self._ns = NamespaceThread(netns)
        try:
            self.sockets = self._ns.call(open_sockets)
        except BaseException:
            self._ns.close()
            raise
        self._stop_r, self._stop_w = os.pipe()
        self.stopped = False
        self._thread = threading.Thread(target=self._ns.call, args=(self._loop,), name=self.thread_name,
                                        daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)

        def close():
            for sock in self.sockets:
                try:
                    sock.close()
                except Exception:
                    pass
        try:
            self._ns.call(close)
        except Exception:
            pass
        self._ns.close()
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def call(self, fn):
        """Run `fn` in the namespace (before start(): the loop owns the thread after)."""
        return self._ns.call(fn)

    def wait(self, sock: socket.socket, timeout: float | None) -> str:
        """'event' (`sock` is readable), 'stop' or 'timeout'."""
        ready, _, _ = select.select([sock.fileno(), self._stop_r], [], [], timeout)
        if self._stop_r in ready:
            return "stop"
        return "event" if ready else "timeout"
