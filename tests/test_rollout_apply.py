"""One-shot `apply` and the staged rollout, on the real kernel in a network namespace: each
outcome of apply (applied, invalid, held, refused by the removal guard, rolled back by a
confirmed apply, halted) is its status record on refs/nftrec/status/<node> of a file://
remote or of `git daemon`; a hung remote costs apply at most the push's bound and leaves
its exit code, and the next apply delivers what stayed queued. `apply --plan` follows the
rollout and the hold as `apply DIR` does; `apply --rollback` follows the hold alone.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from nsutil import throwaway_netns
from rolloutfleet import make_fleet, nftrec, node_config, set_endpoint, status
from test_hold import _vip_endpoint
from test_status_records import Daemon, bare, log_of
from reconciler.engine import StatusChannel, StatusSettings
from reconciler.engine.applystatus import SEND_BOUND
from reconciler.intake import Record



def with_status(cfg: Path, remote: str) -> Path:
    cfg.write_text(cfg.read_text() + f"status: {{remote: '{remote}'}}\n")
    return cfg


def services(root: Path, count: int) -> Path:
    """A plain directory of `count` Services with one endpoint each (the removal guard's input)."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.yaml"):
        old.unlink()
    for i in range(count):
        (root / f"s{i}.yaml").write_text(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: default}}\n"
            f"spec: {{clusterIP: 10.96.1.{i + 1}, ports: [{{name: p, port: 80}}]}}\n")
    return root


def outcomes(remote: Path, node: str) -> list[tuple[str, str]]:
    return [(r.outcome, r.wave) for r in log_of(remote, node)]


@pytest.mark.kernel
def test_each_outcome_of_apply_is_its_status_record(tmp_path):
    """A fleet node of wave `rest` (interval 1h) pushing to a file:// remote: applied (the
    first revision), held (the next one, its wave closed), invalid (a broken manifest),
    applied (--ignore-rollout); each record names the node's wave and the revisions."""
    remote = bare(tmp_path / "status.git")
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = with_status(node_config(tmp_path / "config.yaml", "edge-2"), f"file://{remote}")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        first = status(state, ns, cfg)["lastAppliedRevision"]
        assert outcomes(remote, "edge-2") == [("applied", "rest")]

        set_endpoint(root, "10.244.0.2")
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 3, p.stderr
        held = log_of(remote, "edge-2")[-1]
        assert held.outcome == "held" and held.applied == first and held.attempted != first
        assert held.error.startswith("held: wave rest opens at") and held.wave == "rest"

        (root / "base" / "bad.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: bad}\nspec: {x: 1}\n")
        assert nftrec(state, "apply", str(root), *base).returncode == 1
        invalid = log_of(remote, "edge-2")[-1]
        assert invalid.outcome == "invalid" and invalid.applied == first and "error(s) in the input" in invalid.error
        (root / "base" / "bad.yaml").unlink()

        p = nftrec(state, "apply", str(root), *base, "--ignore-rollout")
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)
        assert outcomes(remote, "edge-2") == [("applied", "rest"), ("held", "rest"), ("invalid", "rest"),
                                              ("applied", "rest")]
        assert log_of(remote, "edge-2")[-1].applied == status(state, ns, cfg)["lastAppliedRevision"] != first
        # the same outcome again (a no-op apply from cron) is not a new record within fullSyncPeriod
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        assert len(log_of(remote, "edge-2")) == 4
        # ... and is one once fullSyncPeriod (1h by default) has passed: fleet status sees the node alive
        assert nftrec(state, "apply", str(root), *base, env={"NFTREC_CLOCK_OFFSET": "3700"}).returncode == 0
        assert outcomes(remote, "edge-2")[-1] == ("applied", "rest") and len(log_of(remote, "edge-2")) == 5


@pytest.mark.kernel
def test_a_refusal_and_a_rollback_are_status_records(tmp_path):
    """A plain directory: the removal guard's refusal and a confirmed apply whose health
    check fails (rolled back) are records too, with their reason."""
    remote = bare(tmp_path / "status.git")
    root = services(tmp_path / "svc", 7)
    cfg = with_status(node_config(tmp_path / "config.yaml", "n1"), f"file://{remote}")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        services(root, 1)
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 1 and "refused" in p.stderr, p.stderr
        refused = log_of(remote, "n1")[-1]
        assert refused.outcome == "refused" and "removal guard" in refused.error
        services(root, 8)
        p = nftrec(state, "apply", str(root), *base, "--confirm-timeout", "1s", "--health-cmd", "false")
        assert p.returncode == 1 and "rolled back" in p.stderr, p.stderr
        back = log_of(remote, "n1")[-1]
        assert back.outcome == "rolled-back" and "rolled back" in back.error and back.attempted != back.applied
    assert [r.outcome for r in log_of(remote, "n1")] == ["applied", "refused", "rolled-back"]


