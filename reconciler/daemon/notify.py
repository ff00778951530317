"""systemd's service notification (sd_notify(3)) for `nftrec watch` under Type=notify.

One datagram per message to $NOTIFY_SOCKET (a path, or an abstract name written with a
leading "@"): READY=1 after the first successful sync, WATCHDOG=1 from the sync loop at
half of $WATCHDOG_USEC (when $WATCHDOG_PID is unset or names this process), RELOADING=1
and READY=1 around SIGHUP, STOPPING=1, STATUS= lines. Without $NOTIFY_SOCKET it does
nothing. The variables are taken out of the environment so no child (git, ssh, a health
check) can speak for the daemon. Written by hand: the protocol is a few lines, stable and
documented for reimplementation, and a library would be one more dependency per release.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable, MutableMapping

from reconciler import logs

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """The daemon's messages to systemd; every method is a no-op without $NOTIFY_SOCKET."""

    def __init__(self, env: MutableMapping[str, str] = os.environ, clock: Callable[[], float] = time.monotonic):
        found = {k: env.pop(k, "") for k in _VARIABLES}
        address = found["NOTIFY_SOCKET"]
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.interval = None  # seconds between two WATCHDOG=1
        pid = found["WATCHDOG_PID"]
        if self.address and found["WATCHDOG_USEC"].isdigit() and (not pid or pid == str(os.getpid())):
            self.interval = int(found["WATCHDOG_USEC"]) / 2e6 or None
        self._clock = clock
        self._next_ping = 0.0
        self._ready = False
        self._reloading = False
        self._said_failure = False

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        try:
            # non-blocking: a full queue (systemd stuck) must not stop the sync loop
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
                s.sendto("\n".join(lines).encode("utf-8", "replace"), self.address)
        except OSError as e:
            if not self._said_failure:  # systemd restarted or gone: say it once, go on
                logs.log.warning(f"cannot notify systemd at {self.address.lstrip(chr(0))!r}: {e}")
                self._said_failure = True

    def tick(self) -> None:
        """From the sync loop at each turn: WATCHDOG=1 when due, so a stuck loop stops it."""
        now = self._clock()
        if self.interval is not None and now >= self._next_ping:
            self.send("WATCHDOG=1")
            self._next_ping = now + self.interval

    def synced(self, applied: bool, status: str) -> None:
        """After each sync: READY=1 after the first that applied (or the first after a
        reload, applied or not: the old config stays), and the daemon's health as STATUS."""
        lines = [f"STATUS={' '.join(status.split())[:200]}"]
        if (applied and not self._ready) or (self._ready and self._reloading):
            lines.insert(0, "READY=1")
            self._ready, self._reloading = True, False
        self.send(*lines)

    def reloading(self) -> None:
        if self._ready:
            self._reloading = True
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=re-reading the node config (SIGHUP)")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping: the rules stay in place")
