"""`nftrec trace --kernel` with real packets: a Docker-style FORWARD policy drop on the node
breaks a ClusterIP whose endpoint sits behind the node's forward path, the kernel's trace
shows nftrec's DNAT to the endpoint and then the drop by `ip filter FORWARD`'s policy, and
the DOCKER-USER-style accept brings the connection back. No tracing table outlives a run:
not after an exit, not after SIGINT, and not after SIGKILL once the next command ran.

These run the real CLI in the topology's node namespace (dp_topology.py), with a client in
clientA that keeps retrying while the trace waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dp_topology import (CLIENT_A4, CLIENT_A6, CLUSTER_CIDR4, CLUSTER_CIDR6, EP4, EP6, NODE_IP4, NODE_IP6, NODE_NAME,
                         PROBE, SERVICE_CIDR4, SERVICE_CIDR6, nsx, nsx_args)
from test_nodeport_addresses import NFTREC, nftrec

pytestmark = pytest.mark.dataplane

PORT, TARGET_PORT = 80, 8080
# family -> (nft family, client address, Service, its ClusterIP, its endpoint)
CASES = {"IPv4": ("ip", CLIENT_A4, "web", "10.96.0.70", EP4[0]),
         "IPv6": ("ip6", CLIENT_A6, "web6", "fd00:96::70", EP6[0])}
MANIFESTS = "---\n".join(f"""\
apiVersion: v1
kind: Service
metadata: {{name: {svc}, namespace: default}}
spec: {{clusterIP: "{vip}", ipFamilies: [{fam}], ports: [{{name: http, port: {PORT}, targetPort: {TARGET_PORT}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {svc}-a, namespace: default, labels: {{kubernetes.io/service-name: {svc}}}}}
addressType: {fam}
endpoints: [{{addresses: ["{ep}"], nodeName: {NODE_NAME}}}]
ports: [{{name: http, port: {TARGET_PORT}, protocol: TCP}}]
""" for fam, (_, _, svc, vip, ep) in CASES.items())


def docker_forward(family: str) -> str:
    """What iptables-nft (ip6tables-nft) makes of Docker's `iptables -P FORWARD DROP` and its
    DOCKER-USER chain, jumped to first from FORWARD."""
    return f"""\
table {family} filter {{
    chain DOCKER-USER {{
    }}
    chain FORWARD {{
        type filter hook forward priority filter; policy drop;
        counter jump DOCKER-USER
    }}
}}
"""


def docker_user_accept(family: str) -> tuple[str, ...]:
    """The fix, as iptables says it: iptables -I DOCKER-USER -m conntrack --ctstate DNAT -j ACCEPT"""
    return ("add", "rule", family, "filter", "DOCKER-USER", "ct", "status", "dnat", "accept")


def write_input(tmp_path: Path) -> list[str]:
    """The manifests and node config; the arguments every nftrec command here takes."""
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "web.yaml").write_text(MANIFESTS)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f'apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: {NODE_NAME}\nnodeIPs: [{NODE_IP4}, "{NODE_IP6}"]\n'
                   f'clusterCIDRs: [{CLUSTER_CIDR4}, "{CLUSTER_CIDR6}"]\nserviceCIDRs: [{SERVICE_CIDR4}, "{SERVICE_CIDR6}"]\n')
    return [str(d), "--config", str(cfg)]


def trace_args(dp, *extra: str, case: str = "IPv4") -> list[str]:
    _, client, _, vip, _ = CASES[case]
    return ["trace", "--kernel", "--netns", dp.node, "--src", client, "--dst", vip, "--dport", str(PORT), *extra]


def tracing_tables(dp) -> list[str]:
    return re.findall(r"^table (\S+ nftrec-trace-\d+)$", nsx(dp.node, "nft", "list", "tables").stdout, re.M)


class RetryingClient:
    """A client in clientA that opens a new connection to the ClusterIP every 0.3 s (each
    waiting at most 0.5 s), until stopped: the packets a kernel trace waits for."""

    def __init__(self, dp, vip: str):
        loop = (f"while :; do {sys.executable} {PROBE} --dst {vip} --port {PORT} --timeout 0.5 "
                f">/dev/null; sleep 0.3; done")
        self.proc = subprocess.Popen(nsx_args(dp.ns["clientA"], "sh", "-c", loop), start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> "RetryingClient":
        return self

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the loop and its probe
        self.proc.wait(timeout=10)


def traced(dp, tmp_path: Path, case: str, *extra: str) -> subprocess.CompletedProcess:
    with RetryingClient(dp, CASES[case][3]):
        p = nftrec(*trace_args(dp, "--timeout", "20s", *extra, case=case), tmp_path=tmp_path)
    assert "Traceback" not in p.stderr, p.stderr
    assert tracing_tables(dp) == []  # removed on exit
    return p


@pytest.mark.parametrize("case", CASES)
def test_docker_forward_drop_is_traced_to_its_chain_and_the_dnat_before_it(dp, tmp_path, case):
    family, client, svc, vip, ep = CASES[case]
    endpoint = f"[{ep}]:{TARGET_PORT}" if ":" in ep else f"{ep}:{TARGET_PORT}"
    args = write_input(tmp_path)
    p = nftrec("apply", *args, "--netns", dp.node, tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [r.reply.server_ip for r in dp.probe("clientA", vip, PORT, count=3)] == [ep] * 3

    nsx(dp.node, "nft", "-f", "-", input=docker_forward(family))
    # nftrec's own trace evaluates only nftrec's table, and so predicts the DNAT, not this
    # drop: the probes below are not compared with it
    dp.hand_loaded = True
    try:
        assert {r.error for r in dp.probe("clientA", vip, PORT, count=2, timeout=0.5)} == {"timeout"}

        p = traced(dp, tmp_path, case, *args, "-o", "json")
        assert p.returncode == 0, p.stdout + p.stderr
        (pkt,) = json.loads(p.stdout)["packets"]
        assert (pkt["packet"]["src"], pkt["packet"]["dst"], pkt["packet"]["dport"]) == (client, vip, PORT)
        assert pkt["verdict"] == "drop"
        assert {k: pkt["decidedBy"][k] for k in ("family", "table", "chain", "kind", "verdict")} == \
            {"family": family, "table": "filter", "chain": "FORWARD", "kind": "policy", "verdict": "drop"}
        assert pkt["dnat"]["endpoint"] == endpoint and pkt["service"] == f"default/{svc}"
        assert pkt["dnat"]["by"]["table"] == "nftrec" and f"-default/{svc}/tcp/http" in pkt["dnat"]["by"]["chain"]
        path = pkt["path"]
        assert path.index(pkt["dnat"]["by"]) < path.index(pkt["decidedBy"])  # DNATed, then dropped

        p = traced(dp, tmp_path, case, *args)
        assert p.returncode == 0, p.stdout + p.stderr
        text = p.stdout
        assert f"verdict: DROPPED by the policy of {family} filter FORWARD" in text, text
        assert text.index(f"DNAT to {endpoint} (Service default/{svc})") < \
            text.index(f"{family} filter FORWARD: policy drop")
        assert f"service: default/{svc} (" in text and "web.yaml:" in text

        # doctor names the table, the chain and the fix, and warns only (exit 0)
        p = nftrec("doctor", "--netns", dp.node, tmp_path=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        drop = [x for x in p.stdout.splitlines()
                if x.startswith(f"warn forward drop: table {family} filter chain FORWARD has policy drop")]
        assert len(drop) == 1 and "DOCKER-USER" in drop[0], p.stdout

        nsx(dp.node, "nft", *docker_user_accept(family))
        assert [r.reply.server_ip for r in dp.probe("clientA", vip, PORT, count=3)] == [ep] * 3
        p = traced(dp, tmp_path, case, *args)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"verdict: ACCEPTED by {family} filter DOCKER-USER rule `ct status dnat accept`" in p.stdout, p.stdout
        # a connection's first packet is DNATed by nftrec's rule; a retransmitted SYN (a loaded
        # machine) belongs to a connection conntrack already translates: either way, to the endpoint
        assert f"after DNAT to {endpoint} by {family} nftrec service-" in p.stdout or \
            f"translated to {endpoint} by conntrack" in p.stdout, p.stdout
        p = nftrec("doctor", "--netns", dp.node, tmp_path=tmp_path)
        assert p.returncode == 0 and "forward drop: table" not in p.stdout, p.stdout
    finally:
        nsx(dp.node, "nft", "delete", "table", family, "filter", check=False)
    assert tracing_tables(dp) == []


def test_no_packet_within_the_bound_exits_1(dp, tmp_path):
    t0 = time.monotonic()
    p = nftrec(*trace_args(dp, "--timeout", "1s"), tmp_path=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no packet tcp 198.51.100.2 -> 10.96.0.70:80 came within 1s" in p.stderr
    assert time.monotonic() - t0 < 30  # bounded (generous: a loaded 2-core machine)
    assert tracing_tables(dp) == []
    for bad in (["--timeout", "0s"], ["--timeout", "soon"], ["--live"], ["--count", "0"]):
        p = nftrec(*trace_args(dp, *bad), tmp_path=tmp_path)
        assert p.returncode == 64, (bad, p.stderr)


def start_trace(dp, tmp_path: Path, timeout: str) -> tuple[subprocess.Popen, str]:
    """A `trace --kernel` left waiting (no client sends), once its tracing table is in the
    kernel: (the process, that table)."""
    cmd = [NFTREC, "--state-dir", str(tmp_path / "state"), *trace_args(dp, "--timeout", timeout)]
    # SIGINT as a terminal's: a suite started in the background (`scripts/test &`, as CI does)
    # ignores it, and a child inherits that, so the interrupt under test would never arrive
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    table = f"ip nftrec-trace-{proc.pid}"
    end = time.monotonic() + 30
    while table not in tracing_tables(dp):
        assert proc.poll() is None and time.monotonic() < end, f"no tracing table: {proc.communicate()}"
        time.sleep(0.05)
    return proc, table


def test_interrupted_and_killed_runs_leave_no_tracing_table(dp, tmp_path):
    args = write_input(tmp_path)
    proc, table = start_trace(dp, tmp_path, "60s")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert f"the tracing table {table} was removed" in err
    assert tracing_tables(dp) == []

    # SIGKILL: nothing can clean up, so the next command that touches the namespace does
    for command in (["apply", *args], ["cleanup", *args[1:]]):
        proc, table = start_trace(dp, tmp_path, "3s")  # its `nft monitor trace` child ends by itself soon
        proc.kill()
        proc.wait(timeout=30)
        assert tracing_tables(dp) == [table]
        p = nftrec(*command, "--netns", dp.node, tmp_path=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"removed the tracing table {table}, left behind by a `nftrec trace --kernel`" in p.stderr
        assert tracing_tables(dp) == []
