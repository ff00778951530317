#!/usr/bin/env python3
"""What `verify` costs `watch`: targets.py's watch edit latency (git-sync layout, one
endpoint moved per revision, swap -> kernel minus the debounce) on an SSH-signed
repository, with `verify` off and on, the runs interleaved; `--tree` adds checkouts to
compare (A/B: each run's `nftrec watch` imports that tree's `reconciler`).

    sudo .venv/bin/python bench/verify_watch.py --rounds 3 --tree /tmp/base --tree .
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import targets
from mix import NODE_CONFIG, generate


def signing(key: Path):
    """targets.git, with every repository it makes signing its commits with `key`."""
    plain = targets.git

    def git(cwd: Path, *args: str) -> str:
        out = plain(cwd, *args)
        if args[:1] == ("init",):
            for k, v in (("gpg.format", "ssh"), ("user.signingkey", str(key)), ("commit.gpgsign", "true")):
                plain(cwd, "config", k, v)
        return out
    return git


def one_run(args, nss, tree: Path, verify: bool, key: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-verify-watch-"))
    try:
        os.environ["PYTHONPATH"] = str(tree)  # the watch subprocess runs this tree's code
        c = targets.Ctx(args, nss, tmp, args.services, args.endpoints)
        generate(c.root, c.n, c.m)
        c.cfg.write_text(NODE_CONFIG + (f"verify:\n  mode: HEAD\n  keys: [{key}.pub]\n" if verify else ""))
        return targets.measure_watch(c)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="off/on pairs per tree (default %(default)s)")
    ap.add_argument("--edits", type=int, default=20, help="measured edits per run (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="discarded edits first (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to run (default: this one)")
    args = ap.parse_args()
    args.reps = 1
    trees = [t.resolve() for t in args.tree] if args.tree else [targets.REPO]
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces); the host ruleset is never touched")
    targets.IDLE_WAIT = 0  # the idle RSS is not what this measures
    keys = Path(tempfile.mkdtemp(prefix="nftrec-verify-keys-"))
    nss = targets.Namespaces()
    runs: dict[tuple[str, str], list[dict]] = {}
    try:
        key = keys / "ops"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops@bench", "-f", str(key)], check=True)
        targets.git = signing(key)
        for r in range(args.rounds):
            for tree in trees:
                for verify in (False, True):
                    R = one_run(args, nss, tree, verify, key)
                    runs.setdefault((str(tree), "on" if verify else "off"), []).append(R)
                    targets.log(f"round {r} {tree} verify {'on' if verify else 'off'}: "
                                f"p50 {R['p50_ms']:.1f} ms, p95 {R['p95_ms']:.1f} ms")
    finally:
        nss.cleanup()
        shutil.rmtree(keys, ignore_errors=True)
    print(f"watch edit latency, {args.services} Services, {args.warmup} warm-up + {args.edits} edits per run")
    for (tree, mode), rs in runs.items():
        xs = [e["ms"] for R in rs for e in R["edits"][args.warmup:]]
        per = ", ".join(f"{R['p50_ms']:.1f}/{R['p95_ms']:.1f}" for R in rs)
        print(f"{tree} verify {mode}: pooled p50 {targets.percentile(xs, 50):.1f} ms, p95 "
              f"{targets.percentile(xs, 95):.1f} ms (n={len(xs)}; per run p50/p95: {per})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
