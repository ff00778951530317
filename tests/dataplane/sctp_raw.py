"""SCTP for the data-plane tests with raw IPv4 sockets (no SCTP socket stack needed).

The node only forwards SCTP: DNAT and conntrack need the kernel's SCTP conntrack
(CONFIG_NF_CT_PROTO_SCTP), not its SCTP sockets (CONFIG_IP_SCTP), which many small
kernels leave out. So both ends speak the first two packets of the SCTP handshake
themselves, over raw IPv4 sockets of protocol 132:

    python3 sctp_raw.py serve --bind 10.244.1.10 --bind 10.244.1.11 --port 9090  (backend)
        answers every INIT sent to one of its addresses with an INIT ACK whose State
        Cookie is the echo server's line `<server ip>:<port> <peer ip>:<port>`;
        prints READY once listening, exits on SIGTERM.
    python3 sctp_raw.py probe --dst 10.96.0.90 --port 80 --count 10 --timeout 1
        `count` INITs, each from a new random source port and initiate tag, each waiting
        for the matching INIT ACK (destination port and verification tag); prints a JSON
        list like probe.py: {"reply": "<cookie line>", "from": "<ip>:<port>"} or
        {"error": "timeout"}. "from" is the INIT ACK's source as the client saw it (after
        the node reversed the DNAT).

Checksums are real CRC32c: conntrack verifies them on the way in, NAT rewrites them.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import time

IPPROTO_SCTP = 132
INIT, INIT_ACK = 1, 2
STATE_COOKIE = 7


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def packet(sport: int, dport: int, vtag: int, chunk: bytes) -> bytes:
    """An SCTP packet: common header + one chunk, checksum filled in (little-endian on
    the wire, as Linux stores it)."""
    head = struct.pack("!HHII", sport, dport, vtag, 0)
    crc = crc32c(head + chunk)
    return head[:8] + struct.pack("<I", crc) + chunk


def init_chunk(ctype: int, tag: int, params: bytes = b"") -> bytes:
    body = struct.pack("!IIHHI", tag, 65535, 1, 1, tag)  # tag, a_rwnd, OS, MIS, initial TSN
    length = 4 + len(body) + len(params)
    return struct.pack("!BBH", ctype, 0, length) + body + params


def cookie_param(cookie: bytes) -> bytes:
    param = struct.pack("!HH", STATE_COOKIE, 4 + len(cookie)) + cookie
    return param + b"\0" * (-len(param) % 4)


def parse(ip_packet: bytes):
    """(src ip, dst ip, sport, dport, vtag, chunk type, chunk body) of an IPv4 SCTP packet."""
    ihl = (ip_packet[0] & 0x0F) * 4
    src, dst = socket.inet_ntoa(ip_packet[12:16]), socket.inet_ntoa(ip_packet[16:20])
    sctp = ip_packet[ihl:]
    sport, dport, vtag = struct.unpack_from("!HHI", sctp)
    ctype, _flags, clen = struct.unpack_from("!BBH", sctp, 12)
    return src, dst, sport, dport, vtag, ctype, sctp[16:12 + clen]


def cookie_of(body: bytes) -> bytes | None:
    off = 16  # the fixed INIT ACK fields
    while off + 4 <= len(body):
        ptype, plen = struct.unpack_from("!HH", body, off)
        if plen < 4:
            return None
        if ptype == STATE_COOKIE:
            return body[off + 4: off + plen]
        off += plen + (-plen % 4)
    return None


def serve(binds: list[str], ports: list[int]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP)
    tx = {}
    for ip in binds:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP)
        s.bind((ip, 0))  # the INIT ACK leaves from the endpoint address that got the INIT
        tx[ip] = s
    # Where the kernel has SCTP sockets it would answer an INIT to a port nobody listens
    # on with an ABORT (which ends the conntrack entry); listening there makes it answer
    # with its own INIT ACK instead, which the probe tells from ours by the cookie.
    listeners = []
    for ip in binds:
        for port in ports:
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SCTP)
            except OSError:
                break  # no SCTP sockets in this kernel: raw sockets only
            s.bind((ip, port))
            s.listen(16)
            listeners.append(s)
    print("READY", flush=True)
    while True:
        data = rx.recv(65535)
        try:
            src, dst, sport, dport, vtag, ctype, body = parse(data)
        except (struct.error, OSError):
            continue
        if ctype != INIT or dst not in tx or vtag != 0:
            continue
        peer_tag = struct.unpack_from("!I", body)[0]
        line = f"{dst}:{dport} {src}:{sport}".encode()
        my_tag = int.from_bytes(os.urandom(4), "big") or 1
        ack = packet(dport, sport, peer_tag, init_chunk(INIT_ACK, my_tag, cookie_param(line)))
        try:
            tx[dst].sendto(ack, (src, 0))
        except OSError:
            continue


def attempt(rx: socket.socket, dst: str, port: int, timeout: float) -> dict:
    sport = 20000 + int.from_bytes(os.urandom(2), "big") % 40000
    tag = int.from_bytes(os.urandom(4), "big") or 1
    rx.sendto(packet(sport, port, 0, init_chunk(INIT, tag)), (dst, 0))
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([rx], [], [], remaining)[0]:
            return {"error": "timeout"}
        try:
            src, _dst, psport, pdport, vtag, ctype, body = parse(rx.recv(65535))
        except struct.error:
            continue
        if ctype != INIT_ACK or pdport != sport or vtag != tag:
            continue  # someone else's packet
        cookie = cookie_of(body)
        if cookie is None or not cookie.isascii() or b" " not in cookie:
            continue  # a kernel SCTP stack's own INIT ACK (binary cookie), see serve()
        return {"reply": cookie.decode(), "from": f"{src}:{psport}"}


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve")
    sv.add_argument("--bind", action="append", required=True)
    sv.add_argument("--port", action="append", type=int, default=[])
    pr = sub.add_parser("probe")
    pr.add_argument("--dst", required=True)
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--count", type=int, default=1)
    pr.add_argument("--timeout", type=float, default=1.0)
    args = ap.parse_args()
    if args.cmd == "serve":
        return serve(args.bind, args.port)
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP) as rx:
        print(json.dumps([attempt(rx, args.dst, args.port, args.timeout) for _ in range(args.count)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
