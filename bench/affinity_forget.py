"""The cost of forgetting a removed endpoint's ClientIP affinity entries (engine/sync.
forget_affinity_clients, docs/kube-proxy-behaviours.md deviation 14), against the commit
that removed it, in the same run.

    sudo .venv/bin/python bench/affinity_forget.py                   # 1,000 Services, 20 clients per endpoint
    sudo .venv/bin/python bench/affinity_forget.py --services 10000 --clients 5

bench/layout.py's mix (every tenth Service ClientIP affinity, 5 endpoints each), loaded
in a throwaway namespace `nftrec-bench-layout-forget-*`; the shared set is filled with
`--clients` entries per affinity endpoint (as many clients having visited every one).
Then, alternating, --reps times each: one endpoint removed from an affinity Service
(commit, then the cleanup: listing the set, one delete transaction) and one removed from
a ClusterIP Service (the cleanup finds no id and lists nothing); each edit is undone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layout import TABLE, config, endpoints, inventory, Netns  # noqa: E402
from reconciler.compile import AFFINITY_SET, affinity_updates, compile_ruleset, relocate  # noqa: E402
from reconciler.engine import forget_affinity_clients, make_plan  # noqa: E402
from reconciler.kernel import Libnftables, Transaction, kernel_token, read_live  # noqa: E402


def fill(nft: Libnftables, ruleset, clients: int) -> int:
    ids = [k for c in ruleset.tables["ip"].chains.values() for k in affinity_updates(c)]
    n = 0
    for start in range(0, clients, 5):
        tx = Transaction()
        for j in range(start, min(clients, start + 5)):
            for hi, lo in ids:
                tx.raw(f"add element ip {TABLE} {AFFINITY_SET} {{ 192.0.{j // 250}.{j % 250 + 1} . {hi} . {lo} timeout 3h }}")
                n += 1
        nft.run(tx)
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    m, n = 5, a.services
    inv, cfg = inventory(n, m), config("sharded")
    ns = Netns("forget")
    nft = None
    try:
        nft = Libnftables(ns.name)
        base = compile_ruleset(inv, cfg)
        nft.run(make_plan(base, read_live(nft, TABLE)).transaction)
        entries = fill(nft, base, a.clients)
        sl = list(inv.endpoint_slices)
        k = n // 2 - (n // 2) % 10  # ClusterIP
        edits = {}
        for name, i in (("affinity", k + 5), ("clusterip", k)):
            e = sl.copy()
            e[i] = replace(endpoints(i, m), endpoints=endpoints(i, m).endpoints[1:])
            edits[name] = replace(inv, endpoint_slices=tuple(e))
        times = {f"{w} {x}": [] for w in edits for x in ("commit", "cleanup")}
        for _ in range(a.reps):
            for name, edited in edits.items():
                for rs, measured in ((edited, True), (inv, False)):  # the edit, then undo it
                    live = read_live(nft, TABLE)
                    plan = make_plan(relocate(compile_ruleset(rs, cfg), live), live)
                    token = kernel_token(nft)
                    t0 = time.perf_counter()
                    nft.run(plan.transaction)
                    t1 = time.perf_counter()
                    forget_affinity_clients(nft, TABLE, plan, token + 1)
                    t2 = time.perf_counter()
                    if measured:
                        times[f"{name} commit"].append(t1 - t0)
                        times[f"{name} cleanup"].append(t2 - t1)
                if name == "affinity":  # put the forgotten entries back for the next rep
                    fill(nft, base, a.clients)
        print(f"{n} Services ({n // 10} with ClientIP affinity, {m} endpoints each), {entries} entries in "
              f"{AFFINITY_SET}, {a.reps} reps, median ms:")
        for name in edits:
            c, f = (statistics.median(times[f"{name} {x}"]) * 1000 for x in ("commit", "cleanup"))
            print(f"  one {name} endpoint removed: commit {c:.1f}, cleanup {f:.1f} ({f / c:.2f}x the commit)")
    finally:
        if nft is not None:
            nft.close()
        ns.delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
