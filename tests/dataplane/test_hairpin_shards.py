"""hairpin-connections shards on demand (layout sharded, compile/layout.py): a shard's set,
its chain and its dispatch vmap element exist only while the set holds an element. The
first local endpoint of a shard creates them, the last one's removal deletes them, in one
transaction, through `nftrec apply` (one-shot, patched from the last applied ruleset)
and through `nftrec watch` (a partial sync); a hairpin connection is masqueraded before
and after, and a connection that is not hairpin is not; an edit that moves the only
endpoint of a shard to another removes one shard and creates the other.

EP4 = 10.244.1.10 / .11 / .12: shards 0a / 0b / 0c (the address's low six bits).
Every probe is also traced against the live table (trace_check.py)."""

from __future__ import annotations

import subprocess

import pytest

from dp_topology import EP4, NODE_BE4, NODE_NAME, POD4
from test_kube_proxy_semantics import peers, servers
from test_wire import CONFIG_YAML, NFTREC, Watch, write_atomically
from reconciler.kernel.live import read_live
from reconciler.kernel import Libnftables

pytestmark = pytest.mark.dataplane

VIPS = {"a": "10.96.0.90", "b": "10.96.0.91"}


def service_yaml(name: str) -> str:
    return f"""\
apiVersion: v1
kind: Service
metadata: {{name: self-{name}, namespace: default}}
spec:
  type: ClusterIP
  clusterIP: {VIPS[name]}
  ports:
    - {{name: http, protocol: TCP, port: 80, targetPort: 8080}}
"""


def slice_yaml(name: str, endpoints: tuple[str, ...]) -> str:
    eps = "".join(f"  - addresses: [{ip}]\n    nodeName: {NODE_NAME}\n" for ip in endpoints) or "  []\n"
    return f"""\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: self-{name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: self-{name}}}
addressType: IPv4
ports:
  - {{name: http, protocol: TCP, port: 8080}}
endpoints:
{eps}"""


def live_shards(dp) -> tuple[set, set, dict]:
    """(shard sets, shard chains, dispatch vmap {key: verdict}) of the live ip table."""
    nft = Libnftables(dp.node)
    try:
        t = read_live(nft, "nftrec").tables["ip"]
    finally:
        nft.close()
    sets = {n for n in t.sets if n.startswith("hairpin-connections-")}
    chains = {n for n in t.chains if n.startswith("hairpin-")}
    vmap = {e.key[0]: e.value for e in t.sets["hairpin-shards"].elements.values()}
    return sets, chains, vmap


def assert_shards(dp, *shards: str) -> None:
    """Exactly these shards (two hex digits each) exist, each whole."""
    sets, chains, vmap = live_shards(dp)
    assert sets == {f"hairpin-connections-{x}" for x in shards}
    assert chains == {f"hairpin-{x}" for x in shards}
    assert vmap == {f"0.0.0.{int(x, 16)}": f"goto hairpin-{x}" for x in shards}


def hairpin(dp, name: str, ep: str) -> None:
    """From Service `name`'s only endpoint `ep` to the Service, landing on itself: the
    connection is masqueraded to the node. (An endpoint reaching *another* endpoint is
    not tried: all EP4 live in one namespace, so its reply would bypass the node.)"""
    dp.flush_conntrack()
    res = dp.probe("backend", VIPS[name], 80, src=ep, count=4)
    assert servers(res) == {ep: 4} and peers(res) == {NODE_BE4}, res


def not_hairpin(dp, name: str, ep: str) -> None:
    """From a pod to the Service: not masqueraded (the source is in clusterCIDRs)."""
    res = dp.probe("pod", VIPS[name], 80, count=4)
    assert servers(res) == {ep: 4} and peers(res) == {POD4}, res


