"""Tiny TCP+UDP echo server for the data-plane tests (run inside a backend namespace).

    python3 echo_server.py --bind 10.244.1.10 --bind fd00:244:1::10 --port 8080 --port 8081

listens on every (bind address, port) pair for both TCP and UDP. Every TCP connection
and every UDP datagram is answered with one line

    <server ip>:<server port> <peer ip>:<peer port>

so a test sees which endpoint got the packet and which source address it arrived from
(masqueraded or not). Prints READY once every socket is bound; exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import selectors
import signal
import socket
import sys


def _fmt(addr) -> str:
    return f"{addr[0]}:{addr[1]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", action="append", required=True)
    ap.add_argument("--port", action="append", type=int, required=True)
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    for ip in args.bind:
        fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
        for port in args.port:
            t = socket.socket(fam, socket.SOCK_STREAM)
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            t.bind((ip, port))
            t.listen(128)
            t.setblocking(False)
            sel.register(t, selectors.EVENT_READ, "tcp")
            u = socket.socket(fam, socket.SOCK_DGRAM)
            u.bind((ip, port))
            u.setblocking(False)
            sel.register(u, selectors.EVENT_READ, "udp")
    print("READY", flush=True)

    while True:
        for key, _ in sel.select(timeout=1.0):
            sock = key.fileobj
            try:
                if key.data == "tcp":
                    conn, peer = sock.accept()
                    with conn:
                        conn.settimeout(1.0)
                        line = f"{_fmt(conn.getsockname())} {_fmt(peer)}\n"
                        conn.sendall(line.encode())
                else:
                    _, peer = sock.recvfrom(2048)
                    line = f"{_fmt(sock.getsockname())} {_fmt(peer)}\n"
                    sock.sendto(line.encode(), peer)
            except OSError:
                continue  # a peer that went away must not stop the server


if __name__ == "__main__":
    raise SystemExit(main())
