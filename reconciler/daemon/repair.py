"""Repair on nftables events: another process's change to nftrec's tables, noticed from
the kernel's nf_tables notifications (NETLINK_NETFILTER, group NFNLGRP_NFTABLES) in the
target namespace, asks for a full sync at once. A batch's events arrive before the
NFT_MSG_NEWGEN that closes it; its sending socket and the generation it made tell whose
commit it was: nftrec's own are skipped. `Repairs` holds what is known and unrepaired,
and backs off when another process keeps changing the table (two writers must not fight
in a hot loop).
"""

from __future__ import annotations

import errno
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

from reconciler import logs
from reconciler.daemon.listener import NetlinkListener, open_netlink
from reconciler.kernel import own_portids

NETLINK_NETFILTER = 12
NFNLGRP_NFTABLES = 7
# room for the events of ordinary commits; a cold commit of thousands of Services overflows
# it (ENOBUFS), and then the ruleset generation tells whether anyone else committed
RCVBUF = 8 << 20
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWGEN = 15
NFTA_GEN_ID, NFTA_GEN_PROC_PID, NFTA_GEN_PROC_NAME = 1, 2, 3
# message type -> (object, what happened); every one carries its table's name as attribute 1
OBJECTS = {0: ("table", "added"), 2: ("table", "deleted"), 3: ("chain", "added"), 5: ("chain", "deleted"),
           6: ("rule", "added"), 8: ("rule", "deleted"), 9: ("set", "added"), 11: ("set", "deleted"),
           12: ("element", "added"), 14: ("element", "deleted"), 18: ("object", "added"),
           20: ("object", "deleted"), 22: ("flowtable", "added"), 24: ("flowtable", "deleted")}
FAMILIES = {"ip": 2, "ip6": 10}  # NFPROTO_IPV4, NFPROTO_IPV6: nftrec's tables
_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, portid
_ATTR = struct.Struct("=HH")

# Back-off: LIMIT repairs within WINDOW seconds make a fight; each further repair then
# waits FIRST, 2 x FIRST, ... (at most syncPeriod) after the previous one, until a whole
# WINDOW passes without another process's change.
LIMIT, WINDOW, FIRST = 5, 30.0, 1.0


@dataclass(frozen=True)
class Tamper:
    """One foreign change: a committed batch that touched nftrec's tables (`what`, e.g.
    "table ip nftrec deleted"), by `pid` (`name`); `known` False: events were lost and the
    kernel may differ (the daemon compares the ruleset generation)."""

    what: str
    pid: int = 0
    name: str = ""
    known: bool = True

    def __str__(self) -> str:
        return f"{self.what} by pid {self.pid} ({self.name})" if self.known else self.what


def _table_attr(buf: bytes, off: int, end: int) -> bytes | None:
    """Attribute 1 (the table's name, NUL-terminated) of the nfnetlink message at `off`."""
    a = off + 20  # nlmsghdr + nfgenmsg
    while a + 4 <= end:
        alen, atype = _ATTR.unpack_from(buf, a)
        if alen < 4:
            return None
        if atype & 0x7FFF == 1:
            return buf[a + 4:a + alen]
        a += (alen + 3) & ~3
    return None


def _gen_info(buf: bytes, off: int, end: int) -> tuple[int, int, str]:
    """(generation, pid, process name) of an NFT_MSG_NEWGEN."""
    gen, pid, name = -1, 0, ""
    a = off + 20
    while a + 4 <= end:
        alen, atype = _ATTR.unpack_from(buf, a)
        if alen < 4:
            break
        atype &= 0x7FFF
        if atype == NFTA_GEN_ID and alen >= 8:
            gen = struct.unpack_from(">I", buf, a + 4)[0]
        elif atype == NFTA_GEN_PROC_PID and alen >= 8:
            pid = struct.unpack_from(">I", buf, a + 4)[0]
        elif atype == NFTA_GEN_PROC_NAME:
            name = buf[a + 4:a + alen].split(b"\0", 1)[0].decode(errors="replace")
        a += (alen + 3) & ~3
    return gen, pid, name


