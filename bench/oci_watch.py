#!/usr/bin/env python3
"""What an unchanged tag costs `nftrec watch oci://...`: the daemon's CPU while it polls.

    .venv/bin/python bench/oci_watch.py                  # 10,000 Services x 2 endpoints, 60 polls
    .venv/bin/python bench/oci_watch.py --services 1000 --seconds 30

Pushes the benchmark's mix (bench/mix.py) as a Flux-format artifact to a docker-registry on
127.0.0.1 (tests/ociregistry.py), runs `watch` on its tag in a throwaway namespace twice,
with oci.interval 0.2 s and 1 h, and after the first sync measures over the same wall time
the daemon's CPU (/proc), its polls, pulls and syncs (metrics, log), the registry's HEAD
requests and whether the store's `current` link moved. Needs root (a namespace).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import mix  # noqa: E402
from nsutil import throwaway_netns  # noqa: E402
from ociregistry import push_artifact, running_registry  # noqa: E402
from watchproc import Watch  # noqa: E402


def counter(w: Watch, name: str) -> float:
    _, text = w.http("/metrics")
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def measure(reg, tmp: Path, interval: str, seconds: float) -> dict:
    config = tmp / f"node-{interval}.yaml"
    config.write_text(mix.NODE_CONFIG + f"oci:\n  insecure: true\n  interval: {interval}\n")
    with throwaway_netns() as ns:
        state = tmp / f"state-{interval}"
        w = Watch(ns, reg.ref("bench/svc", "prod"), config, state)
        try:
            w.wait(lambda: w.syncs(), 600, what="the first sync", step=0.2)
            time.sleep(5)  # the state writer and the heap settle after the first sync
            link = next(state.rglob("current"))
            swapped = link.lstat().st_mtime_ns
            before = (w.cpu_seconds(), counter(w, "nftrec_source_polls_total"),
                      counter(w, "nftrec_source_pulls_total"), len(w.syncs()), len(reg.requests("HEAD")))
            time.sleep(seconds)
            after = (w.cpu_seconds(), counter(w, "nftrec_source_polls_total"),
                     counter(w, "nftrec_source_pulls_total"), len(w.syncs()), len(reg.requests("HEAD")))
            cpu, polls, pulls, syncs, heads = (b - a for a, b in zip(before, after))
            return {"cpu": cpu, "polls": polls, "pulls": pulls, "syncs": syncs, "heads": heads,
                    "link moved": link.lstat().st_mtime_ns != swapped, "first sync ms": w.syncs()[0]["durationMs"]}
        finally:
            w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=12.0, help="measured wall time (60 polls at 0.2 s)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-oci-watch-"))
    with running_registry(tmp / "registry") as reg:
        tree = tmp / "tree"
        mix.generate(tree, args.services, args.endpoints)
        files = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
        push_artifact(reg.host, "bench/svc", "prod", files)
        print(f"{args.services} Services: {len(files)} files, {sum(map(len, files.values())) / 1e6:.1f} MB")
        polling, idle = (measure(reg, tmp, interval, args.seconds) for interval in ("200ms", "1h"))
        for name, r in (("interval 0.2 s", polling), ("interval 1 h", idle)):
            print(f"{name}: {r}")
        extra = polling["cpu"] - idle["cpu"]
        print(f"daemon CPU over {args.seconds:g} s: {polling['cpu']:.2f} s polling vs {idle['cpu']:.2f} s idle: "
              f"{1000 * extra / max(polling['polls'], 1):.2f} ms per unchanged poll "
              f"(CPU time counts in clock ticks of {1000 / os.sysconf('SC_CLK_TCK'):g} ms)")


if __name__ == "__main__":
    main()
