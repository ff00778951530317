#!/usr/bin/env python3
"""One EndpointSlice edited → `apply`, repeated, optionally for several versions of the code
interleaved (A/B in the same run): the issue 8 edit-apply figure alone, with an optional
cProfile of each edit apply (bench/targets.py measures it once per size).

    .venv/bin/python bench/edit_apply.py --size 1000 --edits 5
    .venv/bin/python bench/edit_apply.py --size 10000 --edits 4 --code /tmp/old --code .   # A/B
    .venv/bin/python bench/edit_apply.py --size 1000 --edits 3 --profile /tmp/prof

Per size: the realistic mix (bench/targets.generate); per --code directory (a checkout
holding reconciler/ and schemas/; default: the installed nftrec) a fresh namespace
`nftrec-bench-edit-<pid>-<i>` (deleted in a `finally`) and state dir, and a cold `apply`;
then --edits rounds, each moving one endpoint of a different ClusterIP Service (a new
address every round) and running one `apply` per code version, in turn. The parse floor
P (PyYAML's CSafeLoader, a fresh process) is measured before and after the edits. Prints
each wall time, the medians and their ratio to P.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets as T  # noqa: E402

RUN = ("import sys; sys.path.insert(0, sys.argv[1]); from reconciler.cli import main; prof = sys.argv[2]; "
       "sys.argv = ['nftrec'] + sys.argv[3:]\n"
       "if prof:\n import cProfile; cProfile.run('main()', prof)\nelse:\n main()")


def parse_floor(root: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", T.PARSE, root], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def nftrec(code: Path, prof: str, *argv) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one nftrec run; its CPU time (user + sys, forked children included,
    less sensitive to the other sessions' load) in r.cpu."""
    t, c = time.perf_counter(), cpu()
    r = subprocess.run([sys.executable, "-c", RUN, str(code), prof, *map(str, argv)],
                       capture_output=True, text=True, timeout=1800)
    w = time.perf_counter() - t
    r.cpu = cpu() - c
    if r.returncode != 0:
        raise SystemExit(f"nftrec {' '.join(map(str, argv[:3]))} (code {code}): exit {r.returncode}\n"
                         f"{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return w, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--edits", type=int, default=5)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--code", type=Path, action="append", help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--profile", type=Path, help="write <variant>-edit<k>.prof (cProfile) here")
    ap.add_argument("--keep", type=Path, help="work dir (kept): manifests, state")
    a = ap.parse_args()
    codes = [c.resolve() for c in (a.code or [HERE.parent])]
    tmp = a.keep or Path(tempfile.mkdtemp(prefix="nftrec-edit-"))
    tmp.mkdir(parents=True, exist_ok=True)
    root, cfg = tmp / "m", tmp / "node.yaml"
    if not root.exists():
        T.generate(root, a.size, a.endpoints)
    cfg.write_text(T.NODE_CONFIG)
    nss = [f"{T.NS_PREFIX}edit-{os.getpid()}-{i}" for i in range(len(codes))]
    states = [tmp / f"state-{os.getpid()}-{i}" for i in range(len(codes))]
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
    try:
        for ns in nss:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        ps = [parse_floor(root) for _ in range(3)]
        for i, code in enumerate(codes):
            w, _ = nftrec(code, "", "--state-dir", states[i], "apply", root, "--config", cfg, "--netns", nss[i])
            print(f"[{i}] {code}: cold apply {w:.2f} s", flush=True)
        walls: list[list[float]] = [[] for _ in codes]
        cpus: list[list[float]] = [[] for _ in codes]
        k0 = T.edit_service(a.size)
        for e in range(a.edits):
            k = k0 + 10 * e
            while T.svc_type(k) != "ClusterIP" or T.has_affinity(k):
                k += 1
            ips = T.ep_ips(k, a.endpoints)
            ips[0] = T.fresh_ip(a.size, a.endpoints, e)
            T.write_slice_file(root, k, a.size, a.endpoints, {k: ips})
            order = list(range(len(codes))) if e % 2 == 0 else list(reversed(range(len(codes))))
            for i in order:  # alternating which goes first
                prof = str(a.profile / f"{i}-edit{e}.prof") if a.profile else ""
                w, r = nftrec(codes[i], prof, "--state-dir", states[i], "apply", root, "--config", cfg,
                              "--netns", nss[i])
                walls[i].append(w)
                cpus[i].append(r.cpu)
                print(f"edit {e} (svc-{k}) [{i}]: {w:.2f} s wall, {r.cpu:.2f} s CPU  "
                      f"{r.stdout.strip().splitlines()[-1][:48]}", flush=True)
        ps += [parse_floor(root) for _ in range(3)]
        P = statistics.median(ps)
        print(f"N={a.size}: P median {P:.2f} s (runs {', '.join(f'{x:.2f}' for x in ps)})")
        for i, code in enumerate(codes):
            med = statistics.median(walls[i])
            print(f"  [{i}] {code}: edit apply median {med:.2f} s = {med / P:.2f} P "
                  f"(runs {', '.join(f'{x:.2f}' for x in walls[i])}); CPU median "
                  f"{statistics.median(cpus[i]):.2f} s (runs {', '.join(f'{x:.2f}' for x in cpus[i])})")
    finally:
        for ns in nss:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


if __name__ == "__main__":
    main()
