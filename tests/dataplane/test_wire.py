"""UDP conntrack cleanup with live flows (reference §8.5), through real packets.

A UDP client that keeps one source port (a DNS resolver does) is pinned by its conntrack
entry to the endpoint its first datagram was DNATed to. When that endpoint leaves the
Service, the new ruleset alone does not move the client: the existing entry keeps
sending its datagrams to the old endpoint. `nftrec watch` deletes those entries after
the sync, so the client's next datagram is DNATed afresh to an endpoint that remains.

The removed endpoint's echo server keeps running on purpose: a datagram that still
reaches it is answered, so "still pinned to the removed endpoint" shows as an answer
from that address (not a timeout that could have other causes).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

import pytest

import watchproc

from dp_topology import (
    CLIENT_A4, CLUSTER_CIDR4, CLUSTER_CIDR6, EP4, NODE_BE4, NODE_IP4, NODE_IP6, NODE_NAME, POD4,
    SERVICE_CIDR4, SERVICE_CIDR6, Reply, Result, nsx, nsx_args,
)
from reconciler.intake.model import Endpoint, EndpointPort, EndpointSlice, Inventory, NodeConfig, Service, ServicePort

pytestmark = pytest.mark.dataplane

NFTREC = str(Path(sys.executable).with_name("nftrec"))
VIP, PORT, TARGET = "10.96.0.80", 53, 9090


# --- the same Service as model objects (direct loads) and as YAML (for nftrec watch) --------


def config() -> NodeConfig:
    return NodeConfig(node_name=NODE_NAME, node_ips=(NODE_IP4, NODE_IP6),
                      cluster_cidrs=(CLUSTER_CIDR4, CLUSTER_CIDR6),
                      service_cidrs=(SERVICE_CIDR4, SERVICE_CIDR6))


def dns_inventory(endpoints: tuple[str, ...]) -> Inventory:
    svc = Service(namespace="default", name="dns", type="ClusterIP", cluster_ips=(VIP,),
                  ip_families=("IPv4",), ports=(ServicePort("dns", "UDP", PORT, TARGET),))
    sl = EndpointSlice(namespace="default", name="dns-1", service_name="dns", address_type="IPv4",
                       endpoints=tuple(Endpoint((ip,), node_name=NODE_NAME) for ip in endpoints),
                       ports=(EndpointPort("dns", "UDP", TARGET),))
    return Inventory(services=(svc,), endpoint_slices=(sl,))


CONFIG_YAML = f"""\
apiVersion: nftrec/v1alpha1
kind: NodeConfig
nodeName: {NODE_NAME}
nodeIPs: [{NODE_IP4}, "{NODE_IP6}"]
clusterCIDRs: [{CLUSTER_CIDR4}, "{CLUSTER_CIDR6}"]
serviceCIDRs: [{SERVICE_CIDR4}, "{SERVICE_CIDR6}"]
tableName: nftrec
minSyncPeriod: 0s
syncPeriod: 1s
fullSyncPeriod: 30s
"""

SERVICE_YAML = f"""\
apiVersion: v1
kind: Service
metadata: {{name: dns, namespace: default}}
spec:
  type: ClusterIP
  clusterIP: {VIP}
  ports:
    - {{name: dns, protocol: UDP, port: {PORT}, targetPort: {TARGET}}}
"""


def slice_yaml(endpoints: tuple[str, ...]) -> str:
    eps = "".join(f"  - addresses: [{ip}]\n    nodeName: {NODE_NAME}\n" for ip in endpoints)
    return f"""\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {{kubernetes.io/service-name: dns}}
addressType: IPv4
ports:
  - {{name: dns, protocol: UDP, port: {TARGET}}}
