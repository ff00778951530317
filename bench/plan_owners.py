#!/usr/bin/env python3
"""In-process `make_plan` of bench/targets.py's one edit (one local endpoint of a ClusterIP
Service moved to a new address), for several checkouts interleaved (A/B in one run): the
cost of plan ownership (engine/changes._Owners). No kernel: the live side is the base
ruleset as `read_live` gives it (no owners) and as a recorded one (with owners).

    .venv/bin/python bench/plan_owners.py --size 1000 --code /tmp/base --code .

Per --code directory (a checkout holding reconciler/), a fresh process builds the
inputs (targets.generate, load_desired, compile; not timed), then times --reps plans
(CPU time, median) and counts the Python function calls of one plan (cProfile:
deterministic, unlike the times on this shared machine). Rounds alternate the checkouts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import cProfile, json, pstats, statistics, sys, time
from dataclasses import replace
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import targets as T
from reconciler.engine.desired import load_desired
from reconciler.compile import Ruleset, compile_ruleset
from reconciler.kernel import canonical
from reconciler.engine.plan import make_plan
root, cfg, reps = Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
d = load_desired(root, cfg, interfaces=False)
n = len(d.inventory.services)
k = T.edit_service(n)
key = f"ns-{k // 500}/svc-{k}"
inv = d.inventory
slices = tuple(replace(s, endpoints=(replace(s.endpoints[0], addresses=(T.fresh_ip(n, 5, 0),)),) + s.endpoints[1:])
               if s.service_key == key else s for s in inv.endpoint_slices)
edited = compile_ruleset(replace(inv, endpoint_slices=slices), d.config, previous=d.ruleset)
recorded = canonical(d.ruleset)
kernel = Ruleset(recorded.tables, {})
out = {}
for name, live in (("kernel", kernel), ("recorded", recorded)):
    plan = make_plan(edited, live)
    assert [s.service for s in plan.services] == [key] and not plan.shared, (plan.services, plan.shared)
    ts = []
    for _ in range(reps):
        t = time.process_time()
        make_plan(edited, live)
        ts.append(time.process_time() - t)
    prof = cProfile.Profile()
    prof.enable()
    make_plan(edited, live)
    prof.disable()
    calls = pstats.Stats(prof).total_calls
    out[name] = {"ms": statistics.median(ts) * 1000, "calls": calls, "ops": len(plan.transaction)}
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--code", action="append", type=Path, help="a checkout (default: this one)")
    args = ap.parse_args()
    codes = [c.resolve() for c in args.code or [HERE.parent]]
    sys.path.insert(0, str(HERE))
    import targets as T

    with tempfile.TemporaryDirectory(prefix="nftrec-plan-owners-") as tmp:
        root, cfg = Path(tmp) / "m", Path(tmp) / "node.yaml"
        T.generate(root, args.size, 5)
        cfg.write_text(T.NODE_CONFIG)
        results: dict[Path, list[dict]] = {c: [] for c in codes}
        for r in range(args.rounds):
            for c in codes:
                p = subprocess.run([sys.executable, "-c", CHILD, str(c), str(HERE), str(root), str(cfg), str(args.reps)],
                                   capture_output=True, text=True, timeout=900)
                if p.returncode != 0:
                    raise SystemExit(f"{c}: exit {p.returncode}\n{p.stderr[-3000:]}")
                res = json.loads(p.stdout.strip().splitlines()[-1])
                results[c].append(res)
                print(f"round {r + 1} {c}: {res}", flush=True)
        for c in codes:
            for live in ("kernel", "recorded"):
                ms = statistics.median(x[live]["ms"] for x in results[c])
                calls = results[c][0][live]["calls"]
                print(f"{c} live={live}: make_plan median {ms:.1f} ms CPU, {calls} Python calls, "
                      f"{results[c][0][live]['ops']} operations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