class Batch:
    """The events of one transaction so far that touched nftrec's tables (per family)."""

    def __init__(self, table: str):
        self.table = table
        self._name = table.encode() + b"\0"
        self._by_num = {num: fam for fam, num in FAMILIES.items()}
        self.counts: Counter = Counter()  # (family, object, what) -> n

    def feed(self, buf: bytes) -> list[tuple[Counter, int, int, int, str]]:
        """One datagram; the batches it closes: (counts, portid, generation, pid, name) each."""
        closed = []
        off, name = 0, self._name
        while off + _NLMSGHDR.size <= len(buf):
            length, kind, _flags, _seq, portid = _NLMSGHDR.unpack_from(buf, off)
            if length < _NLMSGHDR.size:
                break
            end = off + length
            if kind >> 8 == NFNL_SUBSYS_NFTABLES and end <= len(buf):
                msg = kind & 0xFF
                if msg == NFT_MSG_NEWGEN:
                    if self.counts:
                        closed.append((self.counts, portid, *_gen_info(buf, off, end)))
                        self.counts = Counter()
                else:
                    obj = OBJECTS.get(msg)
                    fam = self._by_num.get(buf[off + 16]) if off + 20 <= end else None
                    # element payloads are never parsed: the table's name comes first
                    if obj is not None and fam is not None and _table_attr(buf, off, end) == name:
                        self.counts[(fam, *obj)] += 1
            off += (length + 3) & ~3
        return closed

    def reset(self) -> None:
        self.counts = Counter()

    def describe(self, counts: Counter) -> str:
        """"table ip nftrec deleted", "table ip nftrec: 2 rules deleted, 1 element added"."""
        parts = []
        for fam in FAMILIES:
            if counts.get((fam, "table", "deleted")):
                parts.append(f"table {fam} {self.table} deleted")
                continue
            items = [f"{n} {obj}{'s' if n > 1 else ''} {what}"
                     for (f, obj, what), n in sorted(counts.items()) if f == fam]
            if items:
                parts.append(f"table {fam} {self.table}: " + ", ".join(items))
        return "; ".join(parts)


class EventWatcher(NetlinkListener):
    """nf_tables events in network namespace `netns` (None: the host), on a thread of its
    own: `on_tamper(Tamper)` for each batch of another process that touched table `table`
    (ip/ip6), and once for lost events (ENOBUFS). Whose commit: this process's sockets now
    (the nft context in use), else `made(portid, generation)` of nftrec's nft object (a
    context it let go since, or a generation it committed). A plain socket, not pyroute2's
    nftables module: five fields of each message are needed, its decoder would parse every
    element of nftrec's own big commits, and pyroute2 0.9's sockets read through their
    own event loop (as addresses.py found for IPRoute)."""

    thread_name = "nftrec-nftevents"

    def __init__(self, netns: str | None, table: str, on_tamper: Callable[[Tamper], None], *,
                 made: Callable[[int, int], bool] = lambda portid, generation: False, rcvbuf: int = RCVBUF):
        super().__init__(netns, lambda: (open_netlink(NETLINK_NETFILTER, rcvbuf, group=NFNLGRP_NFTABLES),))
        self._sock = self.sockets[0]
        self.on_tamper, self.made = on_tamper, made
        self.batch = Batch(table)
        self._portids: set[int] = set()
        self.own = self.foreign = 0  # batches touching the table, by whose commit
        self.lost = 0  # times events were lost (ENOBUFS)
        self._lost = False  # events were lost and the socket is not drained yet

    def _ours(self, portid: int, generation: int) -> bool:
        """Looked up in this order: a socket let go after the lookup was recorded before it
        closed, so a commit through it is found one way or the other."""
        if portid not in self._portids:  # a new socket of ours (a renewed nft context), or foreign
            self._portids = own_portids()
        return portid in self._portids or self.made(portid, generation)

    def _drain(self) -> None:
        while True:
            try:
                buf = self._sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                if self._lost:
                    # Empty again, so events flow again. Around the gap batches may be cut or
                    # run together: they are dropped, and the daemon compares the generation
                    # instead (every commit whose events were lost has moved it by now).
                    self._lost = False
                    self.batch.reset()
                    self.lost += 1
                    logs.log.debug("nftables events were lost (ENOBUFS); comparing the ruleset generation")
                    self.on_tamper(Tamper("nftables events were lost (the event socket's buffer overflowed)",
                                          known=False))
                return
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self._lost = True
                continue
            for counts, portid, generation, pid, name in self.batch.feed(buf):
                if self._lost:
                    continue
                if self._ours(portid, generation):
                    self.own += 1
                    continue
                self.foreign += 1
                self.on_tamper(Tamper(self.batch.describe(counts), pid, name))

    def _loop(self) -> None:
        try:
            while True:
                if self.wait(self._sock, None) == "stop":
                    return
                self._drain()
        except Exception as e:  # never take the daemon down: full syncs still repair
            if not self.stopped:
                logs.log.error(f"the nftables event watcher stopped: {e}; another process's changes to the "
                               f"table are repaired by the next full sync (fullSyncPeriod) only",
                               extra={"fields": {"event": "repair", "ok": False}})


