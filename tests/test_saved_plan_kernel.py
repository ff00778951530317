"""Saved plans on a first apply, against the real kernel: `plan --out` prints the whole
command that applies the plan where it was made, running that command applies it (its
recomputed transaction lists elements in another order, which is no reason to refuse
it), and a plan the kernel moved away from is still refused. canonical_ops's rules
without a kernel: which orders count and which do not."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from nsutil import EXAMPLES, in_ns
from reconciler.kernel import canonical_ops
from test_cli_kernel import NFTREC, assert_clean, nftrec, ok

EXAMPLES_WITH_CONFIG = [("edge-small", EXAMPLES / "edge-small.config.yaml"),
                        ("dual-stack", EXAMPLES / "dual-stack.config.yaml")]

def _printed_command(stdout: str) -> list[str]:
    """The command `plan --out` printed on the line after "apply it with:", as argv."""
    lines = stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.endswith("apply it with:"))
    argv = shlex.split(lines[i + 1])
    assert argv[0] == "nftrec", argv
    return [NFTREC] + argv[1:]

@pytest.mark.kernel
@pytest.mark.parametrize("example,config", EXAMPLES_WITH_CONFIG, ids=[e for e, _ in EXAMPLES_WITH_CONFIG])
def test_first_apply_of_a_saved_plan_with_the_printed_command(netns, tmp_path, example, config, monkeypatch):
    state = tmp_path / "state dir"  # a space: the printed command must quote it
    state.mkdir()
    plan = tmp_path / "first.plan"
    p = ok(nftrec("plan", str(EXAMPLES / example), "--out", str(plan), state=state, ns=netns, config=config))
    argv = _printed_command(p.stdout)
    assert argv[1:5] == ["--state-dir", str(state), "apply", "--plan"], argv  # global options first
    assert ["--netns", netns] == argv[argv.index("--netns"):][:2]
    assert ["--config", str(config)] == argv[argv.index("--config"):][:2]
    monkeypatch.chdir("/")  # the command names everything absolutely: it works from anywhere
    applied = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert "Apply complete" in applied.stdout, applied.stdout
    assert_clean(EXAMPLES / example, state, netns, config=config)

@pytest.mark.kernel
def test_first_apply_plan_made_stale_by_the_kernel_is_refused(netns, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    plan = tmp_path / "first.plan"
    ok(nftrec("plan", str(EXAMPLES / "edge-small"), "--out", str(plan), state=state, ns=netns))
    in_ns(netns, "nft", "add", "table", "ip", "nftrec")  # the kernel moves on behind the plan's back
    p = ok(nftrec("apply", "--plan", str(plan), state=state, ns=netns), 1)
    assert "stale" in p.stderr, p.stderr
    assert in_ns(netns, "nft", "list", "table", "ip", "nftrec").stdout.count("chain") == 0

def test_canonical_ops_ignores_only_orders_nft_ignores():
    decl = 'add set ip t s { type ipv4_addr ; elements = { %s } ; }'
    assert canonical_ops([decl % "10.0.0.2 , 10.0.0.1"]) == canonical_ops([decl % "10.0.0.1 , 10.0.0.2"])
    add = ["add element ip t s { 10.0.0.1 }", "add element ip t m { 1 : goto c }"]
    assert canonical_ops(["add chain ip t c", *add]) == canonical_ops(["add chain ip t c", *reversed(add)])
    # a chain before the element that jumps to it; a delete and an add of one element; a flush and an add
    assert canonical_ops(["add chain ip t c", add[1]]) != canonical_ops([add[1], "add chain ip t c"])
    swap = ["delete element ip t s { 10.0.0.1 }", "add element ip t s { 10.0.0.1 }"]
    assert canonical_ops(swap) != canonical_ops(list(reversed(swap)))
    flush = ["flush set ip t s", "add element ip t s { 10.0.0.1 }"]
    assert canonical_ops(flush) != canonical_ops(list(reversed(flush)))
    # different contents are never equal
    assert canonical_ops([decl % "10.0.0.1 , 10.0.0.2"]) != canonical_ops([decl % "10.0.0.1 , 10.0.0.3"])
