"""Profile `nftrec watch`'s partial syncs in-process: where one edit's time goes.

    sudo .venv/bin/python bench/watch_profile.py --services 1000 --edits 20 [--cprofile out.prof]

The same git-sync flow as bench/targets.py's watch measurement (a new `git worktree` per
revision, the link swapped, one endpoint moved per revision, the same Services edited),
but the daemon (reconcile.Daemon, real libnftables in a throwaway namespace) runs in this
process: each sync is timed (total, and when the kernel was updated, from the daemon's
own clock), optionally under cProfile, and the state writes (statewriter) are flushed
and timed separately after each sync, as the daemon's idle writer would run them.
Also prints what the daemon holds after the edits (tracemalloc, --tracemalloc).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.append(str(REPO))  # after PYTHONPATH: PYTHONPATH=<another checkout> profiles that one

import targets as T  # noqa: E402  (the generator and the git-sync helpers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cprofile", help="write the edits' cProfile stats here (and print the top)")
    ap.add_argument("--tracemalloc", action="store_true", help="report what the daemon holds after the edits")
    ap.add_argument("--show-tx", action="store_true", help="print each partial sync's transaction")
    args = ap.parse_args(argv)
    from reconciler import logs
    from reconciler.daemon.reconcile import Daemon
    from reconciler.daemon.statewriter import StateWriter
    from reconciler.engine import Target

    if args.show_tx:
        from reconciler.daemon import reconcile
        real_commit = reconcile.commit

        def commit(nft, table, desired, plan, *a, **kw):
            print("\n".join("    " + op[:300] for op in plan.transaction.ops))
            return real_commit(nft, table, desired, plan, *a, **kw)
        reconcile.commit = commit
    ns = f"nftrec-watch3-prof-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="watchprof-"))
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        n, m = args.services, args.endpoints
        root = tmp / "root"
        T.generate(root, n, m)
        cfg = tmp / "node.yaml"
        cfg.write_text(T.NODE_CONFIG)
        gs = tmp / "gitsync"
        gs.mkdir()
        src = tmp / "src"
        shutil.copytree(root, src)
        T.git(src, "init", "-q")
        T.git(src, "add", "-A")
        T.git(src, "commit", "-q", "-m", "revision 0")
        rev = T.new_revision(src, gs, -1)
        (gs / "current").symlink_to(rev.relative_to(gs))
        if args.tracemalloc:
            import tracemalloc
            tracemalloc.start(8)
        d = Daemon(gs / "current", cfg, Target(ns, "nftrec", tmp / "state"), strict=False)
        d.nft = d.target.nft()
        d.bind_netns()
        assert d.load_config()
        d.writer = StateWriter(idle=3600, max_delay=3600)  # flushed by hand: timed apart
        t = time.perf_counter()
        d.sync()
        import reconciler
        print(f"first full sync {time.perf_counter() - t:.2f} s ({reconciler.__file__})", flush=True)
        t = time.perf_counter()
        d.writer.flush()
        print(f"  its state write {time.perf_counter() - t:.2f} s", flush=True)
        from reconciler.daemon.reconcile import settle_heap
        settle_heap()
        prof = cProfile.Profile() if args.cprofile else None
        moved: dict[int, list[str]] = {}
        rows = []
        for r in range(args.warmup + args.edits):
            k = (n // 3 + 7919 * r) % n
            ips = list(moved.get(k) or T.ep_ips(k, m))
            ips[r % m] = T.fresh_ip(n, m, 100 + r)
            moved[k] = ips
            prev = rev
            T.write_slice_file(src, k, n, m, moved)
            rev = T.new_revision(src, gs, r)
            T.swap(gs, rev)
            d.changes = lambda: None  # the link swap: the watcher asks for a walk
            kernel = []
            clock = d.clock
            measured = r >= args.warmup
            t0 = clock()
            if prof is not None and measured:
                prof.enable()
            d.sync()
            t1 = clock()
            if prof is not None and measured:
                prof.disable()
            w0 = time.perf_counter()
            d.writer.flush()
            w = time.perf_counter() - w0
            kms = 1000 * (d.last_success - t0) if d.last_success else None
            T.drop_revision(src, prev)
            svc = f"svc-{k} ({T.svc_type(k)}{', affinity' if T.has_affinity(k) else ''})"
            print(f"edit {r}{' (warm-up)' if not measured else ''}: {svc}: sync {1000 * (t1 - t0):.0f} ms, "
                  f"kernel after {kms:.0f} ms; state write {1000 * w:.0f} ms", flush=True)
            if measured:
                rows.append((1000 * (t1 - t0), kms, 1000 * w))
            del kernel
        if rows:
            for i, name in enumerate(("sync", "kernel", "state write")):
                xs = sorted(x[i] for x in rows)
                print(f"{name}: p50 {T.percentile(xs, 50):.0f} ms, p95 {T.percentile(xs, 95):.0f} ms, "
                      f"max {xs[-1]:.0f} ms")
        if prof is not None:
            prof.dump_stats(args.cprofile)
            st = pstats.Stats(prof)
            st.sort_stats("cumulative").print_stats(45)
            st.sort_stats("tottime").print_stats(25)
        gc.collect()
        print(f"RSS now {T.vm_kb(os.getpid(), 'VmRSS') / 1024:.0f} MB, peak {T.vm_kb(os.getpid(), 'VmHWM') / 1024:.0f} MB")
        if args.tracemalloc:
            import tracemalloc
            snap = tracemalloc.take_snapshot()
            print(f"traced now {sum(s.size for s in snap.statistics('filename')) / 1e6:.0f} MB")
            for s in snap.statistics("traceback")[:25]:
                print(f"{s.size / 1e6:8.1f} MB {s.count:9d}  " + " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno}" for f in list(s.traceback)[::-1][:6]))
        d.writer.close()
        d.nft.close()
    finally:
        subprocess.run(["ip", "netns", "del", ns])
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