@pytest.mark.kernel
def test_the_halt_is_a_status_record(tmp_path):
    """maxFailures: 0 and the canary's record says it failed the revision: a node of the
    next wave, once its wave opens, halts (exit 3) and pushes `halted`."""
    remote = bare(tmp_path / "status.git")
    root = make_fleet(tmp_path / "fleet", interval="1m", address="10.244.0.1")
    (root / "fleet.yaml").write_text((root / "fleet.yaml").read_text().replace("  interval:", "  maxFailures: 0\n"
                                                                                "  interval:"))
    cfg = with_status(node_config(tmp_path / "config.yaml", "edge-2"), f"file://{remote}")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        set_endpoint(root, "10.244.0.2")
        assert nftrec(state, "apply", str(root), *base).returncode == 3  # held: first seen now, wave rest in 1m
        revision = log_of(remote, "edge-2")[-1].attempted
        canary = StatusChannel(tmp_path / "canary-state", StatusSettings(f"file://{remote}"))
        canary.enqueue(Record("edge-1", (("ring", "canary"),), "canary", "", revision, "invalid", "1 error(s)",
                              time.time()))
        assert canary.flush(30), canary.last_error
        p = nftrec(state, "apply", str(root), *base, env={"NFTREC_CLOCK_OFFSET": "120"})
        assert p.returncode == 3 and "halted: 1 node of wave canary failed" in p.stderr, p.stderr
        halted = log_of(remote, "edge-2")[-1]
        assert halted.outcome == "halted" and halted.attempted == revision and "edge-1 (invalid)" in halted.error


def test_a_verify_refusal_is_refused_and_bad_input_invalid(tmp_path, monkeypatch):
    """The two kinds of unreadable revision (engine.record_invalid): `verify` refused it
    (refused) or its manifests have errors (invalid); both sent by the one push."""
    from reconciler.engine import Target, applystatus, send_queued, start_status
    from reconciler.engine.desired import InvalidInput, Unverified
    from reconciler.engine.entry import record_invalid
    from reconciler.intake import load_node_config

    monkeypatch.setattr(applystatus, "_reporter", None)  # this process's reporter: none once the test ends

    remote = bare(tmp_path / "status.git")
    cfg = with_status(node_config(tmp_path / "config.yaml", "n1"), f"file://{remote}")
    target = Target(None, "nftrec", tmp_path / "state")
    start_status(target, load_node_config(str(cfg), discover=False)[0])
    record_invalid(target, Unverified("a" * 40, "commit aaaa is not signed by a key of verify.keys"))
    record_invalid(target, InvalidInput("b" * 40, 2, tmp_path))
    send_queued()
    assert [(r.outcome, r.attempted) for r in log_of(remote, "n1")] == [("refused", "a" * 40), ("invalid", "b" * 40)]
    assert "not signed" in log_of(remote, "n1")[0].error


