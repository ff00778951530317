"""A staged rollout on the real kernel: six `nftrec watch` daemons, each in its own network
namespace with its own state directory and node config, read one git-sync layout
(tests/gitsync.py) of examples/fleet with a `rollout` of three waves a few seconds apart,
and push their status records to one bare repository (file://). Each stage is checked in
every kernel and with `nftrec fleet status --wait`, the gate CI runs between waves: the
canary first, then each wave when it opens; a revision failing the canary's health check
halts the later waves; `immediate` reaches every node at once; `hold` keeps one node back
until `release`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from gitsync import GitSync, push, remote
from nsutil import EXAMPLES, in_ns, throwaway_netns
from test_fleet_kernel import stop
from test_verify_signed import git
from watchproc import NFTREC, Watch

from reconciler.intake.rollout import bucket

pytestmark = pytest.mark.kernel

INTERVAL = 6  # seconds between two waves: long enough to see a wave wait, short enough to run
SALT = "kernel-test"
NODES = {  # inventory.yaml's six nodes; edge-lyon-1 is the canary ring
    "edge-lyon-1": {"site": "lyon", "tier": "edge", "ring": "canary"},
    "edge-lyon-2": {"site": "lyon", "tier": "edge"},
    "edge-lyon-3": {"site": "lyon", "tier": "edge"},
    "edge-paris-1": {"site": "paris", "tier": "edge"},
    "edge-paris-2": {"site": "paris", "tier": "edge"},
    "edge-paris-3": {"site": "paris", "tier": "edge"},
}
CANARY = "edge-lyon-1"
BAD_IP = "10.96.66.6"  # a Service with this ClusterIP fails every node's health check
MARKER = "10.96.7.{}"  # each revision's own ClusterIP: which revision a kernel holds


def waves_for(names) -> tuple[int, dict]:
    """The `early` wave's percent, and each node's wave computed here, independently of
    wave_of: the canary by its label, then two of the other five by bucket, the rest last."""
    others = sorted(n for n in names if n != CANARY)
    buckets = sorted(bucket(SALT, n) for n in others)
    assert len(set(buckets)) == len(buckets), f"salt {SALT!r} gives two nodes one bucket: {buckets}"
    percent = buckets[1] + 1
    return percent, {n: 0 if n == CANARY else (1 if bucket(SALT, n) < percent else 2) for n in names}


def fleet_yaml(src: Path, percent: int, *, immediate: bool = False) -> None:
    fleet = src / "fleet.yaml"
    text = fleet.read_text().split("rollout:")[0]
    fleet.write_text(text + f"rollout:\n  salt: {SALT}\n  interval: {INTERVAL}s\n  maxFailures: 0\n"
                     f"  immediate: {'true' if immediate else 'false'}\n  waves:\n"
                     "  - {name: canary, selector: {matchLabels: {ring: canary}}}\n"
                     f"  - {{name: early, percent: {percent}}}\n  - {{name: rest, percent: 100}}\n")


def marker(src: Path, n: int, *, bad: bool = False) -> None:
    """base/marker.yaml: one Service whose ClusterIP names revision n (and the bad one)."""
    docs = [f"apiVersion: v1\nkind: Service\nmetadata: {{name: marker, namespace: default}}\n"
            f"spec:\n  clusterIP: {MARKER.format(n)}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n"]
    if bad:
        docs.append(f"apiVersion: v1\nkind: Service\nmetadata: {{name: bad, namespace: default}}\n"
                    f"spec:\n  clusterIP: {BAD_IP}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n")
    (src / "base" / "marker.yaml").write_text("---\n".join(docs))


def commit(src: Path, message: str) -> tuple[str, int]:
    """The commit and its committer time, a whole second (the revision's time)."""
    when = int(time.time())
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", message, env={"GIT_COMMITTER_DATE": f"@{when} +0000"})
    return git(src, "rev-parse", "HEAD"), when


def node_config(tmp: Path, name: str, labels: dict, n: int, status_remote: str) -> Path:
    path = tmp / f"{name}.config.yaml"
    shown = ", ".join(f"{k}: {v}" for k, v in labels.items())
    path.write_text(f"apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: {name}\nnodeLabels: {{{shown}}}\n"
                    f"nodeIPs: [192.168.{n}.2]\nclusterCIDRs: [10.244.0.0/16]\nserviceCIDRs: [10.96.0.0/16]\n"
                    "minSyncPeriod: 0.1s\n"
                    f"healthChecks:\n  - cmd: \"! nft list table ip nftrec | grep -q {BAD_IP}\"\nhealthCheckTimeout: 2s\n"
                    f"status:\n  remote: {status_remote}\n")
    return path


@dataclass
class Node:
    name: str
    ns: str
    config: Path
    state: Path
    wave: int
    watch: Optional[Watch] = None

    def listing(self) -> str:
        return in_ns(self.ns, "nft", "list", "table", "ip", "nftrec", check=False).stdout

    def status_text(self) -> str:
        p = subprocess.run([NFTREC, "--state-dir", str(self.state), "status", "-o", "json", "--netns", self.ns,
                            "--config", str(self.config)], capture_output=True, text=True, timeout=60)
        return p.stdout


class Kernels:
    """Every node's kernel, polled together: when each one first held each tracked address,
    and (`never`) an address no kernel but the canary's (during its health check) may hold."""

    def __init__(self, nodes: dict):
        self.nodes, self.first, self.never = nodes, {}, None

    def track(self, ip: str) -> dict:
        self.first[ip] = {}
        return self.first[ip]

    def poll(self) -> None:
        for node in self.nodes.values():
            text, now = node.listing(), time.time()
            for ip, seen in self.first.items():
                if ip in text:
                    seen.setdefault(node.name, now)
            assert self.never is None or node.name == CANARY or self.never not in text, (node.name, text)

    def until(self, pred, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while True:
            self.poll()
            if pred():
                return
            if time.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.first}; logs:\n"
                                     + "".join(line for n in self.nodes.values() for line in n.watch.raw[-20:]))
            time.sleep(0.1)


