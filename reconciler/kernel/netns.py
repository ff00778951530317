"""A thread inside a network namespace. Namespaces are per thread on Linux: only this
thread (and the sockets it opens) sees it, the caller's thread never switches. A missing
namespace is an error, never created (unlike pyroute2.netns.setns' default O_CREAT).
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import threading
from typing import Callable, TypeVar

from reconciler.kernel.interface import PERMISSION_HINT, NftError

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000


def netns_path(netns: str) -> str:
    """The file of `netns` (a name under /run/netns, or a path)."""
    if not netns.startswith("/") and ("/" in netns or netns in (".", "..")):
        raise NftError(f"bad network namespace name {netns!r}")
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


def missing_netns(netns: str) -> NftError:
    """The error for a namespace that is not there: its name, where it was looked for,
    and how to list or make one."""
    return NftError(f"network namespace {netns!r} does not exist ({netns_path(netns)}; see `ip netns list`); "
                    f"create it with `ip netns add {netns}`")


def require_netns(netns: str) -> None:
    """Raise missing_netns when `netns` does not exist; commands check this before they
    create anything for it (a state directory, a lock, a cache)."""
    if not os.path.exists(netns_path(netns)):
        raise missing_netns(netns)


def enter_netns(netns: str) -> None:
    """Move the calling thread into `netns` (a name under /run/netns, or a path)."""
    path = netns_path(netns)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise missing_netns(netns) from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            hint = f"; {PERMISSION_HINT}" if e == errno.EPERM else ""
            raise NftError(f"cannot enter network namespace {netns!r}: {os.strerror(e)}{hint}")
    finally:
        os.close(fd)


class NamespaceThread:
    """One dedicated thread; with a netns it moves itself into it before anything else."""

    def __init__(self, netns: str | None):
        self._q: queue.Queue = queue.Queue()
        ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=self._main, args=(netns, ready), name=f"nft-{netns or 'host'}", daemon=True
        )
        self._thread.start()
        err = ready.get()
        if err is not None:
            raise err

    def _main(self, netns: str | None, ready: queue.Queue) -> None:
        try:
            if netns is not None:
                enter_netns(netns)
        except BaseException as e:  # report to the constructor, then end the thread
            ready.put(e)
            return
        ready.put(None)
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box.append((True, fn()))
            except BaseException as e:
                box.append((False, e))
            done.set()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the thread and return its result (or raise its exception)."""
        if not self._thread.is_alive():
            raise NftError("the nft worker thread is closed")
        box: list = []
        done = threading.Event()
        self._q.put((fn, box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
