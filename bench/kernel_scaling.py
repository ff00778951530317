#!/usr/bin/env python3
"""Kernel-side scaling of a cold apply: how `nft -f` of the transaction `apply` sends to an
empty kernel grows with the number of Services (the linearity target: 30k <= 3.5x 10k).

    sudo .venv/bin/python bench/kernel_scaling.py                         # 3k, 10k, 30k
    sudo .venv/bin/python bench/kernel_scaling.py --sizes 3000,10000
    sudo .venv/bin/python bench/kernel_scaling.py --src /tmp/old-nftrec   # another checkout, same method

Per size, the mix (bench/mix.py, 5 endpoints) is written once; a child process imports
nftrec from `--src` (default: this checkout), reads and compiles it, and writes the cold
transaction (`transaction_for(diff(desired, empty))`, what `apply` commits); `nft -f` loads
it into a fresh namespace. Printed: user and sys CPU of the nft process (sys is the
kernel's work; wall is unreliable on a shared machine) and each size's ratio to the last.
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

import mix  # noqa: E402
from layout import timed_nft_file  # noqa: E402

_CHILD = r"""
import sys
sys.path.insert(0, {src!r}); sys.path.insert(0, {bench!r})
import mix
from pathlib import Path
from reconciler.compile import Ruleset, compile_ruleset
from reconciler.engine.changes import diff, transaction_for
rs = compile_ruleset(*mix.read(Path({root!r}), mix.NODE_CONFIG + "layout: sharded\n"))
t = rs.tables["ip"]
open({out!r}, "w").write(transaction_for(diff(rs, Ruleset()), rs).text() + "\n")
print(len(t.sets), len(t.chains), sum(len(c.rules) for c in t.chains.values()))
"""


def load(path: Path, timeout: float) -> dict:
    """user/sys CPU of `nft -f path` in a fresh namespace (always deleted)."""
    ns = f"nftrec-bench-scale-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        return timed_nft_file(ns, path, timeout)
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3000,10000,30000")
    ap.add_argument("--src", default=str(HERE.parent), help="the nftrec checkout to compile with")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # leave through the finally
    print(f"source: {args.src}\n\n| Services | named sets / chains / rules (ip) | nft user s | nft sys s | sys vs previous size |")
    print("|---|---|---|---|---|")
    prev = None
    with tempfile.TemporaryDirectory(prefix="nftrec-bench-scale-") as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            root, out = Path(tmp) / f"m-{n}", Path(tmp) / f"cold-{n}.nft"
            mix.generate(root, n, 5)
            # the mix of this checkout, the code of --src (first on its sys.path)
            code = _CHILD.format(src=args.src, bench=str(HERE), root=str(root), out=str(out))
            counts = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                    timeout=args.timeout).stdout.split()
            r = load(out, args.timeout)
            ratio = f"{r['sys'] / prev[1]:.2f}x for {n / prev[0]:.1f}x Services" if prev else "-"
            print(f"| {n:,} | {' / '.join(f'{int(c):,}' for c in counts)} | {r['user']:.2f} | {r['sys']:.2f} | {ratio} |",
                  flush=True)
            prev = (n, r["sys"])
            out.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
