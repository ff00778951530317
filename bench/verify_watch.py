#!/usr/bin/env python3
"""What `verify` costs `watch`: targets.py's watch edit latency (git-sync layout, one
endpoint moved per revision, swap -> kernel minus the debounce) on an SSH-signed
repository, with `verify` off and on, the runs interleaved; `--tree` adds checkouts to
compare (A/B: each run's `nftrec watch` imports that tree's `reconciler`). `--modes`
picks the runs of each round: `off`, `on` (verify), `fleet` (verify off, a fleet root of
the same Services: fleet_root); each run's figures are also given as ratios to P
(targets.measure_parse_floor of its plain tree). The order of the modes alternates by round.

    sudo .venv/bin/python bench/verify_watch.py --rounds 3 --tree /tmp/base --tree .
    sudo .venv/bin/python bench/verify_watch.py --oneshot --services 10000 --rounds 5 --tree /tmp/base --tree .
    sudo .venv/bin/python bench/verify_watch.py --modes off,fleet --rounds 5
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
from mix import NODE, NODE_CONFIG, generate


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


FLEET = """\
apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: services
- path: endpointslices
  selector: {matchLabels: {site: paris}}
- path: sites/lyon
  selector: {matchLabels: {site: lyon}}
- path: nodes/${nodeName}
  optional: true
"""


def fleet_root(root: Path) -> None:
    """The generated tree as a fleet root with the same Services: base = services/, the
    node's site = endpointslices/ (where measure_watch moves an endpoint each revision),
    another site (a copy of the slices, never read by this node), and the node's own layer
    replacing the first Service file with an identical copy."""
    (root / "fleet.yaml").write_text(FLEET)
    shutil.copytree(root / "endpointslices", root / "sites" / "lyon")
    (root / "nodes" / NODE).mkdir(parents=True)
    shutil.copy(root / "services" / "svc-0000.yaml", root / "nodes" / NODE / "svc-0000.yaml")


def one_run(args, nss, tree: Path, mode: str, key: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-verify-watch-"))
    try:
        os.environ["PYTHONPATH"] = str(tree)  # the watch subprocess runs this tree's code
        c = targets.Ctx(args, nss, tmp, args.services, args.endpoints)
        generate(c.root, c.n, c.m)
        p = targets.measure_parse_floor(c)["wall"]
        if mode == "fleet":
            fleet_root(c.root)
        c.cfg.write_text(NODE_CONFIG + ("nodeLabels: {site: paris}\n" if mode == "fleet" else "")
                         + (f"verify:\n  mode: HEAD\n  keys: [{key}.pub]\n" if mode == "on" else ""))
        return {**targets.measure_watch(c), "P": p}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def one_apply(args, nss, tree: Path, key: Path) -> float:
    """`--oneshot`: one cold `nftrec apply` (empty state and namespace) of a signed
    git-sync worktree of `--services` Services with `verify` on; its wall time."""
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-verify-apply-"))
    ns = nss.add("vapply")
    try:
        os.environ["PYTHONPATH"] = str(tree)
        c = targets.Ctx(args, nss, tmp, args.services, args.endpoints)
        src = tmp / "src"
        generate(src, c.n, c.m)
        targets.git(src, "init", "-q")
        targets.git(src, "add", "-A")
        targets.git(src, "commit", "-q", "-m", "r0")
        gs = tmp / "gs"
        gs.mkdir()
        targets.swap(gs, targets.new_revision(src, gs, -1))
        c.cfg.write_text(NODE_CONFIG + f"verify:\n  mode: HEAD\n  keys: [{key}.pub]\n")
        return c.nftrec(tmp / "state", "apply", gs / "current", "--config", c.cfg, ns=ns, what="verified apply")["wall"]
    finally:
        nss.delete(ns)
        shutil.rmtree(tmp, ignore_errors=True)


def oneshot(args, nss, trees: list[Path], key: Path) -> None:
    """Interleaved rounds of one_apply per tree (order reversed every round); per-round
    ratios to the first tree."""
    walls: dict[Path, list[float]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in (trees if r % 2 == 0 else trees[::-1]):
            walls[tree].append(one_apply(args, nss, tree, key))
            targets.log(f"round {r} {tree}: verified cold apply {walls[tree][-1]:.2f} s")
    print(f"cold `apply` with verify on, {args.services} Services, {args.rounds} interleaved rounds")
    base = trees[0]
    for tree in trees:
        ratios = sorted(w / b for w, b in zip(walls[tree], walls[base]))
        print(f"{tree}: median {targets.median(walls[tree]):.2f} s (runs {', '.join(f'{w:.2f}' for w in walls[tree])}); "
              f"x{ratios[len(ratios) // 2]:.3f} of {base} per round (median), slower in "
              f"{sum(x > 1 for x in ratios)} of {len(ratios)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="off/on pairs per tree (default %(default)s)")
    ap.add_argument("--edits", type=int, default=20, help="measured edits per run (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="discarded edits first (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to run (default: this one)")
    ap.add_argument("--oneshot", action="store_true", help="measure a cold `apply` with verify on instead of watch")
    ap.add_argument("--modes", default="off,on", help="runs per round and tree: off, on (verify), fleet "
                    "(default %(default)s)")
    args = ap.parse_args()
    args.reps = 3  # P: the median of 3 processes
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
        if args.oneshot:
            oneshot(args, nss, trees, key)
            return 0
        modes = args.modes.split(",")
        runs_of = [(tree, mode) for tree in trees for mode in modes]
        for r in range(args.rounds):
            for tree, mode in (runs_of if r % 2 == 0 else runs_of[::-1]):
                R = one_run(args, nss, tree, mode, key)
                runs.setdefault((str(tree), mode), []).append(R)
                targets.log(f"round {r} {tree} {mode}: p50 {R['p50_ms']:.1f} ms, p95 {R['p95_ms']:.1f} ms, "
                            f"P {R['P']:.2f} s")
    finally:
        nss.cleanup()
        shutil.rmtree(keys, ignore_errors=True)
    print(f"watch edit latency, {args.services} Services, {args.warmup} warm-up + {args.edits} edits per run")
    for (tree, mode), rs in runs.items():
        xs = [e["ms"] for R in rs for e in R["edits"][args.warmup:]]
        per = ", ".join(f"{R['p50_ms']:.1f}/{R['p95_ms']:.1f}" for R in rs)
        p95 = sorted(R["p95_ms"] / 1000 / R["P"] for R in rs)
        print(f"{tree} {mode}: pooled p50 {targets.percentile(xs, 50):.1f} ms, p95 "
              f"{targets.percentile(xs, 95):.1f} ms (n={len(xs)}; per run p50/p95: {per}); "
              f"p95 {p95[len(p95) // 2]:.4f} P (median of the runs' ratios)")
    first = (str(trees[0]), modes[0])
    for key_, rs in runs.items():
        if key_ != first:
            pairs = sorted(R["p95_ms"] / B["p95_ms"] for R, B in zip(rs, runs[first]))
            print(f"{key_[0]} {key_[1]} / {first[0]} {first[1]}: p95 per round x{pairs[len(pairs) // 2]:.3f} "
                  f"(median), higher in {sum(x > 1 for x in pairs)} of {len(pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
