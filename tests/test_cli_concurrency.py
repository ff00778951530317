"""Concurrency and crashes: the namespace lock, racing applies, `kill -9` mid-apply.

Same rules as test_cli_kernel.py: a throwaway namespace, a temp state dir, nftrec as a
subprocess. What must hold (SPEC §5, §8): one nftrec at a time per state dir and
namespace, and the kernel always holds exactly one whole ruleset — the old or the new
one, never a mix — with state files that are readable or reported as corrupt.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nsutil import in_ns
from test_cli_kernel import CONFIG, NFTREC, nftrec, ok, ruleset

pytestmark = pytest.mark.kernel


def generate(d: Path, n: int, variant: int) -> Path:
    """`n` ClusterIP Services with 2-3 endpoints each; `variant` moves every endpoint
    (and gives every 7th Service a NodePort), so two variants differ in every Service."""
    d.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(n):
        ip = f"10.96.{1 + i // 250}.{1 + i % 250}"
        name = f"svc-{i:04d}"
        nodeport = variant == 1 and i % 7 == 0
        port = f"[{{name: http, port: 80, targetPort: 8080{', nodePort: %d' % (30000 + i) if nodeport else ''}}}]"
        docs.append(f"""\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: gen}}
spec:
  type: {'NodePort' if nodeport else 'ClusterIP'}
  clusterIP: {ip}
  ports: {port}
""")
        eps = "\n".join(f"  - addresses: [10.{100 + 10 * variant + k}.{i // 250}.{i % 250 + 1}]"
                        for k in range(2 + (i + variant) % 2))
        docs.append(f"""\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: gen
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
{eps}
""")
    (d / "services.yaml").write_text("---\n".join(docs))
    return d


def matches(d: Path, state: Path, ns: str) -> bool:
    """Does the kernel hold exactly the ruleset of `d`? (plan --refresh, detailed exit)"""
    p = nftrec("plan", str(d), "--refresh", "--detailed-exitcode", "-o", "json", state=state, ns=ns)
    assert p.returncode in (0, 2), p.stderr
    doc = json.loads(p.stdout)
    assert doc["changed"] == (p.returncode == 2)
    return p.returncode == 0


def start_apply(d: Path, state: Path, ns: str) -> subprocess.Popen:
    return subprocess.Popen(
        [NFTREC, "--state-dir", str(state), "apply", str(d), "--netns", ns, "--config", str(CONFIG)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture
def state(tmp_path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Two sizeable inputs, A and B, that differ in every Service."""
    root = tmp_path_factory.mktemp("big")
    return generate(root / "a", 300, 0), generate(root / "b", 300, 1)


# --- the lock ----------------------------------------------------------------------------------


def test_apply_fails_fast_naming_the_lock_holder(netns, state, big):
    from reconciler.engine.lock import Lock
    from reconciler.engine.state import StateStore

    a, _ = big
    lock = Lock(StateStore(state, netns=netns, table="nftrec").lock_path).acquire()
    try:
        for args in (("apply", str(a)), ("cleanup",), ("apply", "--rollback")):
            t0 = time.monotonic()
            p = nftrec(*args, state=state, ns=netns)
            ok(p, 1)
            assert time.monotonic() - t0 < 10, "a blocked apply must fail fast, not wait"
            assert f"pid {os.getpid()}" in p.stderr, p.stderr
            assert "holds" in p.stderr, p.stderr
        assert in_ns(netns, "nft", "list", "tables").stdout == ""
        # Read-only commands do not need the lock.
        ok(nftrec("plan", str(a), "--detailed-exitcode", state=state, ns=netns), 2)
    finally:
        lock.release()
    ok(nftrec("apply", str(a), state=state, ns=netns))
    assert matches(a, state, netns)


def test_lock_is_per_namespace(netns, state, big, tmp_path):
    """Holding another namespace's lock in the same state dir does not block this one."""
    from reconciler.engine.lock import Lock
    from reconciler.engine.state import StateStore

    a, _ = big
    other = StateStore(state, netns="some-other-ns", table="nftrec").lock_path
    with Lock(other):
        ok(nftrec("apply", str(a), state=state, ns=netns))


