"""Readiness probes (issue 10) without a kernel: the annotation's validation (file:line into
the annotation), the model, probe targets and results as compile input (only the probed
Service recompiles), the kubelet's threshold counting, and the probes on the wire against
listeners on 127.0.0.1 (tcpSocket, httpGet, grpc health over h2c)."""

from __future__ import annotations

import io
import socket
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from reconciler.compile import compile_incremental, compile_ruleset, probe_targets, with_probe_results
from reconciler.compile.probes import ProbeTarget
from reconciler.daemon.probing import ProbeManager, Tracker
from reconciler.intake import NodeConfig, Probe, read_inventory
from reconciler.intake.report import run_validate
from reconciler.kernel import probe_all

ANN = "probe.nftrec.io/readiness"


def svc(name: str, probe_block: str | None, ip: str = "10.96.0.10") -> str:
    ann = ""
    if probe_block is not None:
        ann = f"  annotations:\n    {ANN}: |\n" + "".join(f"      {ln}\n" for ln in probe_block.splitlines())
    return (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n{ann}spec:\n  clusterIP: {ip}\n"
            f"  ports:\n    - {{name: http, port: 80, targetPort: 8080}}\n")


def slice_(name: str, addrs: list[str], extra_ep: str = "") -> str:
    eps = "".join(f"  - addresses: [\"{a}\"]\n{extra_ep}" for a in addrs)
    return (f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n"
            f"  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\n"
            f"ports: [{{name: http, port: 8080}}, {{name: health, port: 8081}}]\nendpoints:\n{eps}")


def validate(root: Path) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_validate(str(root), stream=out)
    return rc, out.getvalue()


# --- validation -----------------------------------------------------------------------------

BAD = [
    # (probe block, expected "line:col: ...field" fragment, expected message part); the block
    # starts on line 7 of the file, so its first line is line 7
    ("exec: {command: [rm, -rf, /]}", "f.yaml:7:7: Service default/web: metadata.annotations['probe.nftrec.io/readiness'].exec",
     "manifests come from a repository"),
    ("httpGet: {port: 8080}\nperiodSeconds: 0", "f.yaml:8:22: ", "periodSeconds: 0 is out of range"),
    ("tcpSocket: {port: 70000}", "f.yaml:7:25: ", "tcpSocket.port: 70000 is not a port number"),
    ("tcpSocket: {port: Health_1}", "f.yaml:7:25: ", "IANA service name"),
    ("httpGet: {port: 80, host: example.com}", "f.yaml:7:27: ", "host is not supported"),
    ("timeoutSeconds: 1", "f.yaml:7:7: ", "needs one handler"),
    ("httpGet: {port: 80}\ntcpSocket: {port: 80}", "f.yaml:8:7: ", "exactly one handler"),
    ("grpc: {port: grpc}", "f.yaml:7:20: ", "grpc.port: must be a whole number"),
    ("httpGet: {port: 80, path: \"/a b\"}", "f.yaml:7:33: ", "httpGet.path"),
    ("httpGet:\n  port: 80\n  httpHeaders: [{name: \"X:y\", value: v}]", "f.yaml:9:", "httpHeaders[0].name"),
    ("httpGet: {port: 80\n", "f.yaml:", "not valid YAML"),
    ("terminationGracePeriodSeconds: 5\ntcpSocket: {port: 1}", "f.yaml:7:", "unknown key 'terminationGracePeriodSeconds'"),
    ("- tcpSocket", "f.yaml:7:", "must be a Kubernetes Probe"),
]


@pytest.mark.parametrize("block,where,what", BAD)
def test_invalid_probe_annotation_is_an_error_with_file_line(tmp_path, block, where, what):
    (tmp_path / "f.yaml").write_text(svc("web", block))
    rc, out = validate(tmp_path)
    assert rc == 1, out
    line = next((ln for ln in out.splitlines() if what in ln), None)
    assert line is not None, out
    assert line.startswith(str(tmp_path / "f.yaml")[: -len("f.yaml")] + where), line


