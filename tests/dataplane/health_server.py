"""A health endpoint for the readiness-probe data-plane tests (run inside the backend namespace).

    python3 health_server.py --bind 10.244.1.10 --port 8081

answers every HTTP GET with 200 "ok" (so it serves httpGet and tcpSocket probes); prints
READY once listening; exits on SIGTERM. Stopping it is how a test makes a backend fail its
probe while the backend's echo server (its traffic port) keeps running.
"""

from __future__ import annotations

import argparse
import signal
import sys
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the FQDN of the address: a DNS query that hangs in
        # a namespace without a resolver
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = Server((args.bind, args.port), Handler)
    print("READY", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