def steps(dp, go) -> None:
    """From two Services without endpoints: the first endpoint of shard 0a (a), the first
    of shard 0b (b), the last of 0a gone (a), b's only endpoint moved from 0b to 0c.
    `go(name, endpoints)` makes the node hold the Service's new EndpointSlice."""
    go("a", (EP4[0],))
    assert_shards(dp, "0a")
    hairpin(dp, "a", EP4[0])
    not_hairpin(dp, "a", EP4[0])

    go("b", (EP4[1],))
    assert_shards(dp, "0a", "0b")
    hairpin(dp, "b", EP4[1])
    hairpin(dp, "a", EP4[0])

    go("a", ())
    assert_shards(dp, "0b")
    hairpin(dp, "b", EP4[1])

    go("b", (EP4[2],))
    assert_shards(dp, "0c")
    hairpin(dp, "b", EP4[2])
    not_hairpin(dp, "b", EP4[2])


def manifests(tmp_path):
    m, cfg = tmp_path / "m", tmp_path / "config.yaml"
    m.mkdir()
    cfg.write_text(CONFIG_YAML)
    for name in VIPS:
        write_atomically(m / f"self-{name}.yaml", service_yaml(name))
        write_atomically(m / f"self-{name}-slice.yaml", slice_yaml(name, ()))
    return m, cfg, tmp_path / "state"


def test_apply_creates_and_removes_shards(dp, tmp_path):
    m, cfg, state = manifests(tmp_path)
    ops = []

    def go(name, endpoints):
        write_atomically(m / f"self-{name}-slice.yaml", slice_yaml(name, endpoints))
        for cmd in ("plan", "apply"):  # plan -v: the transaction apply then commits
            p = subprocess.run([NFTREC, "--state-dir", str(state), cmd, str(m), "--config", str(cfg),
                                "--netns", dp.node] + (["-v"] if cmd == "plan" else []),
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            if cmd == "plan":
                ops.append([line.strip() for line in p.stdout.splitlines() if line.startswith("  ")])

    go("a", ())  # the cold apply: two Services, no endpoints, no shard
    assert_shards(dp)
    steps(dp, go)
    # the edits' transactions: a shard's set, chain and vmap element come and go together
    second, third, fourth = ops[2], ops[3], ops[4]
    # a new chain is declared once, with its rule (engine/changes.transaction_for)
    assert any(op.startswith("add chain ip nftrec hairpin-0b {") for op in second), second
    assert not any("hairpin-0a" in op for op in second), second
    assert any(op.startswith("add set ip nftrec hairpin-connections-0b ") and "elements =" in op for op in second)
    assert any("0.0.0.11 : goto hairpin-0b" in op for op in second), second
    assert removes(third, "0a") and not any("hairpin-0b" in op for op in third), third
    assert removes(fourth, "0b") and any(op.startswith("add chain ip nftrec hairpin-0c {") for op in fourth), fourth


def removes(ops: list[str], x: str) -> bool:
    """Whether `ops` removes shard x in the order the kernel needs: its chain flushed and
    its vmap element gone (the vmap flushed and re-declared, or the element deleted)
    before the set and then the chain are deleted."""
    def at(pred) -> int:
        return next((i for i, op in enumerate(ops) if pred(op)), -1)

    flush = at(lambda op: op == f"flush chain ip nftrec hairpin-{x}")
    vmap = at(lambda op: op == "flush map ip nftrec hairpin-shards"
              or op.startswith(f"delete element ip nftrec hairpin-shards {{ 0.0.0.{int(x, 16)} "))
    dset = at(lambda op: op == f"delete set ip nftrec hairpin-connections-{x}")
    dchain = at(lambda op: op == f"delete chain ip nftrec hairpin-{x}")
    return 0 <= flush < dset < dchain and 0 <= vmap < dchain


def test_watch_creates_and_removes_shards(dp, tmp_path):
    m, cfg, state = manifests(tmp_path)
    w = Watch(dp.node, m, cfg, state)
    kinds = []
    try:
        w.wait_event("sync", 0)
        assert_shards(dp)

        def go(name, endpoints):
            mark = len(w.lines)
            write_atomically(m / f"self-{name}-slice.yaml", slice_yaml(name, endpoints))
            s = w.wait_sync(mark)
            kinds.append((s["kind"], s["servicesChanged"]))

        steps(dp, go)
    finally:
        assert w.stop() == 0
    # the edit path: projections of the changed Service only
    assert kinds == [("partial", [f"~default/self-{n}"]) for n in "abab"], kinds