def test_probe_in_a_quoted_annotation_points_at_the_annotation(tmp_path):
    (tmp_path / "f.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n"
        f"    {ANN}: \"exec: {{command: [id]}}\"\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{port: 80}}]\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "f.yaml:6:" in out and "exec probe is not allowed" in out, out


def test_valid_probe_gets_the_kubelet_defaults(tmp_path):
    (tmp_path / "a.yaml").write_text(svc("web", "httpGet: {path: healthz, port: health}") + "---\n"
                                     + svc("db", "grpc: {port: 9000, service: db}\nperiodSeconds: 2", "10.96.0.11")
                                     + "---\n" + svc("plain", None, "10.96.0.12"))
    rc, out = validate(tmp_path)
    assert rc == 0, out
    inv = read_inventory(tmp_path).inventory
    by = {s.name: s.readiness_probe for s in inv.services}
    assert by["web"] == Probe("httpGet", "health", path="/healthz", scheme="HTTP", initial_delay_seconds=0,
                              timeout_seconds=1, period_seconds=10, success_threshold=1, failure_threshold=3)
    assert by["db"] == Probe("grpc", 9000, grpc_service="db", period_seconds=2)
    assert by["plain"] is None


# --- targets and results as compile input ------------------------------------------------------


def _inventory(tmp_path, extra_ep: str = ""):
    (tmp_path / "a.yaml").write_text(
        svc("web", "tcpSocket: {port: health}") + "---\n" + slice_("web", ["10.244.0.1", "10.244.0.2"], extra_ep)
        + "---\n" + svc("other", None, "10.96.0.11") + "---\n" + slice_("other", ["10.244.0.1", "10.244.0.2"]))
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    return res.inventory


def test_targets_resolve_named_ports_through_the_slice(tmp_path):
    inv = _inventory(tmp_path)
    ts = probe_targets(inv)
    assert [(t.service, t.address, t.port, t.error) for t in ts] == [
        ("default/web", "10.244.0.1", 8081, ""), ("default/web", "10.244.0.2", 8081, "")]
    svc_ = next(s for s in inv.services if s.name == "web")
    inv2 = replace(inv, services=tuple(replace(s, readiness_probe=replace(s.readiness_probe, port="nope"))
                                       if s is svc_ else s for s in inv.services))
    t = probe_targets(inv2)[0]
    assert t.port == 0 and "'nope' is not a port name" in t.error and "health, http" in t.error


def test_not_ready_not_serving_endpoints_are_not_probed(tmp_path):
    inv = _inventory(tmp_path, "    conditions: {ready: false, serving: false}\n")
    assert probe_targets(inv) == []


def test_results_change_only_the_probed_service(tmp_path):
    inv = _inventory(tmp_path)
    cfg = NodeConfig(node_name="n")
    before = compile_incremental(inv, cfg, None)
    down = with_probe_results(inv, {"default/web": frozenset({"10.244.0.1"})})
    after = compile_incremental(down, cfg, before)
    assert after.recompiled == 1
    assert after.ruleset == compile_ruleset(down, cfg)
    web = [sl for sl in down.endpoint_slices if sl.service_name == "web"][0]
    assert [(e.addresses[0], e.ready, e.serving) for e in web.endpoints] == [
        ("10.244.0.1", False, False), ("10.244.0.2", True, True)]
    other = [sl for sl in down.endpoint_slices if sl.service_name == "other"][0]
    assert other is [sl for sl in inv.endpoint_slices if sl.service_name == "other"][0]
    script = "\n".join(str(r) for t in after.ruleset.tables.values() for c in t.chains.values() for r in c.rules)
    assert "10.244.0.2" in script
    assert with_probe_results(inv, {}) is inv


def test_probes_never_add_readiness(tmp_path):
    inv = _inventory(tmp_path, "    conditions: {ready: false}\n")
    out = with_probe_results(inv, {"default/web": frozenset()})
    assert out is inv
    assert all(not e.ready for sl in out.endpoint_slices if sl.service_name == "web" for e in sl.endpoints)


# --- the kubelet's counting -------------------------------------------------------------------


def test_tracker_thresholds():
    tr = Tracker(success_threshold=2, failure_threshold=3)
    assert tr.up is None
    assert not tr.observe(True, None, 1)  # 1 success < 2: still the declared condition
    assert tr.observe(True, None, 2) and tr.up is True
    assert not tr.observe(False, "e1", 3) and not tr.observe(False, "e2", 4)
    assert not tr.observe(True, None, 5)  # a success resets the failure count
    assert not tr.observe(False, "e3", 6) and not tr.observe(False, "e4", 7)
    assert tr.observe(False, "e5", 8) and tr.up is False and tr.error == "e5" and tr.since == 8
    assert not tr.observe(True, None, 9)
    assert tr.observe(True, None, 10) and tr.up is True


def test_first_result_failure_needs_the_full_threshold():
    tr = Tracker(success_threshold=1, failure_threshold=2)
    assert not tr.observe(False, "x", 1) and tr.up is None  # declared condition kept meanwhile
    assert tr.observe(False, "x", 2) and tr.up is False


# --- on the wire (127.0.0.1 only) ------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802
        type(self).seen.append((self.path, self.headers.get("X-Probe"), self.headers.get("User-Agent")))
        code = 200 if self.path == "/ok" else (302 if self.path == "/moved" else 503)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


class _Server(HTTPServer):
    def server_bind(self):
        import socketserver
        socketserver.TCPServer.server_bind(self)


@pytest.fixture
def http_port():
    srv = _Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_http_and_tcp_probes(http_port):
    closed = _closed_port()
    h = lambda path, **kw: ProbeTarget("d/w", "127.0.0.1", http_port, Probe("httpGet", http_port, path=path, **kw))  # noqa: E731
    ts = [h("/ok", headers=(("X-Probe", "yes"),)), h("/moved"), h("/bad"),
          ProbeTarget("d/w", "127.0.0.1", http_port, Probe("tcpSocket", http_port)),
          ProbeTarget("d/w", "127.0.0.1", closed, Probe("tcpSocket", closed)),
          ProbeTarget("d/w", "127.0.0.1", 0, Probe("tcpSocket", "nope"), error="no such port name")]
    res = probe_all(None, ts)
    got = [res[t.key] for t in ts]
    assert got[0] is None and got[1] is None and got[3] is None
    assert got[2] == "HTTP probe failed with statuscode: 503"
    assert "connection refused" in got[4]
    assert got[5] == "no such port name"
    assert ("/ok", "yes", "kube-probe/1.35") in _Handler.seen


def test_probe_timeout():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)  # accepts the TCP handshake but never answers HTTP
    port = lst.getsockname()[1]
    try:
        t = ProbeTarget("d/w", "127.0.0.1", port, Probe("httpGet", port, timeout_seconds=1))
        assert probe_all(None, [t])[t.key] == f"httpGet probe of 127.0.0.1:{port} timed out after 1s"
    finally:
        lst.close()


