"""Readiness-probe scale benchmark: N probed endpoints every P seconds from one
process, the daemon's own ProbeManager (one asyncio thread in the namespace, bounded
concurrency), against local TCP listeners on 127.0.0.0/8 inside a throwaway network
namespace. Reports the probe rate achieved, CPU (share of one core) and RSS.

    sudo .venv/bin/python bench/probes.py [--endpoints 10000] [--period 5] [--handler tcpSocket|httpGet]
                                          [--seconds 30]

The namespace is created and always deleted; nothing touches the host's interfaces.
Endpoints are 100 addresses 127.0.<s>.<1..100> x one port per Service (listeners on
0.0.0.0:<port> in the namespace answer every address of lo).
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SERVER = r"""
import os, selectors, socket, sys
# Listeners as light as possible (the prober is what is measured): accept, answer at once
# (an HTTP client reads the status line; a TCP probe only needs the handshake), close.
RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
import resource
s, h = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
sel = selectors.DefaultSelector()
for p in sys.argv[1:]:
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", int(p)))
    l.listen(4096)
    l.setblocking(False)
    sel.register(l, selectors.EVENT_READ)
print("READY", flush=True)
while True:
    for key, _ in sel.select():
        while True:
            try:
                c, _ = key.fileobj.accept()
            except BlockingIOError:
                break
            try:
                c.send(RESP)
            except OSError:
                pass
            c.close()
"""


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def inventory(endpoints: int, period: int, handler: str, base_port: int):
    from reconciler.intake import Endpoint, EndpointPort, EndpointSlice, Inventory, Probe, Service, ServicePort

    per = 100
    services, slices = [], []
    for s in range((endpoints + per - 1) // per):
        port = base_port + s
        probe = Probe(handler, "health", path="/healthz", period_seconds=period, timeout_seconds=1)
        services.append(Service("bench", f"svc-{s}", "ClusterIP", (f"10.96.{s // 250}.{s % 250 + 1}",), ("IPv4",),
                                (ServicePort("http", "TCP", 80, 8080),), readiness_probe=probe))
        n = min(per, endpoints - s * per)
        eps = tuple(Endpoint((f"127.0.{s // 200 + 1}.{(s % 200) * 0 + i + 1}",)) for i in range(n))
        slices.append(EndpointSlice("bench", f"svc-{s}-1", f"svc-{s}", "IPv4", eps,
                                    (EndpointPort("http", "TCP", 8080), EndpointPort("health", "TCP", port))))
    return Inventory(tuple(services), tuple(slices))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", type=int, default=10000)
    ap.add_argument("--period", type=int, default=5)
    ap.add_argument("--handler", default="tcpSocket", choices=("tcpSocket", "httpGet"))
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=512)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (creates a network namespace)", file=sys.stderr)
        return 1

    from prometheus_client import CollectorRegistry

    from reconciler.daemon.probing import ProbeManager

    ns = f"nftrec-bench-probes-{uuid.uuid4().hex[:6]}"
    base_port = 20000
    services = (args.endpoints + 99) // 100
    subprocess.run(["ip", "netns", "add", ns], check=True)
    server = None
    mgr = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER,
                                   *(str(base_port + s) for s in range(services))],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([server.stdout], [], [], 30)
        if not ready or server.stdout.readline().strip() != "READY":
            print("the listener process did not start: " + server.stderr.read(), file=sys.stderr)
            return 1
        inv = inventory(args.endpoints, args.period, args.handler, base_port)
        registry = CollectorRegistry()
        mgr = ProbeManager(ns, lambda: None, registry=registry, concurrency=args.concurrency)

        def results() -> dict[str, float]:
            out = {"success": 0.0, "failure": 0.0}
            for metric in registry.collect():
                if metric.name == "nftrec_probe_results":
                    for s in metric.samples:
                        if s.name.endswith("_total"):
                            out[s.labels["result"]] += s.value
            return out

        rss0 = rss_kb("VmRSS")
        mgr.update(inv)
        time.sleep(args.period * 1.5)  # every worker started (jittered over one period)
        r0, t0, c0 = results(), time.monotonic(), os.times()
        time.sleep(args.seconds)
        r1, t1, c1 = results(), time.monotonic(), os.times()
        wall = t1 - t0
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        ok = r1["success"] - r0["success"]
        bad = r1["failure"] - r0["failure"]
        down = sum(len(v) for v in mgr.down().values())
        print(f"readiness probes: {args.endpoints} endpoints, {args.handler}, periodSeconds {args.period}, "
              f"concurrency {args.concurrency}, measured over {wall:.1f}s")
        print(f"| metric | value |\n|---|---|")
        print(f"| probes/s achieved (target {args.endpoints / args.period:.0f}) | {(ok + bad) / wall:.0f} |")
        print(f"| failed probes | {bad:.0f} |")
        print(f"| endpoints down at the end | {down} |")
        print(f"| CPU (share of one core, the probing process) | {100 * cpu / wall:.0f} % |")
        print(f"| CPU per probe | {1e6 * cpu / max(ok + bad, 1):.0f} us |")
        print(f"| RSS before probing / now / peak | {rss0 / 1024:.0f} / {rss_kb('VmRSS') / 1024:.0f} / "
              f"{rss_kb('VmHWM') / 1024:.0f} MB |")
        return 0 if bad == 0 else 2
    finally:
        if mgr is not None:
            mgr.close()
        if server is not None:
            server.kill()
            server.wait(5)
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
