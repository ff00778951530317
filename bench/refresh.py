#!/usr/bin/env python3
"""`plan --refresh` with nothing to change (issue 8: <= 1 P at 10,000 Services), timed with
the real CLI against one prepared namespace, interleaved with an older checkout and with
the compile memo (compiled.json) moved aside, and P measured in the same run.

    sudo .venv/bin/python bench/refresh.py --services 10000 --before /tmp/base   # ~6 min
    sudo .venv/bin/python bench/refresh.py --services 1000 --reps 5

`--before DIR`: an older nftrec (`git archive <commit> | tar -x -C DIR`), run with
PYTHONPATH=DIR and the same interpreter, against the same namespace and state dir.
Manifests and node config: bench/targets.py's (realistic mix, 5 endpoints, 100 per file).
One `apply` prepares the namespace `nftrec-bench-refresh-<pid>` (deleted in a finally);
each variant runs once untimed first (its intake cache entries: they are keyed by the code).
Per round, in this order: before, this checkout, this checkout without compiled.json.
Figures: median wall and CPU (user + sys of the process, its nft thread included), each
also as a ratio to P's (a loaded machine stretches walls more than CPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", help="an older checkout to time as 'before'")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    os.chdir("/")  # `python -c` puts the cwd first on sys.path: it must not shadow --before
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("NFTREC_LOG_LEVEL", None)
    cli = [sys.executable, "-c", "import sys; from reconciler.cli import main; sys.argv[0] = 'nftrec'; main()"]
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-bench-refresh-"))
    ns = f"nftrec-bench-refresh-{os.getpid()}"
    m, cfg, state = tmp / "m", tmp / "node.yaml", tmp / "state"
    results: dict[str, list[dict]] = {}

    def nftrec(*a, who=None, ok=(0,)) -> dict:
        argv = cli + ["--state-dir", str(state), *a, "--netns", ns]
        res = targets.run(argv, args.timeout, env=who or env)
        return targets.check(res, " ".join(a[:2]), ok)

    def refresh(label: str, who=None, timed=True) -> None:
        r = nftrec("plan", str(m), "--config", str(cfg), "--detailed-exitcode", "--refresh", who=who)
        if not timed:
            return
        r["cpu"] = r["user"] + r["sys"]
        results.setdefault(label, []).append(r)
        print(f"  {label:34s} {r['wall']:6.2f} s wall, {r['cpu']:6.2f} s CPU (exit {r['rc']})", flush=True)

    def no_memo(fn):
        compiled = next(state.rglob("compiled.json"))
        aside = compiled.with_suffix(".aside")
        compiled.rename(aside)
        try:
            fn()
        finally:
            aside.rename(compiled)

    variants = [("this checkout", lambda t=True: refresh("this checkout", timed=t)),
                ("this checkout, no compile memo", lambda t=True: no_memo(lambda: refresh(
                    "this checkout, no compile memo", timed=t)))]
    if args.before:
        before_env = {**env, "PYTHONPATH": args.before}
        variants.insert(0, ("before", lambda t=True: refresh("before", who=before_env, timed=t)))
    try:
        targets.generate(m, args.services, 5)
        cfg.write_text(targets.NODE_CONFIG)
        subprocess_ns(["ip", "netns", "add", ns])
        r = nftrec("apply", str(m), "--config", str(cfg))
        print(f"{args.services} Services x 5: apply {r['wall']:.1f} s ({tmp})", flush=True)
        for _label, fn in variants:
            fn(False)  # warm-up: intake cache entries of this code
        p_walls, p_cpus = [], []
        for i in range(args.reps):
            res = targets.check(targets.run([sys.executable, "-c", targets.PARSE, m], args.timeout), "parse floor")
            p_walls.append(res["wall"])
            p_cpus.append(res["user"] + res["sys"])
            for _label, fn in variants:
                fn()
        p, pc = statistics.median(p_walls), statistics.median(p_cpus)
        print(f"\nP (PyYAML CSafeLoader, fresh process): median {p:.2f} s wall of "
              f"{', '.join(f'{x:.2f}' for x in p_walls)}; CPU {pc:.2f} s")
        print(f"\n| {args.services} Services, `plan --refresh`, nothing to change | wall (median of {args.reps}) "
              f"| x P | CPU | CPU x P's CPU |")
        print("|---|---|---|---|---|")
        for label, rs in results.items():
            w = statistics.median(r["wall"] for r in rs)
            c = statistics.median(r["cpu"] for r in rs)
            print(f"| {label} | {w:.2f} s | {w / p:.3f} | {c:.2f} s | {c / pc:.3f} |")
    finally:
        subprocess_ns(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def subprocess_ns(argv, check=True) -> None:
    import subprocess

    subprocess.run(argv, check=check, timeout=120, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