# A minimal gRPC health server over h2c, written from RFC 7540 and the gRPC wire format, to
# check the client's framing without grpcio (see docs/probes.md on why grpcio is not used).

def _h2_server(status: int | None):
    from reconciler.kernel.probes import _frame, _health_status  # noqa: F401

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    seen = {}

    def serve():
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            with c:
                buf = b""
                c.settimeout(3)
                try:
                    while len(buf) < 24:
                        buf += c.recv(65536)
                    assert buf.startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                    buf = buf[24:]
                    c.sendall(_frame(4, 0, 0))  # server SETTINGS
                    data = b""
                    while True:
                        while len(buf) < 9:
                            buf += c.recv(65536)
                        n = int.from_bytes(buf[:3], "big")
                        while len(buf) < 9 + n:
                            buf += c.recv(65536)
                        ftype, flags, payload, buf = buf[3], buf[4], buf[9:9 + n], buf[9 + n:]
                        if ftype == 1:
                            seen["headers"] = payload
                        if ftype == 0:
                            data += payload
                            if flags & 1:
                                break
                    seen["request"] = data
                    c.sendall(_frame(1, 4, 1, b"\x88"))  # :status 200
                    if status is not None:
                        msg = b"\x08" + bytes([status])
                        c.sendall(_frame(0, 0, 1, b"\x00" + len(msg).to_bytes(4, "big") + msg))
                    c.sendall(_frame(1, 5, 1, b"\x00\x0bgrpc-status\x01" + (b"0" if status is not None else b"12")))
                    c.recv(100)
                except (OSError, AssertionError):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return lst, seen


@pytest.mark.parametrize("status,expect", [(1, None), (2, "responded with NOT_SERVING"),
                                           (None, "without a HealthCheckResponse")])
def test_grpc_health_probe_over_h2c(status, expect):
    lst, seen = _h2_server(status)
    port = lst.getsockname()[1]
    try:
        t = ProbeTarget("d/w", "127.0.0.1", port, Probe("grpc", port, grpc_service="db"))
        got = probe_all(None, [t])[t.key]
    finally:
        lst.close()
    if expect is None:
        assert got is None
    else:
        assert expect in got
    assert seen["request"] == b"\x00\x00\x00\x00\x04\x0a\x02db"  # HealthCheckRequest{service: "db"}
    assert b"/grpc.health.v1.Health/Check" in seen["headers"] and b"application/grpc" in seen["headers"]


# --- the manager (loop thread, transitions, state) ---------------------------------------------