endpoints:
{eps}"""


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def Watch(ns: str, manifests: Path, cfg: Path, state: Path) -> watchproc.Watch:
    """`nftrec watch` with a short debounce and no metrics server."""
    return watchproc.Watch(ns, manifests, cfg, state, "--debounce", "0.05", metrics=False)


def answered_by(results) -> list[str]:
    bad = [r for r in results if r.reply is None]
    assert not bad, f"{len(bad)}/{len(results)} datagrams got no answer: {results}"
    assert {r.reply.server_port for r in results} == {TARGET}, results
    return [r.reply.server_ip for r in results]


def client_flows(dp, session) -> set[str]:
    """The reply source (DNAT target) of the conntrack entries of this client socket."""
    flows = dp.conntrack("-p", "udp", "--orig-src", CLIENT_A4, "--orig-dst", VIP,
                         "--orig-port-src", str(session.local_port))
    return {f.reply_src for f in flows}


def pin(dp, session) -> str:
    """Send from the session until pinned; every datagram of the socket hits one endpoint."""
    first = answered_by(session.send(1))[0]
    assert first in EP4
    assert set(answered_by(session.send(20))) == {first}, "one socket must stay on one endpoint"
    assert client_flows(dp, session) == {first}
    return first


# --- the tests ----------------------------------------------------------------------------------


def test_udp_flow_stays_on_removed_endpoint_without_cleanup(dp):
    """The failure mode the cleanup exists for, and the cleanup itself (library call):
    a reload without the endpoint leaves the live flow on it; `cleanup_udp` in the node
    namespace moves the very next datagram of the same socket to a remaining endpoint."""
    traced = dp.trace_checks
    from reconciler.kernel.conntrack import cleanup_udp

    dp.load(dns_inventory(EP4), config())
    with dp.udp_session("clientA", VIP, PORT) as s:
        pinned = pin(dp, s)
        rest = tuple(ip for ip in EP4 if ip != pinned)
        dp.load(dns_inventory(rest), config(), flush_conntrack=False)  # new ruleset, flows kept
        # A new socket is DNATed by the new ruleset: the removed endpoint is gone from it ...
        fresh = dp.probe("clientA", VIP, PORT, proto="udp", count=15)
        assert set(answered_by(fresh)) <= set(rest)
        # ... but the live flow still reaches the removed endpoint: conntrack pins it.
        assert set(answered_by(s.send(5))) == {pinned}
        assert cleanup_udp(dp.node, dns_inventory(rest), config()) >= 1
        s.expect_fresh()  # its entry is gone: the next datagram is DNATed (and traced) afresh
        after = answered_by(s.send(10))
        assert len(set(after)) == 1 and set(after) <= set(rest), after
        assert client_flows(dp, s) == set(after)
    assert dp.trace_checks - traced == 3  # the session's first datagram, the fresh probe, the re-DNAT


def test_watch_moves_live_udp_flow_off_removed_endpoint(dp, tmp_path):
    """`nftrec watch`: a new revision without the endpoint the client is pinned to; after
    the sync (and its conntrack cleanup) the same client socket's next datagram is
    answered by a remaining endpoint, and stays there."""
    traced = dp.trace_checks
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "service.yaml").write_text(SERVICE_YAML)
    write_atomically(manifests / "slice.yaml", slice_yaml(EP4))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_YAML)
    w = Watch(dp.node, manifests, cfg, tmp_path / "state")
    try:
        w.wait_event("sync", 0)
        with dp.udp_session("clientA", VIP, PORT) as s:
            pinned = pin(dp, s)
            rest = tuple(ip for ip in EP4 if ip != pinned)
            since = len(w.lines)
            write_atomically(manifests / "slice.yaml", slice_yaml(rest))
            sync = w.wait_event("sync", since)
            assert sync["servicesChanged"] == ["~default/dns"], sync
            ct = w.wait_event("conntrack", since)
            assert ct["deleted"] >= 1, ct
            s.expect_fresh()
            after = answered_by(s.send(20))
            assert len(set(after)) == 1 and set(after) <= set(rest), \
                f"pinned to {pinned}, after its removal answered by {after}"
            assert client_flows(dp, s) == set(after)
            assert dp.trace_checks - traced == 2  # first datagram and re-DNAT, traced against the live table
    finally:
        w.stop()
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)


def test_apply_moves_live_udp_flow_off_removed_endpoint(dp, tmp_path):
    """`nftrec apply` cleans conntrack as kube-proxy does after every sync: the same
    client socket moves off the endpoint that the applied revision removed."""
    traced = dp.trace_checks
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "service.yaml").write_text(SERVICE_YAML)
    (manifests / "slice.yaml").write_text(slice_yaml(EP4))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_YAML)
    cli = [NFTREC, "--state-dir", str(tmp_path / "state"), "--log-format", "json", "apply", str(manifests),
           "--config", str(cfg), "--netns", dp.node]

    def apply() -> list[dict]:
        r = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]

    apply()
    with dp.udp_session("clientA", VIP, PORT) as s:
        pinned = pin(dp, s)
        rest = tuple(ip for ip in EP4 if ip != pinned)
        (manifests / "slice.yaml").write_text(slice_yaml(rest))
        events = [x for x in apply() if x.get("event") == "conntrack"]
        assert events and events[0]["deleted"] >= 1, events
        s.expect_fresh()
        after = answered_by(s.send(20))
        assert len(set(after)) == 1 and set(after) <= set(rest), \
            f"pinned to {pinned}, after its removal answered by {after}"
        assert client_flows(dp, s) == set(after)
    assert dp.trace_checks - traced == 2  # first datagram and re-DNAT, traced against the live table


# --- SCTP ---------------------------------------------------------------------------------------

SCTP_RAW = Path(__file__).resolve().parent / "sctp_raw.py"
SCTP_VIP, SCTP_PORT, SCTP_TARGET, SCTP_NODEPORT = "10.96.0.90", 80, 9090, 30132


def sctp_unsupported(dp) -> str | None:
    """Why SCTP cannot be tested on this kernel, or None. Probed: a raw IPv4 socket of
    protocol 132 in the backend namespace (what sctp_raw.py needs), and the kernel
    config (when /proc/config.gz exists) for SCTP conntrack, which DNAT of SCTP needs."""
    try:
        import gzip
        with gzip.open("/proc/config.gz", "rt") as f:
            cfg = f.read()
        if "CONFIG_NF_CT_PROTO_SCTP=y" not in cfg and "CONFIG_NF_CONNTRACK=y" in cfg:
            return "/proc/config.gz: CONFIG_NF_CT_PROTO_SCTP is not set (no SCTP conntrack/NAT)"
    except OSError:
        pass  # no config exported: the raw socket probe and the test itself must tell
    probe = ("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 132).close()")
    proc = nsx(dp.ns["backend"], sys.executable, "-c", probe, check=False)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"cannot open a raw IPv4 socket of protocol 132 (SCTP) in a namespace: {said}"
    return None


def sctp_probe(dp, role: str, dst: str, port: int, count: int) -> list[tuple]:
    """`count` SCTP INITs from namespace `role`: (Reply, INIT ACK source) or an error each.
    Each is also checked against nftrec's trace of the loaded ruleset (dp.traced)."""
    raw: list[dict] = []

    def send() -> list[Result]:
        out = nsx(dp.ns[role], sys.executable, str(SCTP_RAW), "probe", "--dst", dst, "--port", str(port),
                  "--count", str(count), "--timeout", "1", timeout=count * 1.5 + 10).stdout
        raw.extend(json.loads(out))
        return [Result(Reply.parse(x["reply"]), None) if "reply" in x else Result(None, x["error"]) for x in raw]

    dp.traced(role, dst, port, "sctp", send)
    return [(Reply.parse(x["reply"]), x["from"]) if "reply" in x else x["error"] for x in raw]


