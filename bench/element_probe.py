#!/usr/bin/env python3
"""Probe: what one element change costs in each nft spelling, on a sharded table.

    sudo .venv/bin/python bench/element_probe.py                  # 10,000 Services x 5
    sudo .venv/bin/python bench/element_probe.py --services 1000

Loads the benchmark's mix (bench/mix.py, layout sharded) with `nft -f` into a throwaway
namespace `nftrec-bench-probe-<pid>` (deleted in a `finally`), then times, with the nft
binary (`nft -f` of a one-transaction script, process start included) and through
libnftables in-process right after a `read_live` on the same context (as `apply` runs):

  * `delete element` of one index of an endpoint shard (+ its re-adding declaration, so
    the table stays the same), and `add element` / `delete element` on the non-typeof
    shared sets (cluster-ips, service-ips, the largest hairpin-connections shard);
  * the same element written through the set's declaration (`add set|map … { … ;
    elements = { … } ; }`);
  * `flush map|set` + the declaration of all of its elements (the rewrite that
    changes.transaction_for uses instead of `delete element`);
  * `flush chain` + `add rule` of the Service's selection rule (what every endpoint
    change also commits, in both layouts).
Each figure: `--reps` runs, all printed (ms).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import mix  # noqa: E402
from reconciler.compile.layout import allocation_of  # noqa: E402
from reconciler.compile.render import render_script  # noqa: E402
from reconciler.compile.ruleset import element_cmd, rule_cmd, set_elements_cmd  # noqa: E402
from reconciler.compile.services import compile_ruleset  # noqa: E402
from reconciler.kernel.live import read_live  # noqa: E402
from reconciler.kernel import Libnftables  # noqa: E402

T = "nftrec"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n = args.services
    tmp = Path(tempfile.mkdtemp(prefix="nftrec-bench-probe-"))
    mix.generate(tmp / "m", n, 5)
    desired = compile_ruleset(*mix.read(tmp / "m", mix.NODE_CONFIG + "layout: sharded\n"))
    t4 = desired.tables["ip"]
    k = mix.edit_service(n)  # a ClusterIP Service without affinity
    chain = next(c for (_f, c) in allocation_of(desired) if f"/svc-{k}/" in c)
    shard, off, _n = allocation_of(desired)[("ip", chain)]
    rule = t4.chains[chain].rules[-1]
    ns = f"nftrec-bench-probe-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    nft = None
    try:
        (tmp / "t.nft").write_text(render_script(desired))
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", str(tmp / "t.nft")], check=True)
        nft = Libnftables(netns=ns)

        def timed(label: str, script: str) -> None:
            (tmp / "x.nft").write_text(script)
            b, lib = [], []
            for _ in range(args.reps):
                t = time.perf_counter()
                subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", str(tmp / "x.nft")], check=True)
                b.append(time.perf_counter() - t)
                read_live(nft, T)
                t = time.perf_counter()
                nft.run_script(script)
                lib.append(time.perf_counter() - t)
            fmt = lambda xs: " ".join(f"{x * 1000:.0f}" for x in xs)  # noqa: E731
            print(f"| {label} | {fmt(b)} | {fmt(lib)} |", flush=True)

        print(f"{n:,} Services x 5, layout sharded; ms per run (nft -f / libnftables after read_live)\n")
        print("| transaction | nft -f | libnftables |\n|---|---|---|")
        s = t4.sets[shard]
        spare = replace(s.elements[(str(off),)], key=(str(off + 5),))  # capacity 8 holds index 5
        readd = set_elements_cmd("ip", T, s, [spare])
        subprocess.run(["ip", "netns", "exec", ns, "nft", readd], check=True)
        timed(f"`delete element` on {shard} (+ re-add by declaration)",
              element_cmd("delete", "ip", T, s, spare) + "\n" + readd)
        timed(f"one element by declaration ({shard})", readd)
        timed(f"`flush map` {shard} + declaration of its {len(s.elements) + 1} elements",
              f"flush map ip {T} {shard}\n" + set_elements_cmd("ip", T, s, [*s.elements.values(), spare]))
        timed("`flush chain` + `add rule` (the Service's selection rule)",
              f"flush chain ip {T} {chain}\n" + rule_cmd("ip", T, chain, rule))
        hairpin = max((x for x in t4.sets if x.startswith("hairpin-connections-")), key=lambda x: len(t4.sets[x].elements))
        for name in ("cluster-ips", "service-ips", hairpin):
            s = t4.sets[name]
            e0 = next(iter(s.elements.values()))
            key = ("172.31.255.1",) + e0.key[1:] if name != hairpin else ("10.255.0.1",) * 2 + e0.key[2:]
            e = replace(e0, key=key)
            timed(f"`add element` + `delete element` on {name}",
                  element_cmd("add", "ip", T, s, e) + "\n" + element_cmd("delete", "ip", T, s, e))
            timed(f"one element by declaration ({name}; stays)", set_elements_cmd("ip", T, s, [e]))
            kind = "map" if s.is_map else "set"
            timed(f"`flush {kind}` {name} + declaration of its {len(s.elements)} elements",
                  f"flush {kind} ip {T} {name}\n" + set_elements_cmd("ip", T, s, list(s.elements.values())))
    finally:
        if nft is not None:
            nft.close()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
