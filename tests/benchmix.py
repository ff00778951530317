"""The benchmark's Service mix (bench/mix.py) as test input: `mix` writes trees of it,
`bench_mix` reads one back as (inventory, node config)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mix  # noqa: E402


def bench_mix(d: Path, services: int, endpoints: int):
    """(inventory, node config) of `services` Services x `endpoints` endpoints written to
    d/m; both read without problems."""
    mix.generate(d / "m", services, endpoints)
    return mix.read(d / "m")