def gate(status_remote: str, revision: str, wave: str, timeout: str) -> subprocess.Popen:
    """`nftrec fleet status --wait`, started now and read later (the kernels are polled meanwhile)."""
    return subprocess.Popen([NFTREC, "fleet", "status", status_remote, "--revision", revision, "--wait", wave,
                             "--timeout", timeout], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def exits(proc: subprocess.Popen, code: int, what: str) -> None:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, f"{what}: fleet status --wait exited {proc.returncode}, not {code}:\n{out}"


def test_six_nodes_stage_halt_revert_and_hold(tmp_path):
    """One fleet, six kernels: the canary first, each wave at its opening (never before), a
    canary failure halting the later waves, an `immediate` revert everywhere at once, a
    local hold until release; `fleet status --wait` exits 0, 1 or 2 at each stage. Kernels
    are polled together all along, with bounds; the waits are the waves' own intervals."""
    percent, waves = waves_for(NODES)
    src = tmp_path / "src"
    shutil.copytree(EXAMPLES / "fleet", src)
    fleet_yaml(src, percent)
    marker(src, 0)
    git(src, "init", "-q", "-b", "main")
    first, _ = commit(src, "fleet with a rollout")
    bare = remote(tmp_path, src)
    status_bare = tmp_path / "status.git"
    git(tmp_path, "init", "-q", "--bare", str(status_bare))
    status_remote = f"file://{status_bare}"
    gs = GitSync(tmp_path / "git-sync", bare)
    assert gs.sync("main") == first

    def publish(message: str) -> tuple[str, int]:
        rev, when = commit(src, message)
        push(src, bare)
        assert gs.sync("main") == rev
        return rev, when

    with contextlib.ExitStack() as stack:
        nodes = {}
        for n, (name, labels) in enumerate(NODES.items()):
            ns = stack.enter_context(throwaway_netns())
            nodes[name] = Node(name, ns, node_config(tmp_path, name, labels, n + 1, status_remote),
                               tmp_path / f"state-{name}", waves[name])
        kernels = Kernels(nodes)
        late = [n for n in nodes.values() if n.wave > 0]
        last = [n for n in nodes.values() if n.wave == 2]
        try:
            # a node that has applied nothing applies at once, whatever its wave
            seen = kernels.track(MARKER.format(0))
            for node in nodes.values():
                node.watch = Watch(node.ns, gs.current, node.config, node.state, "--debounce", "0.05", metrics=False)
            kernels.until(lambda: len(seen) == len(nodes), 60, "the first revision everywhere")
            exits(gate(status_remote, first, "rest", "60s"), 0, "the first revision")

            # 1. a staged revision: the canary first, then each wave when it opens, never before
            seen = kernels.track(MARKER.format(1))
            marker(src, 1)
            second, t = publish("marker 1")
            gates = [gate(status_remote, second, "canary", "30s"), gate(status_remote, second, "rest", "1s")]
            kernels.until(lambda: CANARY in seen, 30, "the canary to take it")
            assert set(seen) == {CANARY}, seen
            assert time.time() < t + 2 * INTERVAL - 2, "too slow to see the last wave wait"
            for node in last:  # held, and says so
                assert "held" in node.status_text() and MARKER.format(1) not in node.listing(), node.name
            kernels.until(lambda: len(seen) == len(nodes), 2 * INTERVAL + 30, "every wave to take it")
            for name, when in seen.items():
                opening = t + waves[name] * INTERVAL
                assert opening <= when < opening + INTERVAL, (name, waves[name], when - t)
            exits(gates[0], 0, "the canary applied")
            exits(gates[1], 2, "the last wave before it opens")
            for wave in ("early", "rest"):
                exits(gate(status_remote, second, wave, "30s"), 0, f"wave {wave} applied")

            # 2. a revision failing the canary's health check: rolled back there; the later waves
            # halt (maxFailures: 0) and keep marker 1, past every opening
            kernels.never = BAD_IP
            seen = kernels.track(MARKER.format(2))
            marker(src, 2, bad=True)
            third, t = publish("marker 2 and the bad Service")
            exits(gate(status_remote, third, "canary", "30s"), 1, "the canary rolled back")
            kernels.until(lambda: time.time() > t + 2 * INTERVAL + 2, 3 * INTERVAL + 10, "past the last opening")
            for node in late:
                node.watch.wait(lambda node=node: "halted" in node.status_text(), timeout=30,
                                what=f"{node.name} to say halted")
            kernels.poll()
            assert set(seen) <= {CANARY} and BAD_IP not in nodes[CANARY].listing(), seen
            assert all(MARKER.format(1) in n.listing() for n in late)
            exits(gate(status_remote, third, "early", "2s"), 2, "halted is held, not failed")

            # 3. the revert with `immediate`: every node at once, the halted ones included
            kernels.never = None
            seen = kernels.track(MARKER.format(3))
            marker(src, 3)
            fleet_yaml(src, percent, immediate=True)
            fourth, t = publish("revert, to every node at once")
            kernels.until(lambda: len(seen) == len(nodes), INTERVAL + 10, "the revert everywhere")
            assert max(seen.values()) < t + INTERVAL, {n: w - t for n, w in seen.items()}  # before wave 1 opens
            assert all(BAD_IP not in n.listing() for n in nodes.values())
            exits(gate(status_remote, fourth, "rest", "30s"), 0, "the revert applied")

            # 4. a local hold keeps one node back (immediate still on) until `release`
            held = last[0]
            subprocess.run([NFTREC, "--state-dir", str(held.state), "hold", "--netns", held.ns, "--reason",
                            "kernel test"], check=True, capture_output=True, timeout=60)
            seen = kernels.track(MARKER.format(4))
            marker(src, 4)
            fifth, t = publish("marker 4")
            kernels.until(lambda: len(seen) == len(nodes) - 1, 30, "every node but the held one")
            held.watch.wait(lambda: "hold" in held.status_text(), timeout=30, what="status naming the hold")
            exits(gate(status_remote, fifth, "rest", "2s"), 2, "a node of the wave held")
            kernels.poll()
            assert held.name not in seen and MARKER.format(3) in held.listing(), seen
            subprocess.run([NFTREC, "--state-dir", str(held.state), "release", "--netns", held.ns], check=True,
                           capture_output=True, timeout=60)
            kernels.until(lambda: held.name in seen, 30, "the released node")
            exits(gate(status_remote, fifth, "rest", "30s"), 0, "every node applied after the release")
        finally:
            stopped = [stop(node) for node in nodes.values() if node.watch is not None]
        assert all(s == 0 for s in stopped), stopped
