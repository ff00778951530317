#!/usr/bin/env python3
"""One EndpointSlice edited → `apply`, repeated: the issue 8 edit-apply figure alone, with an
optional cProfile of each edit apply (bench/targets.py measures it once per size).

    .venv/bin/python bench/edit_apply.py --size 1000 --edits 5 [--profile DIR] [--keep DIR]

Per size: generate the realistic mix (bench/targets.generate), a cold `apply` into a fresh
namespace `nftrec-bench-edit-<pid>` (deleted in a `finally`), then --edits one-edit applies,
each moving one endpoint of a different ClusterIP Service (every edit a new address); the
parse floor P is measured in the same run, before and after the edits. Prints wall times
and their ratio to P.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets as T  # noqa: E402


def parse_floor(root: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", T.PARSE, root], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--edits", type=int, default=5)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--profile", type=Path, help="write edit<k>.prof (cProfile) here")
    ap.add_argument("--keep", type=Path, help="work dir (kept): manifests, state")
    a = ap.parse_args()
    tmp = a.keep or Path(tempfile.mkdtemp(prefix="nftrec-edit-"))
    tmp.mkdir(parents=True, exist_ok=True)
    root, cfg, state = tmp / "m", tmp / "node.yaml", tmp / "state"
    if not root.exists():
        T.generate(root, a.size, a.endpoints)
    cfg.write_text(T.NODE_CONFIG)
    ns = f"{T.NS_PREFIX}edit-{__import__('os').getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    nftrec = T.nftrec_bin()
    try:
        ps = [parse_floor(root) for _ in range(3)]
        t = time.perf_counter()
        subprocess.run([nftrec, "--state-dir", state, "apply", root, "--config", cfg, "--netns", ns],
                       check=True, capture_output=True)
        print(f"cold apply {time.perf_counter() - t:.2f} s", flush=True)
        walls = []
        k0 = T.edit_service(a.size)
        for e in range(a.edits):
            k = k0 + 10 * e
            while T.svc_type(k) != "ClusterIP" or T.has_affinity(k):
                k += 1
            ips = T.ep_ips(k, a.endpoints)
            ips[0] = T.fresh_ip(a.size, a.endpoints, e)
            T.write_slice_file(root, k, a.size, a.endpoints, {k: ips})
            argv = ["--state-dir", str(state), "apply", str(root), "--config", str(cfg), "--netns", ns]
            if a.profile:
                a.profile.mkdir(parents=True, exist_ok=True)
                prof = a.profile / f"edit{e}.prof"
                cmd = [sys.executable, "-c",
                       "import cProfile,sys; from reconciler.cli import main; p=sys.argv[1]; "
                       "sys.argv=['nftrec']+sys.argv[2:]; cProfile.run('main()', p)", str(prof), *argv]
            else:
                cmd = [nftrec, *argv]
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            w = time.perf_counter() - t
            if r.returncode not in (0,):
                print(r.stdout[-2000:], r.stderr[-2000:])
                raise SystemExit(f"edit {e}: exit {r.returncode}")
            walls.append(w)
            print(f"edit {e} (svc-{k}): {w:.2f} s  {r.stdout.strip().splitlines()[-1][:80]}", flush=True)
        ps += [parse_floor(root) for _ in range(3)]
        P = statistics.median(ps)
        med = statistics.median(walls)
        print(f"N={a.size}: P median {P:.2f} s (runs {', '.join(f'{x:.2f}' for x in ps)}); "
              f"edit apply median {med:.2f} s = {med / P:.2f} P (runs {', '.join(f'{x:.2f}' for x in walls)})")
    finally:
        subprocess.run(["ip", "netns", "delete", ns])


if __name__ == "__main__":
    main()
