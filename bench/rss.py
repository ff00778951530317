#!/usr/bin/env python3
"""Peak RSS of the one-shot commands at one size, for one or more versions of the code,
back to back in the same run (issue 8: one-shot peak RSS <= 250 MB at 10k).

    .venv/bin/python bench/rss.py --size 10000 --code /tmp/base --code .

Per --code directory (a checkout holding reconciler/ and schemas/; default: this one): a
fresh namespace `nftrec-bench-rss-<pid>-<i>` (deleted in a `finally`) and state dir;
cold `apply`, `plan --refresh` (nothing to change), one EndpointSlice edited → `apply`
(the edit then undone). Each peak is GNU time's "Maximum resident set size" of that one
process (nft runs in-process through libnftables, so it is included). Peak RSS does not
depend on the machine's load; wall times are printed for orientation only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets as T  # noqa: E402
from edit_apply import RUN  # noqa: E402


def nftrec(code: Path, *argv) -> dict:
    r = T.run([sys.executable, "-c", RUN, code, "", *argv], 1800, rss=True)
    return T.check(r, f"nftrec {' '.join(map(str, argv[2:4]))} ({code})", ok=(0, 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=5)
    ap.add_argument("--code", type=Path, action="append", help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--no-refresh", action="store_true", help="skip plan --refresh")
    a = ap.parse_args()
    codes = [c.resolve() for c in (a.code or [HERE.parent])]
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-rss-"))
    root, cfg = tmp / "m", tmp / "node.yaml"
    T.generate(root, a.size, a.endpoints)
    cfg.write_text(T.NODE_CONFIG)
    k = T.edit_service(a.size)
    rows = []
    for i, code in enumerate(codes):
        ns, state = f"{T.NS_PREFIX}rss-{os.getpid()}-{i}", tmp / f"state-{i}"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            common = ("--state-dir", state)
            r = {"cold apply": nftrec(code, *common, "apply", root, "--config", cfg, "--netns", ns)}
            if not a.no_refresh:
                r["plan --refresh"] = nftrec(code, *common, "plan", root, "--config", cfg, "--netns", ns,
                                             "--refresh", "--detailed-exitcode")
            ips = T.ep_ips(k, a.endpoints)
            ips[0] = T.fresh_ip(a.size, a.endpoints, 0)
            T.write_slice_file(root, k, a.size, a.endpoints, {k: ips})
            r["edit apply"] = nftrec(code, *common, "apply", root, "--config", cfg, "--netns", ns)
            T.write_slice_file(root, k, a.size, a.endpoints)
        finally:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        for what, x in r.items():
            print(f"[{i}] {code}: {what}: peak RSS {x['rss_mb']:.0f} MB ({x['wall']:.1f} s wall)", flush=True)
        rows.append(r)
    print(f"\nN={a.size} x {a.endpoints}, peak RSS (MB): " + " | ".join(str(c) for c in codes))
    for what in rows[0]:
        print(f"  {what:15s} " + " | ".join(f"{r[what]['rss_mb']:.0f}" for r in rows))


if __name__ == "__main__":
    main()
