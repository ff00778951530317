"""nodePortAddresses as kube-proxy reads it, proven with real packets: every address on
the node's interfaces inside the CIDRs accepts NodePorts, found by `nftrec apply` and
`nftrec watch` in the node namespace itself (not taken from nodeIPs), and `watch`
follows an address that appears while it runs, without any manifest change.

These run the real CLI (`--netns` = the topology's node namespace, a state directory
under tmp_path). Every address a test adds to the node is removed again in `finally`,
so the module's shared topology stays as dp_topology.py describes it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import watchproc

from dp_topology import CLUSTER_CIDR4, CLUSTER_CIDR6, EP4, NODE_IP4, NODE_IP6, NODE_NAME, \
    SERVICE_CIDR4, SERVICE_CIDR6, nsx

pytestmark = pytest.mark.dataplane

NFTREC = str(Path(sys.executable).with_name("nftrec"))
NODE_PORT = 30080
LAN = "198.51.100.128/25"  # the node's link to clientB: 198.51.100.129 is on it
SECONDARY = "198.51.100.131"  # added to that link by the tests
LATER = "198.51.100.132"  # added while watch runs
CLIENT_B_LINK = "n-cb"

MANIFESTS = f"""\
apiVersion: v1
kind: Service
metadata: {{name: np, namespace: default}}
spec:
  type: NodePort
  clusterIP: 10.96.0.40
  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-a
  namespace: default
  labels: {{kubernetes.io/service-name: np}}
