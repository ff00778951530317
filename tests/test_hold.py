"""The local hold (`nftrec hold`, `nftrec release`) and one-shot `apply` under a fleet's
rollout: the hold file in the namespace's state directory, its end by itself (the clock
set in-process, NFTREC_CLOCK_OFFSET for the command), and on the real kernel in a network
namespace: a held apply exits 3 and changes nothing, --ignore-hold / --ignore-rollout
override, `status` says why, `plan` says what apply would do.
"""

from __future__ import annotations

import json

import pytest

from nsutil import in_ns, throwaway_netns
from rolloutfleet import make_fleet, nftrec, node_config, set_endpoint, status
from reconciler import clock
from reconciler.engine import hold_path, parse_until, read_hold
from reconciler.engine.holds import parse_time, rfc3339

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


@pytest.fixture
def fixed_clock():
    t = [NOW]
    clock.set_clock(lambda: t[0])
    yield t
    clock.set_clock(None)


def test_until_takes_a_duration_or_an_rfc3339_time_ahead():
    assert parse_until("2h", NOW) == NOW + 7200
    assert parse_until("90m", NOW) == NOW + 5400
    assert parse_until(rfc3339(NOW + 60), NOW) == NOW + 60
    assert parse_until("2027-01-15T10:00:00+01:00", NOW) == NOW + 3600
    for bad in ("2027-01-15T09:00:00+01:00",  # now, in another zone: not ahead
                "2027-01-15T07:00:00Z", "tomorrow", "2027-01-15 08:00", "-5m", ""):
        with pytest.raises(ValueError):
            parse_until(bad, NOW)
    assert parse_time("2027-01-15T08:00:00Z") == NOW


def test_hold_and_release_are_durable_and_a_hold_with_until_ends_by_itself(tmp_path, fixed_clock):
    """The CLI writes hold.json for the namespace status reads; `--until` ends it, with the
    command's clock moved by NFTREC_CLOCK_OFFSET and this process's by set_clock."""
    state = tmp_path / "state"
    p = nftrec(state, "hold", "--until", "2h", "--reason", "site maintenance")
    assert p.returncode == 0, p.stderr
    assert "held locally: site maintenance (until" in p.stdout
    hold = read_hold(state, None)
    assert hold.reason == "site maintenance" and hold.until is not None
    fixed_clock[0] = hold.until - 1
    assert hold.active(clock.now())
    fixed_clock[0] = hold.until
    assert not hold.active(clock.now())  # it ended by itself: nothing to release
    assert hold_path(state, None).exists()
    p = nftrec(state, "hold", "--until", "2026-01-01T00:00:00Z")  # in the past
    assert p.returncode == 64 and "not in the future" in p.stderr
    p = nftrec(state, "release")
    assert p.returncode == 0 and not hold_path(state, None).exists()
    assert read_hold(state, None) is None
    assert nftrec(state, "release").stdout.startswith("no local hold")


def test_a_damaged_hold_file_holds_and_says_how_to_remove_it(tmp_path, fixed_clock):
    path = hold_path(tmp_path, "ns1")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    hold = read_hold(tmp_path, "ns1")
    assert hold.active(NOW) and "nftrec release" in hold.reason
    path.write_text(json.dumps({"reason": 3, "since": "x", "until": None}))
    assert read_hold(tmp_path, "ns1").active(NOW)


def test_a_hold_and_its_release_between_two_polls_still_wake_the_watch(tmp_path):
    """The sync reads hold.json itself, so it can hold a revision on a hold that the
    watch's poll of the file never saw; when the release also falls between two polls,
    the poll sees no change from its last look, yet the held revision must be decided
    again (else it waits for the next full sync)."""
    import threading
    import time
    from types import SimpleNamespace

    from reconciler.daemon.rollout import HOLD_POLL, RolloutWatch

    target = SimpleNamespace(state_root=tmp_path, netns="ns1")
    daemon = SimpleNamespace(target=target, config=SimpleNamespace(status=None), store=SimpleNamespace(dir=tmp_path))
    watch = RolloutWatch.__new__(RolloutWatch)  # no Gate or state store: the hold file's thread alone
    watch.daemon, watch.channel, watch.held, watch._thread = daemon, None, None, None
    watch.halt = SimpleNamespace(stop=lambda: None)  # no halt check's read to stop
    watch._stop, watch._hold_file = threading.Event(), hold_path(tmp_path, "ns1")
    watch._hold_file.parent.mkdir(parents=True)
    runs = []
    watch.start(lambda: runs.append(time.monotonic()))
    try:
        time.sleep(HOLD_POLL / 2)
        watch._hold_file.write_text("{}")  # `nftrec hold`; a sync reads it and holds the revision
        watch.held, watch.decided_key = object(), watch._hold_key()
        watch._hold_file.unlink()  # `nftrec release`, before the next poll
        time.sleep(HOLD_POLL * 2.5)
        assert runs, "the release was never noticed"
        watch.decided_key = watch._hold_key()  # the sync decided again: no more runs asked
        runs.clear()
        time.sleep(HOLD_POLL * 2.5)
        assert runs == []
    finally:
        watch.stop()


