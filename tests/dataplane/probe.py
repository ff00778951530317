"""Client side of the data-plane tests (run inside a client namespace).

    python3 probe.py --proto tcp --dst 10.96.0.10 --port 80 --count 20 --timeout 1

Makes `count` independent attempts (a new socket, so a new source port and a new
conntrack entry, each time) and prints one JSON list: per attempt either
{"reply": "<server ip>:<port> <peer ip>:<port>"} or {"error": KIND} where KIND is
"refused" (TCP RST or ICMP port unreachable: a reject), "unreachable" (ICMP host/net
unreachable or admin-prohibited), "timeout" (nothing came back: a drop) or "other:<errno>".

    python3 probe.py --proto udp --dst 10.96.0.80 --port 53 --session

keeps ONE connected UDP socket (one source port, so one conntrack entry) for its whole
life: every line `N` read on stdin sends N datagrams in turn, each waiting for its answer,
and prints one JSON list of N results (same shape as above). Like a DNS resolver that
reuses its source port: the client conntrack pins to one endpoint.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import socket
import struct
import sys
import time

IP_RECVERR = getattr(socket, "IP_RECVERR", 11)  # Linux values
IPV6_RECVERR = getattr(socket, "IPV6_RECVERR", 25)


def _kind(exc: OSError) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timeout"
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
        return "unreachable"
    if exc.errno == errno.ECONNRESET:
        return "reset"
    return f"other:{exc.errno}"


def _connect_tcp(s: socket.socket, addr: tuple, fam: int, deadline: float) -> str | None:
    """Non-blocking connect that also reads ICMP errors from the socket's error queue.

    On veth pairs the whole round trip (SYN -> node -> ICMP error -> client) can run
    synchronously inside connect() while it holds the socket lock; the kernel then only
    records a *soft* error and keeps retransmitting the SYN, so a plain connect() would
    report a reject as a 1 s timeout. With IP_RECVERR the ICMP error is queued on the
    socket anyway, and we report it as soon as it arrives. Returns None once connected,
    else the error kind.
    """
    if fam == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    else:
        s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
    s.setblocking(False)
    rc = s.connect_ex(addr)
    if rc not in (0, errno.EINPROGRESS):
        return _kind(OSError(rc, os.strerror(rc)))
    poller = select.poll()
    poller.register(s, select.POLLOUT | select.POLLERR)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        events = poller.poll(max(1, int(remaining * 1000)))
        if not events:
            return "timeout"
        so_error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if so_error:
            return _kind(OSError(so_error, os.strerror(so_error)))
        try:
            _, anc, _, _ = s.recvmsg(0, 512, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            anc = []
        for _level, _type, data in anc:
            ee_errno = struct.unpack_from("=I", data)[0]
            return _kind(OSError(ee_errno, os.strerror(ee_errno)))
        try:
            s.getpeername()
            return None  # connected
        except OSError:
            time.sleep(0.01)  # spurious wake-up; poll again


def attempt(proto: str, dst: str, port: int, timeout: float, src: str | None) -> dict:
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    deadline = time.monotonic() + timeout
    s = socket.socket(fam, kind)
    try:
        if src:
            s.bind((src, 0))
        if proto == "tcp":
            err = _connect_tcp(s, (dst, port), fam, deadline)
            if err:
                return {"error": err}
            s.setblocking(True)
        else:
            s.connect((dst, port))
        s.settimeout(max(0.05, deadline - time.monotonic()))
        if proto == "udp":
            s.send(b"ping\n")
            data = s.recv(2048)
        else:
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(2048)
                if not chunk:
                    break
                data += chunk
        return {"reply": data.decode().strip()}
    except OSError as exc:
        return {"error": _kind(exc)}
    finally:
        s.close()


def _exchange(s: socket.socket, timeout: float) -> dict:
    s.settimeout(timeout)
    try:
        s.send(b"ping\n")
        return {"reply": s.recv(2048).decode().strip()}
    except OSError as exc:
        return {"error": _kind(exc)}


def session(dst: str, port: int, timeout: float, src: str | None) -> int:
    """One UDP socket for every exchange (see the module doc); ends at EOF on stdin."""
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        if src:
            s.bind((src, 0))
        s.connect((dst, port))
        print(json.dumps({"local": "%s:%d" % s.getsockname()[:2]}), flush=True)
        for line in sys.stdin:
            n = int(line)
            print(json.dumps([_exchange(s, timeout) for _ in range(n)]), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", choices=("tcp", "udp"), default="tcp")
    ap.add_argument("--dst", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--src")
    ap.add_argument("--session", action="store_true",
                    help="UDP only: one socket, N exchanges per stdin line N (see above)")
    args = ap.parse_args()
    if args.session:
        if args.proto != "udp":
            ap.error("--session is for UDP")
        return session(args.dst, args.port, args.timeout, args.src)
    results = [attempt(args.proto, args.dst, args.port, args.timeout, args.src)
               for _ in range(args.count)]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
