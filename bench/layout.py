#!/usr/bin/env python3
"""Layout benchmark: kube-proxy's layout (K) against nftrec's default `sharded` layout, in
the same run, on the benchmark's Service mix (bench/mix.py).

    sudo .venv/bin/python bench/layout.py                  # 10,000 Services x 5 endpoints
    sudo .venv/bin/python bench/layout.py --services 1000  # quick

For each layout, in fresh namespaces `nftrec-bench-layout-*` (deleted in a `finally`):
compile and render in-process; `nft -f` of the script (cold load); the transaction a cold
`apply` computes, committed through libnftables as `apply` does; `read_live`; then three
one-Service changes (an endpoint added to a ClusterIP Service and to a ClientIP-affinity
Service, a Service added), each planned as `apply` plans it, committed and undone,
--reps times (median). Every figure is printed with its ratio to the kube-proxy layout's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import mix  # noqa: E402
from reconciler.compile import compile_ruleset, relocate, render_script  # noqa: E402
from reconciler.engine.changes import diff, transaction_for  # noqa: E402
from reconciler.kernel import Libnftables, read_live  # noqa: E402

TABLE = "nftrec"


def affinity_service(n: int) -> int:
    """A Service with ClientIP affinity from the middle of the table."""
    k = n // 2
    while not mix.has_affinity(k):
        k += 1
    return k


def inventories(tmp: Path, n: int, m: int):
    """(the mix's Inventory, {change: Inventory after it}), read through nftrec's intake
    from manifests that differ only by the change."""
    base = tmp / "m"
    mix.generate(base, n, m)
    inv, _ = mix.read(base)
    changed = {}
    for what, k, fresh in (("endpoint added (ClusterIP)", mix.edit_service(n), 0),
                           ("endpoint added (ClientIP affinity)", affinity_service(n), 1)):
        d = tmp / f"edit{fresh}"
        shutil.copytree(base, d)
        mix.write_slice_file(d, k, n, m, {k: mix.ep_ips(k, m) + [mix.fresh_ip(n, m, fresh)]})
        changed[what] = mix.read(d)[0]
    d = tmp / "added"
    mix.generate(d, n + 1, m)  # the same tree plus Service n
    changed["Service added"] = mix.read(d)[0]
    return inv, changed


def node_config(tmp: Path, layout: str):
    from reconciler.intake import load_node_config

    path = tmp / f"node-{layout}.yaml"
    path.write_text(mix.NODE_CONFIG + f"layout: {layout}\n")
    return load_node_config(str(path), discover=False)[0]


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


def run_layout(layout: str, inv, changed: dict, tmp: Path, reps: int, timeout: float) -> dict:
    R: dict = {}
    cfg = node_config(tmp, layout)
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
    out = [f"{R['services']:,} Services x {R['endpoints']} endpoints (bench/mix.py), one run",
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
    R = {"services": n, "endpoints": m, "reps": args.reps}
    tmp = tempfile.mkdtemp(prefix="nftrec-bench-layout-")
    try:
        inv, changed = inventories(Path(tmp), n, m)
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