def test_racing_applies_one_wins_or_both_in_turn(netns, state, big):
    a, b = big
    outcomes = []
    for _ in range(3):
        procs = [start_apply(a, state, netns), start_apply(b, state, netns)]
        results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        for rc, _out, err in results:
            assert "Traceback" not in err, err
            assert rc in (0, 1), err
            if rc == 1:
                assert "holds" in err and "pid" in err, err
        rcs = [r[0] for r in results]
        assert 0 in rcs, results
        in_a, in_b = matches(a, state, netns), matches(b, state, netns)
        assert in_a != in_b, "the kernel must hold exactly A or exactly B"
        if rcs == [0, 1]:
            assert in_a
        elif rcs == [1, 0]:
            assert in_b
        outcomes.append(tuple(rcs))
        ok(nftrec("status", state=state, ns=netns))
    print("race outcomes:", outcomes)


# --- kill -9 mid-apply ---------------------------------------------------------------------------


def test_kill_9_mid_apply_leaves_old_or_new_ruleset(netns, state, big):
    a, b = big
    rng = random.Random(int(os.environ.get("NFTREC_TEST_SEED", "4")))
    t0 = time.monotonic()
    ok(nftrec("apply", str(a), state=state, ns=netns))
    full = time.monotonic() - t0  # how long a whole apply takes here
    current = a
    seen = {"old": 0, "new": 0}
    deadline = time.monotonic() + 75
    for i in range(15):
        if time.monotonic() > deadline:
            break
        target = b if current is a else a
        p = start_apply(target, state, netns)
        time.sleep(rng.uniform(0, max(0.3, full * 1.1)))
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
        in_a, in_b = matches(a, state, netns), matches(b, state, netns)
        assert in_a != in_b, f"iteration {i}: the kernel holds neither A nor B (a half ruleset)"
        now = a if in_a else b
        seen["new" if now is target else "old"] += 1
        current = now
        # The state is readable or reported as corrupt, never a traceback; then an apply
        # of what the kernel holds repairs everything and status is clean.
        for path in state.rglob("*.json"):
            if ".tmp-" not in path.name and ".corrupt-" not in path.name:
                json.loads(path.read_text())
        st = nftrec("status", state=state, ns=netns)
        assert st.returncode in (0, 2), st.stderr
    ok(nftrec("apply", str(current), state=state, ns=netns))
    ok(nftrec("status", state=state, ns=netns))
    leftovers = [p for p in state.rglob("*") if ".tmp-" in p.name]
    assert leftovers == [], leftovers  # a successful apply sweeps interrupted writes
    print(f"kill -9 outcomes: {seen} (full apply {full:.2f}s)")


def test_kill_9_between_commit_and_state_write_is_repaired(netns, state, big):
    """The worst moment: the kernel has B, the state still says A. status reports drift
    (exit 2), plan of B is clean, apply of B records it."""
    from reconciler.engine.state import StateStore

    a, b = big
    ok(nftrec("apply", str(a), state=state, ns=netns))
    store = StateStore(state, netns=netns, table="nftrec")
    saved = {p: p.read_bytes() for p in store.dir.rglob("*.json*")}
    ok(nftrec("apply", str(b), state=state, ns=netns))
    for p in list(store.dir.rglob("*.json*")):  # roll the state files back to "A applied"
        if p not in saved:
            p.unlink()
    for p, data in saved.items():
        p.write_bytes(data)
    before = ruleset(netns)
    ok(nftrec("status", state=state, ns=netns), 2)
    assert matches(b, state, netns) and not matches(a, state, netns)
    # plan without --refresh must not trust the recorded generation: it changed.
    ok(nftrec("plan", str(b), "--detailed-exitcode", state=state, ns=netns))
    ok(nftrec("plan", str(a), "--detailed-exitcode", state=state, ns=netns), 2)
    ok(nftrec("apply", str(b), state=state, ns=netns))
    assert ruleset(netns) == before
    ok(nftrec("status", state=state, ns=netns))