@pytest.mark.kernel
def test_a_hung_remote_costs_apply_the_bound_and_the_next_apply_delivers(tmp_path):
    """status.remote accepts the connection and never answers: apply still exits 0, within
    the push's bound, says the record stays queued; once `git daemon` serves that address,
    the next apply sends both records, in order."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    port = hole.getsockname()[1]
    served = tmp_path / "served"
    bare(served / "status.git")
    daemon = Daemon(served, port)
    root = make_fleet(tmp_path / "plain", plain=True, address="10.244.0.1")
    cfg = with_status(node_config(tmp_path / "config.yaml", "n1"), daemon.url)
    state = tmp_path / "state"
    try:
        with throwaway_netns() as ns:
            base = ("--netns", ns, "--config", str(cfg))
            t0 = time.monotonic()
            p = nftrec(state, "apply", str(root), *base)
            took = time.monotonic() - t0
            assert p.returncode == 0, p.stderr
            assert "Apply complete" in p.stdout and "status records kept queued (1)" in p.stderr
            assert took < SEND_BOUND + 5, took  # apply itself takes about a second
            queue = next(state.rglob("status-queue"))
            assert len(list(queue.glob("0*.json"))) == 1
            hole.close()
            daemon.start()
            set_endpoint(root, "10.244.0.2")
            p = nftrec(state, "apply", str(root), *base)
            assert p.returncode == 0 and "kept queued" not in p.stderr, p.stderr
            assert list(queue.glob("0*.json")) == []
            records = log_of(served / "status.git", "n1")
            assert [r.outcome for r in records] == ["applied", "applied"]
            assert records[0].attempted != records[1].attempted == status(state, ns, cfg)["lastAppliedRevision"]
    finally:
        hole.close()
        daemon.stop()


@pytest.mark.kernel
def test_a_saved_plan_follows_the_rollout_and_the_hold(tmp_path):
    """`apply --plan` applies a new revision: held by its wave (exit 3, the kernel
    unchanged) as `apply DIR` is, --ignore-rollout overrides; the local hold holds it too,
    --ignore-hold overrides; a plan that recorded no rollout (an older nftrec's) is refused
    unless --ignore-rollout; once the wave opens (the clock 2h on), the plan applies."""
    from reconciler.engine import planfile

    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    saved = tmp_path / "p.json"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        set_endpoint(root, "10.244.0.2")
        p = nftrec(state, "plan", str(root), *base, "--out", str(saved))
        assert p.returncode == 0 and "held: wave rest opens at" in p.stderr, p.stderr
        assert json.loads(saved.read_text())["rollout"]["fleet"].startswith("apiVersion: nftrec/v1alpha1")

        p = nftrec(state, "apply", "--plan", str(saved), *base)
        assert p.returncode == 3 and "held: wave rest opens at" in p.stderr, p.stderr
        assert "10.244.0.2" not in _vip_endpoint(ns)
        assert status(state, ns, cfg)["rollout"]["state"] == "held"

        assert nftrec(state, "hold", "--netns", ns, "--reason", "window").returncode == 0
        p = nftrec(state, "apply", "--plan", str(saved), *base, "--ignore-rollout")
        assert p.returncode == 3 and "held locally: window" in p.stderr, p.stderr

        old = tmp_path / "old.json"
        planfile.save(replace(planfile.load(saved), rollout=None), old)
        p = nftrec(state, "apply", "--plan", str(old), *base, "--ignore-hold")
        assert p.returncode == 1 and "does not record its revision's rollout" in p.stderr, p.stderr
        assert "--ignore-rollout" in p.stderr and "10.244.0.2" not in _vip_endpoint(ns)

        p = nftrec(state, "apply", "--plan", str(saved), *base, "--ignore-hold", env={"NFTREC_CLOCK_OFFSET": "7200"})
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)


@pytest.mark.kernel
def test_a_saved_plan_ignoring_the_rollout_applies(tmp_path):
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    saved = tmp_path / "p.json"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        set_endpoint(root, "10.244.0.2")
        assert nftrec(state, "plan", str(root), *base, "--out", str(saved)).returncode == 0
        p = nftrec(state, "apply", "--plan", str(saved), *base, "--ignore-rollout")
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)


@pytest.mark.kernel
def test_a_rollback_meets_the_hold_not_the_waves(tmp_path):
    """`apply --rollback` is the emergency path back to a ruleset this node applied: a
    closed wave does not hold it; a local hold does (exit 3, the kernel unchanged),
    --ignore-hold overrides."""
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        set_endpoint(root, "10.244.0.2")
        assert nftrec(state, "apply", str(root), *base).returncode == 3  # its wave is closed
        assert nftrec(state, "apply", str(root), *base, "--ignore-rollout").returncode == 0
        p = nftrec(state, "apply", "--rollback", *base)
        assert p.returncode == 0, p.stderr  # no wave holds a rollback
        assert "10.244.0.1" in _vip_endpoint(ns) and "10.244.0.2" not in _vip_endpoint(ns)

        assert nftrec(state, "hold", "--netns", ns, "--reason", "window").returncode == 0
        p = nftrec(state, "apply", "--rollback", *base)
        assert p.returncode == 3 and "held locally: window" in p.stderr and "--ignore-hold" in p.stderr, p.stderr
        assert "10.244.0.1" in _vip_endpoint(ns) and "10.244.0.2" not in _vip_endpoint(ns)
        p = nftrec(state, "apply", "--rollback", *base, "--ignore-hold")
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)


@pytest.mark.kernel
def test_apply_after_cleanup_takes_a_held_revision_at_once(tmp_path):
    """`cleanup` leaves the node with nothing applied, so, as for a new node, the next
    apply takes the newest revision at once though its wave is not open (watch does the same)."""
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        set_endpoint(root, "10.244.0.2")
        assert nftrec(state, "apply", str(root), *base).returncode == 3  # held by its wave
        assert nftrec(state, "cleanup", *base).returncode == 0
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)
