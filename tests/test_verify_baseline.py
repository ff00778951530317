"""The rollback baseline of `verify` and saved plans under it: a new signed revision must
not roll back from the newer of the commit record and status.json; with neither, the
first revision is trusted on first use and `status` says so; `apply --plan` verifies the
plan's revision again and refuses a plan made without `verify`.

Real git and ssh-keygen keys (test_verify_signed's helpers), a git-sync layout, nftrec as
a subprocess in a throwaway namespace.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_cli_kernel import nftrec, ok
from test_verify_signed import git, live_ips, needs_ssh, ssh_key, ssh_setup, status

pytestmark = [pytest.mark.kernel, needs_ssh]


def table_dir(state: Path, ns: str) -> Path:
    return state / "netns" / ns / "tables" / "nftrec"


def records(state: Path, ns: str) -> list[dict]:
    return [json.loads(line) for line in (table_dir(state, ns) / "commits.jsonl").read_text().splitlines()]


def two_applied(tmp_path, netns):
    """(repo, config, state, first, second): two signed revisions applied in turn, the
    second a child of the first."""
    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    second = repo.commit("10.96.0.11")
    repo.publish(second)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.11" in live_ips(netns)
    return repo, cfg, state, first, second


def refused_as_rollback(repo, cfg, state, netns, older: str, newer: str) -> None:
    repo.publish(older)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (rollback)" in p.stderr, p.stdout + p.stderr
    assert newer[:12] in p.stderr, p.stderr
    assert "10.96.0.11" in live_ips(netns) and "10.96.0.10" not in live_ips(netns)


def test_a_status_json_behind_the_commit_record_is_not_the_baseline(tmp_path, netns):
    """status.json written late (watch's state writer) names an older revision than the
    fsynced commit record: replaying that older revision is still a rollback."""
    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    behind = (table_dir(state, netns) / "status.json").read_bytes()
    second = repo.commit("10.96.0.11")
    repo.publish(second)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    (table_dir(state, netns) / "status.json").write_bytes(behind)  # as if the state writer had not run yet
    refused_as_rollback(repo, cfg, state, netns, first, second)


def test_a_damaged_status_json_leaves_the_commit_record_as_the_baseline(tmp_path, netns):
    from watchproc import Watch

    repo, cfg, state, first, second = two_applied(tmp_path, netns)
    (table_dir(state, netns) / "status.json").write_text("{ damaged")
    refused_as_rollback(repo, cfg, state, netns, first, second)
    (table_dir(state, netns) / "status.json").write_text("{ damaged")
    w = Watch(netns, repo.current, cfg, state)  # watch's gate: the same baseline
    try:
        line = w.wait_event("unverified")
        assert line["revision"] == first and line["reason"] == "rollback", line
        assert "10.96.0.11" in live_ips(netns) and "10.96.0.10" not in live_ips(netns)
    finally:
        assert w.stop() == 0


def test_the_first_revision_is_trusted_on_first_use_and_status_says_so(tmp_path, netns):
    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    p = ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "trusted on first use" in p.stderr and first[:12] in p.stderr, p.stderr
    st = status(state, netns, cfg)
    assert st["lastAppliedRevision"] == first and st["lastAppliedTrust"] == "first-use", st
    text = ok(nftrec("status", state=state, ns=netns, config=cfg)).stdout
    assert "trusted on first use" in text, text
    assert [r["trust"] for r in records(state, netns)] == ["first-use"]
    second = repo.commit("10.96.0.11")
    repo.publish(second)
    p = ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "first use" not in p.stderr, p.stderr
    assert status(state, netns, cfg)["lastAppliedTrust"] == "signed"
    assert "first use" not in ok(nftrec("status", state=state, ns=netns, config=cfg)).stdout
    # both records gone (a wiped state directory): trusted on first use again, with the warning
    shutil.rmtree(table_dir(state, netns))
    p = ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "trusted on first use" in p.stderr, p.stderr


def test_apply_plan_refuses_a_plan_made_without_verify(tmp_path, netns):
    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    plain = tmp_path / "plain.yaml"
    plain.write_text(cfg.read_text().split("verify:")[0])
    saved = tmp_path / "p.json"
    ok(nftrec("plan", str(repo.current), "--out", str(saved), state=state, ns=netns, config=plain))
    p = nftrec("apply", "--plan", str(saved), state=state, ns=netns, config=cfg)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "made without `verify`" in p.stderr and "Make the plan again with verify set" in p.stderr, p.stderr
    assert "10.96.0.10" not in live_ips(netns)
    # made with verify: the plan names the verified revision, and applies
    ok(nftrec("plan", str(repo.current), "--out", str(saved), state=state, ns=netns, config=cfg))
    made = json.loads(saved.read_text())["verification"]
    assert made["revision"] == first and made["signer"] == "ops@example" and made["key"].startswith("SHA256:")
    ok(nftrec("apply", "--plan", str(saved), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns)
    st = status(state, netns, cfg)
    assert st["lastAppliedRevision"] == first and st["lastAppliedTrust"] == "first-use"


def test_apply_plan_verifies_its_revision_again_against_the_baseline_of_now(tmp_path, netns):
    """A plan made for a signed child of the last applied revision, then a newer revision
    applied that leaves the same rules (the plan is not stale): the plan's revision is
    now a rollback, refused unless --allow-rollback; a key no longer trusted refuses it."""
    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    planned = repo.commit("10.96.0.11")
    repo.publish(planned)
    saved = tmp_path / "p.json"
    ok(nftrec("plan", str(repo.current), "--out", str(saved), state=state, ns=netns, config=cfg))
    newer = repo.commit("10.96.0.10")  # the same rules as `first`: the kernel stays as planned against
    repo.publish(newer)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert status(state, netns, cfg)["lastAppliedRevision"] == newer
    p = nftrec("apply", "--plan", str(saved), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and f"holds revision {newer[:12]} now" in p.stderr, p.stderr
    repo.publish(planned)  # the checkout back at the plan's revision: older than the last applied
    p = nftrec("apply", "--plan", str(saved), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (rollback)" in p.stderr and newer[:12] in p.stderr, p.stderr
    assert "10.96.0.11" not in live_ips(netns)
    rotated = tmp_path / "rotated.yaml"  # ops's key no longer trusted
    rotated.write_text(cfg.read_text().replace(f"{tmp_path}/keys/ops.pub",
                                               f"{ssh_key(tmp_path / 'keys', 'next')}.pub"))
    p = nftrec("apply", "--plan", str(saved), "--allow-rollback", state=state, ns=netns, config=rotated)
    assert p.returncode == 1 and "refused (" in p.stderr, p.stderr
    assert "10.96.0.11" not in live_ips(netns)
    ok(nftrec("apply", "--plan", str(saved), "--allow-rollback", state=state, ns=netns, config=cfg))
    assert "10.96.0.11" in live_ips(netns)
    st = status(state, netns, cfg)
    assert st["lastAppliedRevision"] == planned and st["lastAppliedTrust"] == "allow-rollback"
    assert records(state, netns)[-1]["kind"] == "allow-rollback"
    assert git(repo.src, "rev-parse", "HEAD") == newer


def test_watch_trusts_the_first_revision_on_first_use_and_records_how(tmp_path, netns):
    from watchproc import Watch

    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    w = Watch(netns, repo.current, cfg, state)
    try:
        w.wait_sync(0)
        assert any("trusted on first use" in line.get("msg", "") for line in w.lines), w.lines
        w.status(lambda st: st["lastAppliedRevision"] == first and st["lastAppliedTrust"] == "first-use")
        mark = len(w.lines)
        second = repo.commit("10.96.0.11")
        repo.publish(second)
        w.wait_sync(mark)
        w.status(lambda st: st["lastAppliedRevision"] == second and st["lastAppliedTrust"] == "signed")
        assert [r["trust"] for r in records(state, netns)] == ["first-use", "signed"]
    finally:
        assert w.stop() == 0