def test_manager_takes_endpoint_down_and_back(tmp_path, http_port):
    """ProbeManager against 127.0.0.1: a failing endpoint goes down after failureThreshold,
    the daemon is told (on_change) and the state file lists it; when it passes again it
    comes back; a target removed from the inventory stops being probed."""
    from reconciler.intake import EndpointSlice, Endpoint, EndpointPort, Inventory, Service, ServicePort

    probe = Probe("httpGet", "health", path="/ok", period_seconds=1, failure_threshold=1)
    svc_ = Service("default", "web", "ClusterIP", ("10.96.0.10",), ("IPv4",), (ServicePort("http", "TCP", 80, 8080),),
                   readiness_probe=probe)

    def inv(port):
        sl = EndpointSlice("default", "web-1", "web", "IPv4", (Endpoint(("127.0.0.1",)),),
                           (EndpointPort("http", "TCP", 8080), EndpointPort("health", "TCP", port)))
        return Inventory((svc_,), (sl,))

    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    changes, states = [], []
    mgr = ProbeManager(None, lambda: changes.append(1), registry=registry,
                       write_state=lambda n, d: states.append((n, d)), jitter=False)
    try:
        good, bad = inv(http_port), inv(_closed_port())
        mgr.update(good)
        _wait(lambda: states and states[-1][0] == 1)
        mgr.update(bad)  # the port changed: a new target, a fresh state
        _wait(lambda: mgr.down() == {"default/web": frozenset({"127.0.0.1"})})
        gen, applied = mgr.apply(bad)
        assert not applied.endpoint_slices[0].endpoints[0].ready and changes
        assert states[-1][1][0]["address"] == "127.0.0.1" and "refused" in states[-1][1][0]["lastError"]
        value = registry.get_sample_value
        assert value("nftrec_probe_endpoints_down", {"service": "default/web"}) == 1
        assert value("nftrec_probe_results_total", {"service": "default/web", "result": "failure"}) >= 1
        assert value("nftrec_probe_results_total", {"service": "default/web", "result": "success"}) >= 1
        assert value("nftrec_probe_transitions_total", {"service": "default/web", "to": "down"}) == 1
        mgr.update(good)  # removing the down target brings it back at once (declared again)
        _wait(lambda: mgr.down() == {})
        assert mgr.generation > gen
        assert value("nftrec_probe_endpoints_down", {"service": "default/web"}) == 0
    finally:
        mgr.close()


def _wait(fn, timeout=6.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_named_probe_port_must_be_a_slice_port_name(tmp_path):
    (tmp_path / "f.yaml").write_text(svc("web", "tcpSocket: {port: healthz}") + "---\n" + slice_("web", ["10.244.0.1"]))
    rc, out = validate(tmp_path)
    assert rc == 1 and "f.yaml:7:25: Service default/web: metadata.annotations['probe.nftrec.io/readiness']" \
        ".tcpSocket.port: the probe's port 'healthz' is not a port name" in out and "health, http" in out, out
    (tmp_path / "f.yaml").write_text(svc("web", "tcpSocket: {port: health}") + "---\n" + slice_("web", ["10.244.0.1"]))
    assert validate(tmp_path)[0] == 0


def test_grpc_probe_against_grpcio_health_server():
    """Interop with the reference implementation: a grpcio server serving
    grpc.health.v1.Health/Check (generic handler, the protobuf messages written by hand)."""
    import grpc
    from concurrent import futures

    statuses = {"": 1, "db": 1, "down": 2}

    def check(request: bytes, ctx):
        name = request[2:].decode() if request[:1] == b"\x0a" else ""
        if name not in statuses:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return b"\x08" + bytes([statuses[name]])

    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)})
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        ts = {name: ProbeTarget("d/w", "127.0.0.1", port, Probe("grpc", port, grpc_service=name))
              for name in ("", "db", "down", "nope")}
        res = probe_all(None, ts.values())
    finally:
        server.stop(0)
    assert res[ts[""].key] is None and res[ts["db"].key] is None
    assert "responded with NOT_SERVING" in res[ts["down"].key]
    assert "without a HealthCheckResponse" in res[ts["nope"].key]


def test_https_probe_skips_certificate_verification(tmp_path):
    """httpGet scheme HTTPS against a self-signed certificate: a success, as with the kubelet."""
    import shutil
    import ssl
    import subprocess

    assert shutil.which("openssl"), "openssl is needed to make the test certificate"
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=not-this-host"], check=True, capture_output=True)
    srv = _Server(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        ok = ProbeTarget("d/w", "127.0.0.1", port, Probe("httpGet", port, path="/ok", scheme="HTTPS"))
        bad = ProbeTarget("d/w", "127.0.0.1", port, Probe("httpGet", port, path="/bad", scheme="HTTPS"))
        plain = ProbeTarget("d/w", "127.0.0.1", port, Probe("httpGet", port, path="/ok", scheme="HTTP", timeout_seconds=1))
        res = probe_all(None, [ok, bad, plain])
    finally:
        srv.shutdown()
        srv.server_close()
    assert res[ok.key] is None
    assert res[bad.key] == "HTTP probe failed with statuscode: 503"
    assert res[plain.key] is not None  # plain HTTP to a TLS port fails
