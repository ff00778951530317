"""Golden files: the rendered ruleset of each example directory, byte for byte.

Regenerate after an intended change with
    NFTREC_UPDATE_GOLDEN=1 /work/venv/bin/python -m pytest tests/test_golden.py
and review the diff against the kube-proxy reference before committing it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.compile.services import compile_ruleset
from reconciler.compile.render import render_script

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
GOLDEN = HERE / "golden"
CASES = ["edge-small", "dual-stack"]
# `layout: kube-proxy` keeps kube-proxy's exact shape: its golden is `<name>.kube-proxy.nft`
LAYOUTS = {"sharded": "", "kube-proxy": ".kube-proxy"}


def _render(name: str, layout: str = "sharded") -> str:
    from reconciler.intake.config import load_node_config
    from reconciler.intake.inventory import read_inventory

    result = read_inventory(EXAMPLES / name)
    errors = [p for p in result.problems if getattr(p, "severity", "") == "error"]
    assert not errors, errors
    cfg_path = EXAMPLES / f"{name}.config.yaml"
    config, problems = load_node_config(str(cfg_path), discover=False)
    assert not [p for p in problems if getattr(p, "severity", "") == "error"], problems
    assert config.layout == "sharded"  # the default: the example configs do not set it
    return render_script(compile_ruleset(result.inventory, replace(config, layout=layout)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", CASES)
def test_golden(name, layout):
    got = _render(name, layout)
    path = GOLDEN / f"{name}{LAYOUTS[layout]}.nft"
    if os.environ.get("NFTREC_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
        return
    assert path.is_file(), f"{path} missing: run with NFTREC_UPDATE_GOLDEN=1 and review it"
    assert got == path.read_text(), f"render of examples/{name} differs from {path}"
