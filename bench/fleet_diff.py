#!/usr/bin/env python3
"""The fleet diff figure: `nftrec diff OLD NEW --fleet INVENTORY` at 100 and 1,000 nodes
over a fleet root of 1,000 Services (bench/mix.py's), as a ratio to P, the parse floor of
one tree measured as bench/targets.py measures it, interleaved with the diff runs.

    .venv/bin/python bench/fleet_diff.py                 # 100 and 1,000 nodes
    .venv/bin/python bench/fleet_diff.py --nodes 1000 --reps 3 --json out.json

The fleet: base/ (most Services, one reading ${labels.site}), SITES sites/<site>/ with a
few Services each (layer sites/${labels.site}), a canary/ layer (ring=canary) replacing
two base Services, and per-node override dirs nodes/<name>/ for a few nodes (layer
nodes/${nodeName}, optional). The change: one base Service edited, one Service added to
one site. Needs no root (no kernel).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mix import PER_FILE, edit_service, ep_ips, generate, service_doc, slice_doc  # noqa: E402
from targets import measure_parse_floor, nftrec_bin, run  # noqa: E402

SERVICES = 1000
ENDPOINTS = 5
SITES = 10
PER_SITE = 4  # Services of each site's own layer (their slices beside them)
CANARY_EVERY = 50  # every 50th node is ring=canary
OVERRIDES = 5  # nodes with a nodes/<name>/ directory
TARGET = 20.0  # x P, at 1,000 nodes

FLEET = """\
apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: base
- path: sites/${labels.site}
- path: canary
  selector: {matchLabels: {ring: canary}}
- path: nodes/${nodeName}
  optional: true
variables: {team: edge}
"""


def site(k: int) -> str:
    return f"site-{k:02d}"


def node(i: int) -> str:
    return f"edge-{i:04d}"


def make_fleet(root: Path, nodes: int) -> None:
    """The fleet root (see the module doc) from bench/mix.py's 1,000 Services."""
    gen = root.parent / f"{root.name}-gen"
    generate(gen, SERVICES, ENDPOINTS)
    own = SITES * PER_SITE
    base = root / "base"
    shutil.copytree(gen, base)
    shutil.rmtree(gen)
    # the sites' Services are the last `own` of the mix: cut from base, written per site
    last = (SERVICES - own) // PER_FILE
    for sub, name in (("services", "svc"), ("endpointslices", "eps")):
        p = base / sub / f"{name}-{last:04d}.yaml"
        keep = range(last * PER_FILE, SERVICES - own)
        doc = service_doc if sub == "services" else (lambda i: slice_doc(i, ep_ips(i, ENDPOINTS)))
        p.write_text("---\n".join(doc(i) for i in keep))
    first = SERVICES - own
    text = (base / "services" / "svc-0000.yaml").read_text()
    (base / "services" / "svc-0000.yaml").write_text(
        text.replace("  labels: {app: svc-0}\n", "  labels: {app: svc-0}\n  annotations: {site: \"${labels.site}\"}\n", 1))
    for k in range(SITES):
        idx = range(first + k * PER_SITE, first + (k + 1) * PER_SITE)
        d = root / "sites" / site(k)
        d.mkdir(parents=True)
        (d / "services.yaml").write_text("---\n".join(service_doc(i) for i in idx))
        (d / "slices.yaml").write_text("---\n".join(slice_doc(i, ep_ips(i, ENDPOINTS)) for i in idx))
    (root / "canary").mkdir()
    (root / "canary" / "replaced.yaml").write_text("---\n".join(
        service_doc(i).replace("port: 80\n", "port: 8080\n") for i in (1, 2)))
    for i in range(OVERRIDES):
        d = root / "nodes" / node(i * 7)
        d.mkdir(parents=True)
        (d / "own.yaml").write_text(service_doc(3).replace("port: 80\n", f"port: {9000 + i}\n"))
    (root / "fleet.yaml").write_text(FLEET)


def change(old: Path, new: Path) -> None:
    """NEW: OLD with one base Service edited and one Service added to one site."""
    shutil.copytree(old, new)
    k = edit_service(SERVICES - SITES * PER_SITE)
    p = new / "base" / "services" / f"svc-{k // PER_FILE:04d}.yaml"
    text = p.read_text()
    start = text.index(f"  name: svc-{k}\n")
    at = text.index("      port: 80\n", start)
    p.write_text(text[:at] + "      port: 81\n" + text[at + len("      port: 80\n"):])
    extra = SERVICES + 1
    with open(new / "sites" / site(3) / "services.yaml", "a") as f:
        f.write("---\n" + service_doc(extra).replace(f"name: svc-{extra}\n", "name: svc-added\n"))


def inventory(path: Path, nodes: int) -> None:
    lines = ["apiVersion: nftrec/v1alpha1", "kind: NodeInventory", "nodes:"]
    for i in range(nodes):
        ring = ", ring: canary" if i % CANARY_EVERY == 0 else ""
        lines.append(f"- {{name: {node(i)}, labels: {{site: {site(i % SITES)}{ring}}}}}")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100,1000", help="comma-separated node counts")
    ap.add_argument("--reps", type=int, default=5, help="P/diff pairs per figure (the median ratio is reported)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    out: dict = {"services": SERVICES, "sites": SITES, "figures": []}
    with tempfile.TemporaryDirectory(prefix="nftrec-fleet-bench-") as t:
        tmp = Path(t)
        old, new = tmp / "old", tmp / "new"
        make_fleet(old, 0)
        change(old, new)
        ctx = types.SimpleNamespace(reps=1, root=old, to=args.timeout)
        for n in (int(x) for x in args.nodes.split(",")):
            inv = tmp / f"inv-{n}.yaml"
            inventory(inv, n)
            argv = [nftrec_bin(), "diff", str(old), str(new), "--fleet", str(inv), "-o", "json"]
            pairs = []
            for _ in range(args.reps):  # P and the diff interleaved: each ratio of one moment's load
                p = measure_parse_floor(ctx)
                r = run(argv, args.timeout, rss=True)
                if r["rc"] != 0:
                    raise SystemExit(f"nftrec diff --fleet exited {r['rc']}:\n{r['stderr'][-2000:]}")
                pairs.append((p, r))
            doc = json.loads(pairs[0][1]["stdout"])
            ratios = [r["wall"] / p["wall"] for p, r in pairs]
            fig = {"nodes": n, "ratio": statistics.median(ratios), "ratios": ratios,
                   "P": [p["wall"] for p, _ in pairs], "walls": [r["wall"] for _, r in pairs],
                   "documents": pairs[0][0]["documents"], "groups": len(doc["groups"]),
                   "rss_mb": max(r.get("rss_mb") or 0 for _, r in pairs)}
            out["figures"].append(fig)
            met = "met" if fig["ratio"] <= TARGET else "MISSED"
            print(f"{n:5d} nodes: {fig['ratio']:.1f} x P (median of {args.reps}; per run "
                  f"{', '.join(f'{x:.1f}' for x in ratios)}; P {min(fig['P']):.2f}-{max(fig['P']):.2f} s, "
                  f"{fig['documents']} documents), {fig['groups']} groups, max RSS {fig['rss_mb']:.0f} MB"
                  + (f"  (target {TARGET:g} x P: {met})" if n >= 1000 else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