def test_jitter_is_the_same_for_a_node_name_and_spreads_a_fleet_over_a_tenth_of_the_interval():
    from reconciler.engine import jitter

    names = [f"edge-{i:03d}" for i in range(1000)]
    delays = [jitter(n, 1800.0, "wave") for n in names]
    assert delays == [jitter(n, 1800.0, "wave") for n in names]  # reproducible
    assert all(0 <= d < 180.0 for d in delays)
    buckets = [0] * 10
    for d in delays:
        buckets[int(d // 18.0)] += 1
    assert min(buckets) > 60  # spread, not bunched (100 expected per tenth)
    assert jitter("edge-001", 60.0, "poll") != jitter("edge-001", 60.0, "wave")


def _vip_endpoint(ns: str) -> str:
    return "".join(in_ns(ns, "nft", "list", "table", "ip", "nftrec").stdout)


@pytest.mark.kernel
def test_apply_respects_the_hold_and_the_rollout_and_the_flags_override(tmp_path):
    """A node of the `rest` wave (interval 1h): the first apply goes in at once (nothing
    applied); a new revision is held by its wave (exit 3, the kernel unchanged, status and
    plan say so); a local hold holds it too; --ignore-rollout alone still meets the hold,
    --ignore-hold with it applies. A hold whose --until passed (NFTREC_CLOCK_OFFSET) no
    longer holds."""
    root = make_fleet(tmp_path / "fleet", interval="1h", address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "edge-2")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 0, p.stderr
        assert "10.244.0.1" in _vip_endpoint(ns)
        first = status(state, ns, cfg)["lastAppliedRevision"]

        set_endpoint(root, "10.244.0.2")
        p = nftrec(state, "plan", str(root), *base)
        assert p.returncode == 0 and "held: wave rest opens at" in p.stderr, p.stderr
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 3, p.stderr
        assert "held: wave rest opens at" in p.stderr and "--ignore-rollout" in p.stderr
        assert "10.244.0.2" not in _vip_endpoint(ns)
        st = status(state, ns, cfg)
        assert st["lastAppliedRevision"] == first and st["lastError"].startswith("held: wave rest")
        assert st["rollout"]["state"] == "held" and st["rollout"]["wave"] == "rest" and st["rollout"]["opensAt"]

        assert nftrec(state, "hold", "--netns", ns, "--reason", "window", "--until", "2h").returncode == 0
        p = nftrec(state, "apply", str(root), *base, "--ignore-rollout")
        assert p.returncode == 3 and "held locally: window" in p.stderr, p.stderr
        st = status(state, ns, cfg)
        assert st["hold"]["reason"] == "window" and st["hold"]["active"] is True
        assert "10.244.0.2" not in _vip_endpoint(ns)

        # the hold ended (the clock 3h ahead); the wave (1h after first seen) opened too
        p = nftrec(state, "apply", str(root), *base, env={"NFTREC_CLOCK_OFFSET": str(3 * 3600)})
        assert p.returncode == 0, p.stderr
        assert "10.244.0.2" in _vip_endpoint(ns)

        set_endpoint(root, "10.244.0.3")
        assert nftrec(state, "apply", str(root), *base).returncode == 3  # hold active again (real clock)
        p = nftrec(state, "apply", str(root), *base, "--ignore-rollout", "--ignore-hold")
        assert p.returncode == 0, p.stderr
        assert "10.244.0.3" in _vip_endpoint(ns)
        st = status(state, ns, cfg)
        assert st["lastError"] is None and "rollout" not in st


@pytest.mark.kernel
def test_a_plain_directory_under_a_hold_is_held_and_the_applied_revision_is_repaired(tmp_path):
    """No fleet: only the hold. The applied revision itself is applied again (a repair of a
    flushed table), a new one is not."""
    root = make_fleet(tmp_path / "plain", plain=True, address="10.244.0.1")
    cfg = node_config(tmp_path / "config.yaml", "n1")
    state = tmp_path / "state"
    with throwaway_netns() as ns:
        base = ("--netns", ns, "--config", str(cfg))
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        assert nftrec(state, "hold", "--netns", ns).returncode == 0
        in_ns(ns, "nft", "flush", "table", "ip", "nftrec")
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 0, p.stderr
        assert "10.244.0.1" in _vip_endpoint(ns)
        set_endpoint(root, "10.244.0.9")
        p = nftrec(state, "apply", str(root), *base)
        assert p.returncode == 3 and "held locally" in p.stderr and "until `nftrec release`" in p.stderr
        assert "10.244.0.9" not in _vip_endpoint(ns)
        assert nftrec(state, "release", "--netns", ns).returncode == 0
        assert nftrec(state, "apply", str(root), *base).returncode == 0
        assert "10.244.0.9" in _vip_endpoint(ns)
