"""The command line's first-hour mistakes, each named for what it is: a network namespace
that does not exist (nothing is created for it), git-sync's root given instead of its
`current` link, and a global option placed after the command.

nftrec as a subprocess; git-sync's real layout from tests/gitsync.py (its own git commands).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from gitsync import GitSync, remote
from nsutil import EXAMPLES
from test_cli_kernel import nftrec, ok
from test_verify_signed import git

# --- a network namespace that does not exist ---------------------------------------------------

MISSING_NETNS_COMMANDS = [
    ["plan", str(EXAMPLES / "edge-small")],
    ["apply", str(EXAMPLES / "edge-small")],
    ["watch", str(EXAMPLES / "edge-small")], ["status"], ["cleanup"], ["confirm"], ["doctor"],
    ["trace", "--src", "10.244.0.5", "--dst", "10.96.0.10", "--dport", "80"],
    ["trace", str(EXAMPLES / "edge-small"), "--src", "10.244.0.5", "--dst", "10.96.0.10", "--dport", "80"],
]


@pytest.mark.parametrize("args", MISSING_NETNS_COMMANDS, ids=lambda a: " ".join(a[:2]).replace("/", "_"))
def test_a_missing_namespace_is_named_and_nothing_is_created(tmp_path, args):
    name = f"nftrec-missing-{uuid.uuid4().hex[:8]}"
    assert not Path("/run/netns", name).exists()
    state = tmp_path / "state"
    proc = ok(nftrec(*args, state=state, ns=name), 1)
    assert f"network namespace '{name}' does not exist" in proc.stderr and "ip netns list" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line: no warnings about discovery before it
    assert not state.exists(), sorted(str(p) for p in state.rglob("*"))


# --- git-sync's root ---------------------------------------------------------------------------


@pytest.fixture
def gitsync_root(tmp_path) -> Path:
    """git-sync v4's root after a sync of a commit of edge-small."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLES / "edge-small", src)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "-c", "user.name=t", "-c", "user.email=t@example", "commit", "-qm", "one")
    gs = GitSync(tmp_path / "git-sync", remote(tmp_path, src))
    gs.sync("main")
    return gs.root


@pytest.mark.parametrize("command", ["validate", "plan", "render"])
def test_gitsync_root_is_refused_up_front_with_the_link_to_use(gitsync_root, tmp_path, command):
    proc = ok(nftrec(command, str(gitsync_root), state=tmp_path / "state"), 1)
    said = proc.stdout + proc.stderr
    assert "looks like git-sync's root" in said and f"use {gitsync_root / 'current'}" in said
    assert "defined twice" not in said
    ok(nftrec("validate", str(gitsync_root / "current")))


# --- a global option after the command ---------------------------------------------------------


@pytest.mark.parametrize("args, opt, hint", [
    (["plan", "DIR", "--state-dir", "/x"], "--state-dir", "nftrec --state-dir /x plan DIR"),
    (["plan", "--state-dir=/x", "DIR"], "--state-dir", "nftrec --state-dir=/x plan DIR"),
    (["--log-format", "json", "validate", "DIR", "--state-dir", "/s y"], "--state-dir",
     "nftrec --log-format json --state-dir '/s y' validate DIR"),
    (["status", "--log-format=json", "-o", "json"], "--log-format", "nftrec --log-format=json status -o json"),
    (["status", "--version"], "--version", "nftrec --version status"),
])
def test_global_option_after_the_command_gets_a_hint(args, opt, hint):
    proc = ok(nftrec(*args, config=False), 64)
    assert "No such option" in proc.stderr
    assert f"{opt} is a global option: put it before the command: {hint}" in proc.stderr


def test_other_usage_errors_get_no_global_option_hint():
    proc = ok(nftrec("plan", "--nosuch", config=False), 64)
    assert "global option" not in proc.stderr
