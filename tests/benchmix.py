"""The benchmark's realistic Service mix (bench/targets.py: ClusterIP, NodePort,
LoadBalancer, affinity, eTP Local) as test input."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import targets  # noqa: E402,F401  (re-exported: tests write single files of the mix too)

from reconciler.intake import load_node_config, read_inventory  # noqa: E402


def bench_mix(d: Path, services: int, endpoints: int):
    """(inventory, node config) of `services` Services x `endpoints` endpoints written to
    d/m with the bench's node config as d/cfg.yaml; both read without problems."""
    targets.generate(d / "m", services, endpoints)
    (d / "cfg.yaml").write_text(targets.NODE_CONFIG)
    cfg, problems = load_node_config(str(d / "cfg.yaml"), discover=False)
    assert not problems
    res = read_inventory(d / "m")
    assert not [p for p in res.problems if p.is_error]
    return res.inventory, cfg
