"""No program a repository's config names ever runs: a git-sync checkout owned by
git-sync's user (uid 65534) whose `.git/config` sets gpg.program, gpg.ssh.program and
core.fsmonitor to a script that writes a marker; `nftrec apply`, `plan` and `watch`,
with and without `verify`, never write it. `diff --git` runs git only in the caller's own
repository, and says so for another user's.

Real git and SSH keys; nftrec as a subprocess in a throwaway namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_cli_kernel import nftrec, ok
from test_verify_signed import SERVICE, git, live_ips, needs_ssh, ssh_setup

pytestmark = [pytest.mark.kernel, needs_ssh]


def booby_trap(tmp: Path, repo: Path) -> Path:
    """Set the repository's program settings to a script that appends to a marker file."""
    marker = tmp / "marker"
    script = tmp / "trap.sh"
    script.write_text(f'#!/bin/sh\necho "ran as $(id -u): $0 $*" >> {marker}\nexit 1\n')
    script.chmod(0o755)
    for key in ("gpg.program", "gpg.ssh.program", "core.fsmonitor", "gpg.x509.program"):
        git(repo, "config", key, str(script))
    return marker


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_repository_programs_never_run(tmp_path, netns, verify):
    from watchproc import Watch

    _, repo, cfg = ssh_setup(tmp_path)
    if not verify:
        cfg.write_text(cfg.read_text().split("verify:")[0])
    first = repo.commit("10.96.0.10")
    second = repo.commit("10.96.0.11")
    repo.publish(second)  # both worktrees made now: the test's own git runs before the trap is set
    repo.publish(first)
    marker = booby_trap(tmp_path, repo.src)
    subprocess.run(["chown", "-R", "65534:65534", str(repo.src), str(repo.gs)], check=True)  # git-sync's user
    assert git(repo.src, "config", "core.fsmonitor")  # the trap is set
    state = tmp_path / "state"
    ok(nftrec("plan", str(repo.current), state=state, ns=netns, config=cfg))
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns)
    w = Watch(netns, repo.current, cfg, state)
    try:
        w.wait_sync(0)
        mark = len(w.lines)
        repo.publish(second)  # a git-sync swap: the watch reads the new commit's tree
        w.wait(lambda: "10.96.0.11" in live_ips(netns), what="the second revision applied")
        assert w.syncs() and mark <= len(w.lines)
    finally:
        assert w.stop() == 0
    assert not marker.exists(), marker.read_text()


def test_diff_git_runs_git_only_in_the_callers_own_repository(tmp_path):
    repo = tmp_path / "r"
    (repo / "m").mkdir(parents=True)
    git(tmp_path, "init", "-q", str(repo))
    for ip in ("10.96.0.10", "10.96.0.11"):
        (repo / "m" / "web.yaml").write_text(SERVICE.format(ip=ip))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", ip)
    marker = booby_trap(tmp_path, repo)
    git(repo, "config", "core.fsmonitor", "")  # the owner's own program runs for the owner: not tested here
    ok(nftrec("diff", "--git", str(repo / "m"), "HEAD~1..HEAD", config=False), 0)
    git(repo, "config", "core.fsmonitor", str(tmp_path / "trap.sh"))
    subprocess.run(["chown", "65534:65534", str(repo / ".git" / "config")], check=True)  # its config alone
    p = nftrec("diff", "--git", str(repo / "m"), "HEAD~1..HEAD", config=False)
    assert p.returncode != 0 and "config belongs to uid 65534" in p.stderr, p.stderr
    subprocess.run(["chown", "-R", "65534:65534", str(repo)], check=True)
    p = nftrec("diff", "--git", str(repo / "m"), "HEAD~1..HEAD", config=False)
    assert p.returncode != 0 and "belongs to uid 65534" in p.stderr and "run it as the repository's owner" in p.stderr, p.stderr
    assert not marker.exists(), marker.read_text()
