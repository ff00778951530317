#!/usr/bin/env python3
"""The intake cache and the no-op fast path (issue 8, items 2 and 4), timed with the real
CLI in one run, optionally against an older checkout for "before".

    sudo .venv/bin/python bench/cache_noop.py --services 1000            # ~1 min
    sudo .venv/bin/python bench/cache_noop.py --services 1000 --before /tmp/base
    sudo .venv/bin/python bench/cache_noop.py --services 10000 --no-kernel

`--before DIR`: a checkout of an older nftrec (e.g. `git archive <commit> | tar -x -C DIR`),
run with PYTHONPATH=DIR and the same interpreter, against the same netns and state.
Manifests: bench/targets.py's generator (N Services x 5 endpoints, the realistic mix, 100 per file).
Every kernel operation runs in a throwaway namespace `nftrec-bench-cache-<pid>`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets  # noqa: E402


def timed(argv, env=None, ok=(0,)) -> float:
    t = time.perf_counter()
    # cwd=/: `python -c` puts the cwd first on sys.path, which must not shadow --before
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd="/")
    dt = time.perf_counter() - t
    if p.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--before", help="an older checkout to time as 'before'")
    ap.add_argument("--no-kernel", action="store_true", help="only validate (no netns, no root)")
    args = ap.parse_args()
    py = sys.executable
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("NFTREC_LOG_LEVEL", None)
    before_env = {**env, "PYTHONPATH": args.before} if args.before else None
    cli = [py, "-c", "import sys; from reconciler.cli import main; sys.argv[0] = 'nftrec'; main()"]
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-bench-cache-"))
    ns = f"nftrec-bench-cache-{os.getpid()}"
    rows: list[tuple[str, float]] = []

    def run(label, *a, who=env, state=None, reps=args.reps, ok=(0,)):
        argv = cli + ["--state-dir", str(state or tmp / "state"), *a]
        xs = [timed(argv, who, ok) for _ in range(reps)]
        rows.append((label, statistics.median(xs)))
        print(f"  {label:55s} median {statistics.median(xs):6.3f} s  (min {min(xs):.3f}, n={reps})", flush=True)

    try:
        m = tmp / "m"
        targets.generate(m, args.services, 5)
        cfg = tmp / "node.yaml"
        cfg.write_text(targets.NODE_CONFIG)
        print(f"{args.services} Services x 5 endpoints in {tmp}")
        cold_state = tmp / "cold"
        for i in range(args.reps):  # a fresh state dir per run: an empty cache
            argv = cli + ["--state-dir", str(cold_state / str(i)), "validate", str(m), "--config", str(cfg)]
            rows.append(("", timed(argv, env)))
        cold = statistics.median(x for label, x in rows if label == "")
        rows[:] = [("validate, empty cache", cold)]
        print(f"  {'validate, empty cache':55s} median {cold:6.3f} s", flush=True)
        run("validate, warm cache", "validate", str(m), "--config", str(cfg), state=cold_state / "0")
        run("validate, no cache (NFTREC_INTAKE_CACHE=off)", "validate", str(m), "--config", str(cfg),
            who={**env, "NFTREC_INTAKE_CACHE": "off"})
        if args.before:
            run("validate, before", "validate", str(m), "--config", str(cfg), who=before_env)
        if args.no_kernel:
            return 0
        subprocess.run(["ip", "netns", "add", ns], check=True)
        run("apply (cold kernel)", "apply", str(m), "--config", str(cfg), "--netns", ns, reps=1)
        for _ in range(2):  # interleaved, so that load changes hit both alike
            run("plan, no-op (fast path)", "plan", str(m), "--config", str(cfg), "--netns", ns,
                "--detailed-exitcode")
            if args.before:
                run("plan, no-op, before", "plan", str(m), "--config", str(cfg), "--netns", ns,
                    "--detailed-exitcode", who=before_env)
            run("plan --refresh, no-op (warm intake cache, lists)", "plan", str(m), "--config", str(cfg),
                "--netns", ns, "--detailed-exitcode", "--refresh")
            run("plan --refresh, no-op, no intake cache", "plan", str(m), "--config", str(cfg), "--netns", ns,
                "--detailed-exitcode", "--refresh", who={**env, "NFTREC_INTAKE_CACHE": "off"})
        run("apply, no-op (fast path)", "apply", str(m), "--config", str(cfg), "--netns", ns)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
