#!/usr/bin/env python3
"""Layout benchmark: kube-proxy's shape (K) against nftrec's default `sharded` layout, in
the same run, with issue 8's realistic mix.

    sudo .venv/bin/python bench/layout.py                  # 10,000 Services x 5 endpoints
    sudo .venv/bin/python bench/layout.py --services 1000  # quick
    sudo .venv/bin/python bench/layout.py --json out.json

Mix (Service i): 70 % ClusterIP, 20 % NodePort, 10 % LoadBalancer (an ingress IP; every
other one with loadBalancerSourceRanges); every tenth Service sessionAffinity ClientIP;
every 20th (a NodePort) externalTrafficPolicy Local; M ready endpoints, one of them on
this node for every third Service; one TCP port.

For each layout (kube-proxy, then sharded), in a fresh namespace `nftrec-bench-layout-*`
(deleted in a `finally`; the host ruleset is never touched):
  * compile (in-process, `compile_ruleset`) and render;
  * cold load: `nft -f` of the rendered script (the issue's K for the kube-proxy layout);
  * cold apply's commit: the transaction nftrec's `apply` computes against an empty
    kernel (`diff` + `transaction_for`), run through libnftables in-process, as apply does
    (a second fresh namespace);
  * `read_live` (listing + parsing, what `plan --refresh` and verification pay);
  * one-Service changes, each planned as apply plans them (listing, relocate, diff,
    transaction) and committed through libnftables, then undone; 3x, median:
    an endpoint added to a ClusterIP Service (5 -> 6), one added to a ClientIP-affinity
    Service, a new Service with 5 endpoints.
Every figure is printed with its ratio to the kube-proxy layout's in the same run.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from reconciler.compile.layout import relocate  # noqa: E402
from reconciler.compile.render import render_script  # noqa: E402
from reconciler.compile.services import compile_ruleset  # noqa: E402
from reconciler.engine.changes import diff, transaction_for  # noqa: E402
from reconciler.intake.model import (  # noqa: E402
    Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, NodeConfig, Service, ServicePort,
)
from reconciler.kernel.live import read_live  # noqa: E402
from reconciler.kernel.nft import Libnftables  # noqa: E402

NODE = "bench-node"
TABLE = "nftrec"
SVC_NET = ipaddress.ip_network("172.30.0.0/16")
EP_NET = ipaddress.ip_network("10.128.0.0/9")
LB_NET = ipaddress.ip_network("100.64.0.0/16")


def service(i: int) -> Service:
    r = i % 10
    typ = "LoadBalancer" if r == 9 else "NodePort" if r in (7, 8) else "ClusterIP"
    node_port = 30000 + (i // 10) * 3 + (r - 7) if typ != "ClusterIP" and (i // 10) * 3 + 2 < 2767 else 0
    if typ != "ClusterIP" and not node_port:
        typ = "ClusterIP"  # node-port range exhausted (> ~27,000 Services)
    lb = (LoadBalancerIngress(str(LB_NET.network_address + 1 + i // 10)),) if typ == "LoadBalancer" else ()
    return Service(
        namespace=f"ns-{i // 500}", name=f"svc-{i}", type=typ,
        cluster_ips=(str(SVC_NET.network_address + 10 + i),), ip_families=("IPv4",),
        ports=(ServicePort("http", "TCP", 80, 8080, node_port),),
        load_balancer_ingress=lb,
        load_balancer_source_ranges=("192.168.0.0/16", "203.0.113.0/24") if lb and i % 20 == 19 else (),
        external_traffic_policy="Local" if r == 8 and i % 20 == 8 else "Cluster",
        session_affinity="ClientIP" if i % 10 == 5 else "None",
        affinity_timeout_seconds=10800,
    )


def endpoints(i: int, m: int, extra: int = 0) -> EndpointSlice:
    base = int(EP_NET.network_address) + 1 + i * (m + 2)
    eps = tuple(Endpoint((str(ipaddress.ip_address(base + j)),),
                         node_name=NODE if (j == 0 and i % 3 == 0) else f"node-{j % 7}")
                for j in range(m + extra))
    return EndpointSlice(f"ns-{i // 500}", f"svc-{i}-abcde", f"svc-{i}", "IPv4", eps,
                         (EndpointPort("http", "TCP", 8080),))


def inventory(n: int, m: int) -> Inventory:
    return Inventory(tuple(service(i) for i in range(n)), tuple(endpoints(i, m) for i in range(n)), revision="bench")


def config(layout: str) -> NodeConfig:
    return NodeConfig(NODE, node_ips=("192.168.99.2",), cluster_cidrs=(str(EP_NET),), service_cidrs=(str(SVC_NET),),
                      table_name=TABLE, layout=layout)


def edits(inv: Inventory, n: int, m: int) -> dict[str, Inventory]:
    k = n // 2 - (n // 2) % 10  # a ClusterIP Service (i % 10 == 0)
    a = k + 5  # ClientIP affinity
    sl = list(inv.endpoint_slices)
    grow = sl.copy()
    grow[k] = endpoints(k, m, extra=1)
    aff = sl.copy()
    aff[a] = endpoints(a, m, extra=1)
    new = n + 1  # i % 10 == 1: ClusterIP
    added = Inventory(inv.services + (replace(service(new), name="svc-new"),),
                      inv.endpoint_slices + (replace(endpoints(new, m), service_name="svc-new", name="svc-new-x"),),
                      revision="bench+new")
    return {"endpoint added (ClusterIP)": replace(inv, endpoint_slices=tuple(grow)),
            "endpoint added (ClientIP affinity)": replace(inv, endpoint_slices=tuple(aff)),
            "Service added": added}


class Netns:
    def __init__(self, tag: str):
        self.name = f"nftrec-bench-layout-{tag}-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)

    def delete(self):
        subprocess.run(["ip", "netns", "delete", self.name], check=False)


def timed_nft_file(ns: str, path: Path, timeout: float) -> dict:
    t = time.perf_counter()
    p = subprocess.Popen(["ip", "netns", "exec", ns, "nft", "-f", str(path)])
    try:
        _pid, status, ru = os.wait4(p.pid, 0)
    except BaseException:
        p.kill()
        raise
    wall = time.perf_counter() - t
    if wall > timeout or os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"nft -f {path} failed ({status}) in {ns}")
    return {"wall": wall, "user": ru.ru_utime, "sys": ru.ru_stime}


def run_layout(layout: str, inv: Inventory, changed: dict[str, Inventory], tmp: Path, reps: int,
               timeout: float) -> dict:
    R: dict = {}
    cfg = config(layout)
    t = time.perf_counter()
    desired = compile_ruleset(inv, cfg)
    R["compile_s"] = time.perf_counter() - t
    t = time.perf_counter()
    script = render_script(desired)
    R["render_s"] = time.perf_counter() - t
    path = tmp / f"{layout}.nft"
    path.write_text(script)
    t4 = desired.tables["ip"]
    R["objects"] = {"chains": len(t4.chains), "rules": sum(len(c.rules) for c in t4.chains.values()),
                    "named sets": len(t4.sets), "anonymous sets": script.count("map {"),
                    "elements": sum(len(s.elements) for s in t4.sets.values()), "script lines": script.count("\n")}
    print(f"[{layout}] compile {R['compile_s']:.2f} s, render {R['render_s']:.2f} s, {R['objects']}", file=sys.stderr)

    ns = Netns(f"{layout}-f")
    try:
        R["nft_f"] = timed_nft_file(ns.name, path, timeout)
        print(f"[{layout}] nft -f cold: {R['nft_f']}", file=sys.stderr)
    finally:
        ns.delete()

    ns = Netns(f"{layout}-a")
    nft = None
    try:
        nft = Libnftables(netns=ns.name)
        t = time.perf_counter()
        tx = transaction_for(diff(desired, read_live(nft, TABLE)), desired)
        plan_s = time.perf_counter() - t
        t = time.perf_counter()
        nft.run(tx)
        R["apply_commit_s"] = time.perf_counter() - t
        R["apply_plan_s"] = plan_s
        print(f"[{layout}] cold apply: plan {plan_s:.2f} s, commit {R['apply_commit_s']:.2f} s ({len(tx)} ops)",
              file=sys.stderr)
        t = time.perf_counter()
        live = read_live(nft, TABLE)
        R["read_live_s"] = time.perf_counter() - t
        assert diff(desired, live).empty, "the kernel does not hold the desired ruleset"
        R["changes"] = {}
        for what, inv2 in changed.items():
            fwd_s, back_s, plan_s = [], [], []
            ops = undo_ops = None
            compiled = {"fwd": compile_ruleset(inv2, cfg), "back": desired}  # not timed: what changes is
            for _ in range(reps):
                for direction in ("fwd", "back"):
                    d = compiled[direction]
                    t = time.perf_counter()
                    live = read_live(nft, TABLE)
                    d = relocate(d, live)  # as apply does
                    tx = transaction_for(diff(d, live), d)
                    p = time.perf_counter() - t
                    t = time.perf_counter()
                    nft.run(tx)
                    c = time.perf_counter() - t
                    if direction == "fwd":
                        fwd_s.append(c)
                        plan_s.append(p)
                        ops = len(tx)
                    else:
                        back_s.append(c)
                        undo_ops = len(tx)
                    (tmp / f"{layout}-{len(R['changes'])}-{direction}.tx").write_text(tx.text())
            R["changes"][what] = {"commit_ms": statistics.median(fwd_s) * 1000,
                                  "undo_ms": statistics.median(back_s) * 1000,
                                  "plan_s": statistics.median(plan_s), "ops": ops, "undo_ops": undo_ops}
            print(f"[{layout}] {what}: {R['changes'][what]}", file=sys.stderr)
    finally:
        if nft is not None:
            nft.close()
        ns.delete()
    return R


# What undoing each change is: the removal measured against kube-proxy's layout.
UNDONE = {"endpoint added (ClusterIP)": "= endpoint removed", "endpoint added (ClientIP affinity)": "= endpoint removed",
          "Service added": "= Service removed"}


def table(R: dict) -> str:
    K, S = R["kube-proxy"], R["sharded"]
    out = [f"{R['services']:,} Services x {R['endpoints']} endpoints (issue 8 mix), one run",
           "", "| metric | kube-proxy layout (K) | sharded | sharded / K |", "|---|---|---|---|"]

    def row(name, k, s, fmt="{:.2f} s"):
        ratio = f"{s / k:.2f}" if k else "-"
        out.append(f"| {name} | {fmt.format(k)} | {fmt.format(s)} | {ratio} |")

    for key in ("chains", "rules", "named sets", "anonymous sets", "elements", "script lines"):
        row(f"ip table: {key}", K["objects"][key], S["objects"][key], "{:,}")
    row("compile (in-process)", K["compile_s"], S["compile_s"])
    row("render", K["render_s"], S["render_s"])
    row("**cold load `nft -f`** (wall)", K["nft_f"]["wall"], S["nft_f"]["wall"])
    row("  … nft's sys time (kernel)", K["nft_f"]["sys"], S["nft_f"]["sys"])
    row("**cold apply: commit** (libnftables, apply's transaction)", K["apply_commit_s"], S["apply_commit_s"])
    row("cold apply: diff + transaction", K["apply_plan_s"], S["apply_plan_s"])
    row("read_live (listing + parse; plan --refresh, verify)", K["read_live_s"], S["read_live_s"])
    for what in K["changes"]:
        k, s = K["changes"][what], S["changes"][what]
        row(f"**{what}: commit** (median of {R['reps']})", k["commit_ms"], s["commit_ms"], "{:.0f} ms")
        row(f"  … undo ({UNDONE[what]}): commit", k["undo_ms"], s["undo_ms"], "{:.0f} ms")
        row(f"  … list + relocate + diff", k["plan_s"], s["plan_s"])
        row(f"  … operations (undo)", k["ops"], s["ops"], "{}")
        out[-1] = out[-1].replace(f"| {k['ops']} |", f"| {k['ops']} ({k['undo_ops']}) |", 1).replace(
            f"| {s['ops']} |", f"| {s['ops']} ({s['undo_ops']}) |", 1)
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the scripts and transactions (path on stderr)")
    ap.add_argument("--layouts", default="kube-proxy,sharded", help="comma-separated, in run order")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    import signal

    # `timeout` sends SIGTERM: leave through the `finally`s, which delete the namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n, m = args.services, args.endpoints
    inv = inventory(n, m)
    changed = edits(inv, n, m)
    R = {"services": n, "endpoints": m, "reps": args.reps}
    tmp = tempfile.mkdtemp(prefix="nftrec-bench-layout-")
    try:
        for layout in args.layouts.split(","):
            R[layout] = run_layout(layout, inv, changed, Path(tmp), args.reps, args.timeout)
    finally:
        if args.keep:
            print(f"scripts and transactions kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if "kube-proxy" in R and "sharded" in R:
        print(table(R))
    if args.json:
        Path(args.json).write_text(json.dumps(R, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
