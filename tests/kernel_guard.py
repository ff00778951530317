"""The guard of scripts/test-kernels, shown failing: each ruleset in tests/data/kernel-guard
uses a construct that some kernel lacks (its first line says which and since when), and must
load. Not collected by the suite (its name is not test_*); scripts/test-kernels runs it in
each guest when NFTREC_KERNELS_GUARD=1, where it fails on a kernel without the construct
and passes on one with it: a ruleset the release's kernel refuses fails the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsutil import nft_scratch

pytestmark = pytest.mark.kernel

RULESETS = sorted((Path(__file__).parent / "data" / "kernel-guard").glob("*.nft"))


@pytest.mark.parametrize("path", RULESETS, ids=[p.stem for p in RULESETS])
def test_the_kernel_loads_the_ruleset(path):
    nft_scratch(path.read_text(), check_only=False)