addressType: IPv4
endpoints:
""" + "".join(f"  - addresses: [{ip}]\n    nodeName: {NODE_NAME}\n" for ip in EP4) + """\
ports: [{name: http, port: 8080, protocol: TCP}]
"""


def write_input(tmp_path: Path, node_port_addresses: str) -> tuple[Path, Path]:
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "np.yaml").write_text(MANIFESTS)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"""\
apiVersion: nftrec/v1alpha1
kind: NodeConfig
nodeName: {NODE_NAME}
nodeIPs: [{NODE_IP4}, "{NODE_IP6}"]
clusterCIDRs: [{CLUSTER_CIDR4}, "{CLUSTER_CIDR6}"]
serviceCIDRs: [{SERVICE_CIDR4}, "{SERVICE_CIDR6}"]
nodePortAddresses: {node_port_addresses}
minSyncPeriod: 0s
syncPeriod: 1s
fullSyncPeriod: 1h
""")
    return d, cfg


def nftrec(*args: str, tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [NFTREC, "--state-dir", str(tmp_path / "state"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"})


def nodeport_ips(dp) -> set[str]:
    text = nsx(dp.node, "nft", "list", "set", "ip", "nftrec", "nodeport-ips").stdout
    m = re.search(r"elements = \{([^}]*)\}", text)
    return {e.strip() for e in m.group(1).split(",")} if m else set()


def reached_endpoints(results) -> bool:
    """Every probe was answered, each by an endpoint (i.e. DNATed to the backends)."""
    return bool(results) and all(r.reply is not None and r.reply.server_ip in EP4 for r in results)


def errors(results) -> set[str]:
    return {r.error for r in results if r.error is not None}


def add_address(dp, ip: str) -> None:
    nsx(dp.node, "ip", "addr", "add", f"{ip}/25", "dev", CLIENT_B_LINK)


def del_address(dp, ip: str) -> None:
    nsx(dp.node, "ip", "addr", "del", f"{ip}/25", "dev", CLIENT_B_LINK, check=False)


def test_nodeport_on_a_secondary_address_inside_the_cidrs(dp, tmp_path):
    """nodePortAddresses [198.51.100.128/25]: `apply` lists the node's interfaces in its
    namespace; the secondary address .131 (not a nodeIP) and .129 accept the NodePort,
    the node IP 198.51.100.1 (outside the CIDR) does not."""
    d, cfg = write_input(tmp_path, f"[{LAN}]")
    add_address(dp, SECONDARY)
    try:
        p = nftrec("apply", str(d), "--config", str(cfg), "--netns", dp.node, tmp_path=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        listed = nodeport_ips(dp)
        assert listed == {"198.51.100.129", SECONDARY}, listed  # not NODE_IP4: outside the CIDR
        dp.flush_conntrack()
        res = dp.probe("clientB", SECONDARY, NODE_PORT, count=5)
        assert reached_endpoints(res), res
        res = dp.probe("clientB", "198.51.100.129", NODE_PORT, count=3)
        assert reached_endpoints(res), res
        # the node IP is outside nodePortAddresses: not DNATed, nothing listens there
        assert errors(dp.probe("clientA", NODE_IP4, NODE_PORT)) == {"refused"}
        # render has no kernel: nodeIPs stand in, and none of them is inside the CIDR
        r = nftrec("render", str(d), "--config", str(cfg), tmp_path=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("# nodeport-ips: render looks at no interface, so nodeIPs")
        assert "add element ip nftrec nodeport-ips" not in r.stdout
    finally:
        del_address(dp, SECONDARY)


def Watch(dp, d: Path, cfg: Path, tmp_path: Path) -> watchproc.Watch:
    return watchproc.Watch(dp.node, d, cfg, tmp_path / "state", metrics=False)


def test_address_added_while_watch_runs_becomes_reachable(dp, tmp_path):
    """An address inside nodePortAddresses appears on the node while `watch` runs: it
    accepts the NodePort within 1 s, through a partial sync that touches only
    nodeport-ips, with no manifest change; its removal is followed too; an address
    outside the CIDRs causes no sync; the idle daemon does not spin; SIGTERM stops it
    (address watcher included) with exit 0 and the rules in place."""
    d, cfg = write_input(tmp_path, f"[{LAN}]")
    w = Watch(dp, d, cfg, tmp_path)
    try:
        w.wait(lambda: w.syncs("full"), what="the first full sync")
        assert LATER not in nodeport_ips(dp)
        syncs_before = len(w.syncs())
        # idle: no file and no address event, the daemon must sleep, not poll
        cpu0 = w.cpu_seconds()
        time.sleep(2.0)
        assert w.cpu_seconds() - cpu0 < 0.2, "nftrec watch burns CPU while idle"

        t0 = time.monotonic()
        add_address(dp, LATER)
        w.wait(lambda: LATER in nodeport_ips(dp), timeout=5, what=f"{LATER} in nodeport-ips")
        latency = time.monotonic() - t0
        assert latency < 1.0, f"{LATER} reached nodeport-ips after {latency:.3f}s"
        print(f"address event -> kernel: {latency * 1000:.0f} ms")
        sync = w.wait(lambda: next((s for s in w.syncs()[syncs_before:]), None), what="the address sync")
        assert sync["kind"] == "partial" and sync["servicesChanged"] == [] and sync["operations"] == 1, sync
        assert f"+{LATER}" in sync["addresses"], sync
        dp.flush_conntrack()
        res = dp.probe("clientB", LATER, NODE_PORT, count=5)
        assert reached_endpoints(res), res

        # an address outside the CIDRs: nothing to do, no sync
        n = len(w.syncs())
        nsx(dp.node, "ip", "addr", "add", "192.0.2.77/32", "dev", CLIENT_B_LINK)
        try:
            time.sleep(0.6)
            assert len(w.syncs()) == n, w.syncs()[n:]
        finally:
            nsx(dp.node, "ip", "addr", "del", "192.0.2.77/32", "dev", CLIENT_B_LINK, check=False)

        del_address(dp, LATER)
        w.wait(lambda: LATER not in nodeport_ips(dp), timeout=5, what=f"{LATER} out of nodeport-ips")
        assert "198.51.100.129" in nodeport_ips(dp)
        assert len(w.syncs("full")) == 1, "an address event caused a full sync"
        assert w.stop() == 0
        assert not any("Traceback" in line for line in w.raw), "".join(w.raw)
        assert "198.51.100.129" in nodeport_ips(dp)  # the rules stay in place
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
        del_address(dp, LATER)