class Repairs:
    """Foreign changes known and not yet repaired, and the back-off against a fight.
    The event thread calls report(); the sync thread take() before a sync and repaired()
    after a full one succeeds; /healthz calls unhealthy(). Thread-safe."""

    def __init__(self, table: str, cap: Callable[[], float], clock: Callable[[], float] = time.monotonic, *,
                 limit: int = LIMIT, window: float = WINDOW, first: float = FIRST):
        self.table, self.cap, self.clock = table, cap, clock
        self.limit, self.window, self.first = limit, window, first
        self._lock = threading.Lock()
        self._pending: list[tuple[int, float, Tamper]] = []  # (seq, when, what), unrepaired
        self.seq = 0  # reports so far
        self._starts: deque = deque()  # when the repairs of the last window started
        self._last_start: float | None = None
        self._last_report: float | None = None
        self._backing = False  # in a fight: each repair waits longer
        self._strikes = 0  # repairs since the fight began
        self._said = False  # the fight was logged
        self._held = False  # a held-back repair is scheduled (the runner's timer)

    def report(self, tamper: Tamper) -> bool:
        """A foreign change (event thread). True: ask the runner for a sync now; False: a
        held-back repair is already scheduled."""
        now = self.clock()
        with self._lock:
            if self._backing and (self._last_report is None or self._last_report < now - self.window):
                self._backing, self._strikes, self._said = False, 0, False  # a quiet window: the fight is over
            self.seq += 1
            self._pending.append((self.seq, now, tamper))
            self._last_report = now
            return not self._held

    def _wait(self, now: float) -> float:
        while self._starts and self._starts[0] < now - self.window:
            self._starts.popleft()
        if not self._backing and len(self._starts) >= self.limit:
            self._backing = True
        if not self._backing or self._last_start is None:
            return 0.0
        delay = min(self.first * 2 ** min(self._strikes, 30), max(self.cap(), self.first))
        return max(0.0, self._last_start + delay - now)

    def take(self) -> tuple[float, bool] | None:
        """Before a sync: None (nothing to repair), or (seconds to hold the repair back,
        known). (0.0, True): repair now (logged here), a full sync; (0.0, False): only
        events were lost, the caller looks whether the kernel moved; (s > 0, True): the
        caller returns s as the runner's timer."""
        now = self.clock()
        with self._lock:
            self._held = False  # this sync's return sets the runner's timer anew
            if not self._pending:
                return None
            if not any(t.known for _, _, t in self._pending):
                return 0.0, False
            wait = self._wait(now)
            if wait > 0:
                if not self._said:
                    self._said = True
                    logs.log.error(f"another process keeps changing table {self.table}: {len(self._starts)} repairs "
                                   f"in {self.window:g}s (last: {self._pending[-1][2]}); backing off: repairs wait "
                                   f"{self.first:g}s, doubling, at most syncPeriod ({self.cap():g}s), and /healthz "
                                   f"fails until one holds. Stop the other writer, or give it a table of its own.",
                                   extra={"fields": {"event": "repair", "ok": False, "backoff": True}})
                self._held = True
                return wait, True
            if self._backing:
                self._strikes += 1
            self._starts.append(now)
            self._last_start = now
            shown = self._summary()
        logs.log.warning(f"repairing: {shown}", extra={"fields": {"event": "repair", "changes": shown}})
        return 0.0, True

    def _summary(self) -> str:
        whats = Counter(str(t) for _, _, t in self._pending)  # in order, each once
        shown = [w + (f" ({n} times)" if n > 1 else "") for w, n in whats.items()]
        return "; ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")

    def repaired(self, seq: int) -> None:
        """A full sync that listed the kernel after report `seq` succeeded."""
        with self._lock:
            self._pending = [p for p in self._pending if p[0] > seq]

    def unhealthy(self) -> str | None:
        """Why /healthz fails: a known change not repaired yet (held back or failing)."""
        now = self.clock()
        with self._lock:
            known = [(when, t) for _, when, t in self._pending if t.known]
            if not known:
                return None
            when, t = known[0]
            state = (f"backing off, another process keeps changing it; next repair in {self._wait(now):.1f}s"
                     if self._backing else "not repaired yet")
            return f"table {self.table} differs from the applied ruleset since {now - when:.1f}s ago ({t}): {state}"
