"""`verify` on git-sync v4's real layout and defaults (tests/gitsync.py: `--depth 1`
fetches into a root repository, a worktree per commit, `current` swapped, `git gc`): a
skipped commit and a direct child pass, an older commit fetched again by id is refused
saying which rule decided, a pruned last applied commit is decided by time. And what is
parsed is the verified commit's bytes: not a skip-worktree edit, not a file swapped
between the verification and the parse.

Real git, SSH keys made here, nftrec as a subprocess in a throwaway namespace for the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gitsync import GitSync, push, remote
from reconciler.intake import Baseline, Verifier, Verify
from test_cli_kernel import nftrec, ok
from test_verify_signed import SERVICE, git, live_ips, needs_ssh, ssh_setup, status

pytestmark = [needs_ssh]


class Upstream:
    """The signed repository (ops's key) and git-sync syncing it; commits one minute apart."""

    def __init__(self, tmp: Path):
        self.ops, self.repo, self.cfg = ssh_setup(tmp)
        self.n = 0
        self.first = self.commit("10.96.0.10")
        self.remote = remote(tmp, self.repo.src)
        self.gs = GitSync(tmp / "git-sync", self.remote)

    def commit(self, ip: str) -> str:
        self.n += 1
        self.repo.env["GIT_COMMITTER_DATE"] = f"2026-01-01T00:{self.n:02d}:00Z"
        sha = self.repo.commit(ip)
        if self.n > 1:
            push(self.repo.src, self.remote)
        return sha

    def time(self, sha: str) -> int:
        return int(git(self.repo.src, "log", "-1", "--format=%ct", sha))


@pytest.mark.kernel
def test_gitsync_defaults_through_apply(tmp_path, netns):
    up = Upstream(tmp_path)
    state = tmp_path / "state"

    def apply(*extra: str, rc: int = 0):
        return ok(nftrec("apply", str(up.gs.current), *extra, state=state, ns=netns, config=up.cfg), rc)

    assert up.gs.sync("main") == up.first
    apply()
    for ip in ("10.96.0.11", "10.96.0.12", "10.96.0.13"):
        skipped_to = up.commit(ip)
    assert up.gs.sync("main") == skipped_to  # three ahead, fetched with --depth 1
    assert (up.gs.root / ".git" / "shallow").exists()
    p = apply()
    assert "10.96.0.13" in live_ips(netns) and status(state, netns, up.cfg)["lastAppliedRevision"] == skipped_to
    assert "history not available" in p.stderr and "newer than" in p.stderr, p.stderr
    child = up.commit("10.96.0.14")
    up.gs.sync("main")
    p = apply()
    assert "10.96.0.14" in live_ips(netns) and "a direct child" in p.stderr, p.stderr
    # an older signed commit fetched again by id: refused, by time, and it says so
    up.gs.sync(skipped_to)
    p = apply(rc=1)
    assert "refused (rollback)" in p.stderr and "signed by ops@example" in p.stderr, p.stderr
    assert "history not available" in p.stderr and "is not newer than" in p.stderr and "--allow-rollback" in p.stderr
    assert "10.96.0.14" in live_ips(netns) and "10.96.0.13" not in live_ips(netns)
    assert status(state, netns, up.cfg)["lastAppliedRevision"] == child
    p = apply("--allow-rollback")
    assert "allowed" in p.stderr and "10.96.0.13" in live_ips(netns)
    doc = json.loads(ok(nftrec("plan", str(up.gs.current), "-o", "json", state=state, ns=netns, config=up.cfg)).stdout)
    assert doc["verification"]["revision"] == skipped_to


def test_rollback_rules_on_gitsync_history(tmp_path):
    up = Upstream(tmp_path)
    with Verifier(Verify(mode="HEAD", keys=(f"{up.ops}.pub",))) as v:
        up.gs.sync("main")
        first = v.check(up.gs.current)
        assert first.ok and first.time == up.time(up.first)
        for ip in ("10.96.0.11", "10.96.0.12"):
            up.commit(ip)
        third = up.commit("10.96.0.13")
        up.gs.sync("main")
        verdict = v.check(up.gs.current, Baseline(up.first, first.time, "commits"))
        assert verdict.ok and "history not available" in verdict.message and "newer than" in verdict.message
        # the baseline's time read from the store when no record holds it
        assert v.check(up.gs.current, up.first).ok
        child = up.commit("10.96.0.14")
        up.gs.sync("main")
        verdict = v.check(up.gs.current, third)
        assert verdict.ok and "a direct child" in verdict.message
        # the last applied commit pruned by gc: time decides when the record has it; else refused, saying both facts
        up.gs.prune()
        with pytest.raises(Exception):
            git(up.gs.root, "cat-file", "-e", third)
        newer = up.commit("10.96.0.15")
        up.commit("10.96.0.16")
        up.gs.sync(newer)
        verdict = v.check(up.gs.current, Baseline(third, up.time(third), "commits"))
        assert verdict.ok and "history not available" in verdict.message
        verdict = v.check(up.gs.current, third)
        assert verdict.reason == "rollback" and "history not available" in verdict.message, verdict
        assert "time is not known" in verdict.message and "--allow-rollback" in verdict.message
        # an older commit fetched again by id, its parent not fetched
        up.gs.sync(third)
        verdict = v.check(up.gs.current, Baseline(child, up.time(child), "status"))
        assert verdict.reason == "rollback" and "is not newer than" in verdict.message, verdict
        assert "does not descend" not in verdict.message


@pytest.mark.kernel
def test_skip_worktree_edit_is_not_applied(tmp_path, netns):
    up = Upstream(tmp_path)
    state = tmp_path / "state"
    up.gs.sync("main")
    wt = up.gs.current.resolve()
    git(wt, "update-index", "--skip-worktree", "web.yaml")
    (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.66"))
    assert git(wt, "status", "--porcelain") == ""  # git sees nothing
    ok(nftrec("apply", str(up.gs.current), state=state, ns=netns, config=up.cfg))
    assert "10.96.0.10" in live_ips(netns) and "10.96.0.66" not in live_ips(netns)


@pytest.mark.kernel
def test_a_file_swapped_between_verify_and_parse_is_not_read(tmp_path, netns, monkeypatch):
    from reconciler.engine import desired

    up = Upstream(tmp_path)
    up.gs.sync("main")
    wt = up.gs.current.resolve()
    swapped = []

    def swap(directory: Path) -> None:
        (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.66"))
        swapped.append(directory)

    monkeypatch.setattr(desired, "after_verify", swap)
    got = desired.load_desired(up.gs.current, up.cfg, netns=netns, signed=(None, False))
    assert swapped and (wt / "web.yaml").read_text() == SERVICE.format(ip="10.96.0.66")
    assert [s.cluster_ips for s in got.inventory.services] == [("10.96.0.10",)]
    assert got.revision == up.first and got.verdict.ok


@pytest.mark.kernel
def test_watch_on_gitsync_defaults(tmp_path, netns):
    """watch with verify on git-sync's layout: a skipped commit and a direct child
    applied, an older commit fetched again by id refused as a rollback, saying why."""
    from watchproc import Watch

    up = Upstream(tmp_path)
    state = tmp_path / "state"
    up.gs.sync("main")
    w = Watch(netns, up.gs.current, up.cfg, state)
    try:
        w.wait_sync(0)
        assert "10.96.0.10" in live_ips(netns)
        for ip in ("10.96.0.11", "10.96.0.12", "10.96.0.13"):
            skipped_to = up.commit(ip)
        up.gs.sync("main")
        w.wait(lambda: "10.96.0.13" in live_ips(netns), what="three ahead applied")
        w.status(lambda st: st["lastAppliedRevision"] == skipped_to)
        child = up.commit("10.96.0.14")
        up.gs.sync("main")
        w.wait(lambda: "10.96.0.14" in live_ips(netns), what="the direct child applied")
        w.status(lambda st: st["lastAppliedRevision"] == child)
        mark = len(w.lines)
        up.gs.sync(skipped_to)
        line = w.wait_event("unverified", mark)
        assert line["reason"] == "rollback" and line["revision"] == skipped_to, line
        st = w.status(lambda st: st["lastAttemptedRevision"] == skipped_to)
        assert "history not available" in st["lastError"] and "is not newer than" in st["lastError"], st["lastError"]
        assert "10.96.0.14" in live_ips(netns) and "10.96.0.13" not in live_ips(netns)
    finally:
        assert w.stop() == 0