def sctp_service(protocol: str = "SCTP") -> Inventory:
    svc = Service(namespace="default", name="sig", type="NodePort", cluster_ips=(SCTP_VIP,),
                  ip_families=("IPv4",),
                  ports=(ServicePort("sig", protocol, SCTP_PORT, SCTP_TARGET, SCTP_NODEPORT),))
    sl = EndpointSlice(namespace="default", name="sig-1", service_name="sig", address_type="IPv4",
                       endpoints=tuple(Endpoint((ip,), node_name=NODE_NAME) for ip in EP4),
                       ports=(EndpointPort("sig", protocol, SCTP_TARGET),))
    return Inventory(services=(svc,), endpoint_slices=(sl,))


@pytest.fixture
def sctp_server(dp):
    why = sctp_unsupported(dp)
    if why:
        pytest.skip(f"SCTP data-plane test not possible here: {why}")
    proc = subprocess.Popen(nsx_args(dp.ns["backend"], sys.executable, str(SCTP_RAW), "serve",
                                     *(a for ip in EP4 for a in ("--bind", ip)), "--port", str(SCTP_TARGET)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "READY", f"SCTP server did not start: {line!r}"
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_sctp_clusterip_and_nodeport(dp, sctp_server):
    """A Service port with protocol SCTP: INITs to ClusterIP:port and NodeIP:nodePort are
    DNATed to the endpoints' targetPort, spread over all of them; the INIT ACK comes back
    from the frontend address (un-DNAT); traffic from outside clusterCIDRs masqueraded, from
    a pod not; conntrack holds SCTP entries. Control: the same port declared TCP does not
    carry SCTP."""
    traced = dp.trace_checks
    dp.load(sctp_service(), config())
    res = sctp_probe(dp, "clientA", SCTP_VIP, SCTP_PORT, 30)
    assert all(isinstance(r, tuple) for r in res), res
    assert {r.server_ip for r, _ in res} == set(EP4), res
    assert {r.server_port for r, _ in res} == {SCTP_TARGET}
    assert {frm for _, frm in res} == {f"{SCTP_VIP}:{SCTP_PORT}"}
    assert {r.peer_ip for r, _ in res} == {NODE_BE4}  # masqueraded: not from clusterCIDRs

    pod = sctp_probe(dp, "pod", SCTP_VIP, SCTP_PORT, 5)
    assert all(isinstance(r, tuple) for r in pod), pod
    assert {r.peer_ip for r, _ in pod} == {POD4} and {r.server_ip for r, _ in pod} <= set(EP4)

    np = sctp_probe(dp, "clientA", NODE_IP4, SCTP_NODEPORT, 5)
    assert all(isinstance(r, tuple) for r in np), np
    assert {r.server_ip for r, _ in np} <= set(EP4) and {frm for _, frm in np} == {f"{NODE_IP4}:{SCTP_NODEPORT}"}

    flows = dp.conntrack("-p", "sctp", "--orig-dst", SCTP_VIP)
    assert flows and {f.proto for f in flows} == {"sctp"}, flows
    assert {f.reply_src for f in flows} == set(EP4) and {f.reply_sport for f in flows} == {SCTP_TARGET}, flows

    dp.load(sctp_service("TCP"), config())
    assert set(sctp_probe(dp, "clientA", SCTP_VIP, SCTP_PORT, 3)) == {"timeout"}
    assert dp.trace_checks - traced == 4  # every sctp_probe above agreed with nftrec trace
