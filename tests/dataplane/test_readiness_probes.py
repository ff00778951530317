"""Readiness probes in `nftrec watch` (issue 10), through real packets.

Each backend endpoint of the topology runs its echo server (the Service's traffic) and,
for these tests, a separate health server (health_server.py) on HEALTH_PORT. Stopping
a health server makes that endpoint fail its probe while its traffic port still answers,
so "no new connection reaches it" can only come from nftrec's ruleset, not from a dead
backend. `nftrec watch --netns <node>` probes from the node namespace.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dp_topology import EP4, NODE_NAME, nsx_args
from test_wire import CONFIG_YAML, NFTREC, Watch, answered_by, client_flows, pin, write_atomically

pytestmark = pytest.mark.dataplane

HERE = Path(__file__).resolve().parent
HEALTH = HERE / "health_server.py"
HEALTH_PORT = 8081
WEB_VIP, WEB_PORT, WEB_TARGET = "10.96.0.70", 80, 8080
OTHER_VIP = "10.96.0.71"
DNS_VIP, DNS_PORT, DNS_TARGET = "10.96.0.72", 53, 9090


class Health:
    """One health server per endpoint address in the backend namespace."""

    def __init__(self, dp):
        self.dp = dp
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, ip: str) -> None:
        proc = subprocess.Popen(nsx_args(self.dp.ns["backend"], sys.executable, str(HEALTH), "--bind", ip,
                                         "--port", str(HEALTH_PORT)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "READY":
            proc.kill()
            _, err = proc.communicate(timeout=5)
            raise AssertionError(f"health server on {ip} did not start: {line!r} {err}")
        self.procs[ip] = proc

    def stop(self, ip: str) -> None:
        proc = self.procs.pop(ip)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def close(self) -> None:
        for ip in list(self.procs):
            self.stop(ip)


@pytest.fixture
def health(dp):
    h = Health(dp)
    try:
        yield h
    finally:
        h.close()


def service_yaml(name: str, vip: str, probe: str | None, *, protocol: str = "TCP", port: int = WEB_PORT) -> str:
    ann = ""
    if probe is not None:
        ann = "  annotations:\n    probe.nftrec.io/readiness: |\n" + "".join(
            f"      {line}\n" for line in probe.strip().splitlines())
    return f"""\
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
{ann}spec:
  type: ClusterIP
  clusterIP: {vip}
  ports:
    - {{name: traffic, protocol: {protocol}, port: {port}}}
"""


def slice_yaml(name: str, endpoints: list[tuple[str, dict]], *, protocol: str = "TCP",
               target: int = WEB_TARGET) -> str:
    eps = ""
    for ip, cond in endpoints:
        eps += f"  - addresses: [{ip}]\n    nodeName: {NODE_NAME}\n"
        if cond:
            eps += "    conditions: {" + ", ".join(f"{k}: {str(v).lower()}" for k, v in cond.items()) + "}\n"
    return f"""\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports:
  - {{name: traffic, protocol: {protocol}, port: {target}}}
  - {{name: health, protocol: TCP, port: {HEALTH_PORT}}}
endpoints:
{eps}"""


def start_watch(dp, tmp_path, files: dict[str, str]) -> tuple[Watch, Path]:
    manifests = tmp_path / "m"
    manifests.mkdir()
    for name, text in files.items():
        write_atomically(manifests / name, text)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_YAML)
    state = tmp_path / "state"
    w = Watch(dp.node, manifests, cfg, state)
    w.wait_event("sync", 0)
    return w, state


def servers(dp, vip: str, port: int, count: int = 12) -> list:
    return dp.probe("clientA", vip, port, count=count, timeout=1.0)


def wait_until(fn, timeout: float, what: str):
    """Poll fn() until it returns a true value; (value, seconds it took)."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout:
        last = fn()
        if last:
            return last, time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last})")


def status_json(dp, state: Path) -> dict:
    proc = subprocess.run([NFTREC, "--state-dir", str(state), "status", "--netns", dp.node, "-o", "json"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode in (0, 2), proc.stderr
    return json.loads(proc.stdout)


# --- the tests ----------------------------------------------------------------------------------

HTTP_PROBE = """\
httpGet: {path: /healthz, port: health}
periodSeconds: 1
failureThreshold: 2
successThreshold: 2
"""
PERIOD, FAILURES, SUCCESSES = 1, 2, 2


def test_http_probe_takes_a_failed_backend_out_and_brings_it_back(dp, health, tmp_path):
    """Two backends probed by HTTP (a named port, resolved through the slice's ports). One
    health server stops: within periodSeconds x failureThreshold + 1 s every new connection
    lands on the other; only that Service changes, in a partial sync; `status` lists the
    endpoint with its error. It restarts: used again within successThreshold periods (+1 s).
    The traffic port of the failed backend answers all along: only the ruleset moves traffic."""
    a, b = EP4[0], EP4[1]
    health.start(a)
    health.start(b)
    w, state = start_watch(dp, tmp_path, {
        "web.yaml": service_yaml("web", WEB_VIP, HTTP_PROBE),
        "web-slice.yaml": slice_yaml("web", [(a, {}), (b, {})]),
        "other.yaml": service_yaml("other", OTHER_VIP, None),
        "other-slice.yaml": slice_yaml("other", [(a, {}), (b, {})]),
    })
    try:
        assert set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {a, b}
        since = len(w.lines)
        health.stop(a)
        _, took = wait_until(lambda: set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT))) == {b},
                             PERIOD * FAILURES + 1 + 3, "every new connection on the healthy backend")
        print(f"\nprobe failure -> traffic moved: {took:.2f}s (bound {PERIOD * FAILURES + 1}s + one batch "
              f"{batch_allowance():.2f}s)")
        assert took <= PERIOD * FAILURES + 1 + batch_allowance(), f"took {took:.2f}s"
        down = w.wait_event("probe", since, address=a, ready=False)
        assert down["service"] == "default/web" and "refused" in down["error"], down
        sync = w.wait_event("sync", since)
        assert sync["kind"] == "partial" and sync["servicesChanged"] == ["~default/web"], sync
        assert set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {b}
        assert set(answered_by_tcp(servers(dp, OTHER_VIP, WEB_PORT, 30))) == {a, b}, "an unprobed Service is untouched"
        st = status_json(dp, state)
        assert [(d["service"], d["address"]) for d in st["probes"]["down"]] == [("default/web", a)], st
        assert "refused" in st["probes"]["down"][0]["lastError"] and st["probes"]["down"][0]["since"], st
        text = subprocess.run([NFTREC, "--state-dir", str(state), "status", "--netns", dp.node],
                              capture_output=True, text=True, timeout=30).stdout
        assert f"default/web {a} since" in text, text

        since = len(w.lines)
        health.start(a)
        _, took = wait_until(lambda: set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {a, b},
                             PERIOD * SUCCESSES + 1 + 6, "the restarted backend used again")
        print(f"restart -> used again: {took:.2f}s (bound {PERIOD * SUCCESSES + 1}s + batches)")
        assert took <= PERIOD * SUCCESSES + 1 + 2 * batch_allowance(), f"took {took:.2f}s"
        w.wait_event("probe", since, address=a, ready=True)
        assert status_json(dp, state)["probes"]["down"] == []
    finally:
        w.stop()
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)


_BATCH = []


def batch_allowance() -> float:
    """How long one batch of test connections takes here (measured): the polling granularity."""
    return max(_BATCH) if _BATCH else 1.0


def answered_by_tcp(results) -> list[str]:
    bad = [r for r in results if r.reply is None]
    assert not bad, f"{len(bad)}/{len(results)} connections failed: {results}"
    return [r.reply.server_ip for r in results]


@pytest.fixture(autouse=True)
def _measure_batch(dp):
    start = time.monotonic()
    dp.probe("clientA", "198.51.100.1", 30090, count=12, timeout=1.0)
    _BATCH.append(time.monotonic() - start)


def test_all_backends_fail_vip_rejects_and_declared_readiness_wins(dp, health, tmp_path):
    """Declared readiness wins: an endpoint declared ready=false serving=false gets no traffic
    although its probe passes. All probed backends fail: no usable endpoint is left, so the
    VIP rejects (kube-proxy's no-endpoints rule), and recovers when one comes back."""
    a, b, c = EP4
    for ip in EP4:
        health.start(ip)
    probe = "tcpSocket: {port: 8081}\nperiodSeconds: 1\nfailureThreshold: 1\n"
    w, state = start_watch(dp, tmp_path, {
        "web.yaml": service_yaml("web", WEB_VIP, probe),
        "web-slice.yaml": slice_yaml("web", [(a, {}), (b, {}), (c, {"ready": False, "serving": False})]),
    })
    try:
        time.sleep(1.5)  # every endpoint has passed its probe: still only the declared-ready ones
        assert set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {a, b}
        health.stop(a)
        health.stop(b)
        res, _ = wait_until(lambda: (lambda r: r if {x.error for x in r} == {"refused"} else None)(
            servers(dp, WEB_VIP, WEB_PORT, 5)), 8, "the VIP rejects")
        assert {x.error for x in res} == {"refused"}
        assert c not in str(res)
        st = status_json(dp, state)
        assert sorted(d["address"] for d in st["probes"]["down"]) == [a, b], st
        health.start(b)
        wait_until(lambda: (lambda r: r if all(x.reply and x.reply.server_ip == b for x in r) else None)(
            servers(dp, WEB_VIP, WEB_PORT, 5)), 8, "the VIP answers from the recovered backend")
    finally:
        w.stop()
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)


def test_tcp_probe_on_sidecar_port_takes_udp_endpoint_out_and_clears_conntrack(dp, health, tmp_path):
    """A UDP Service probed with tcpSocket on a sidecar port. The client's UDP socket is
    pinned by conntrack to one endpoint; that endpoint's sidecar stops (its UDP echo keeps
    answering): the endpoint is taken out and its conntrack entries are cleared, so the
    same socket's next datagrams are answered by the other endpoint."""
    a, b = EP4[0], EP4[1]
    health.start(a)
    health.start(b)
    probe = "tcpSocket: {port: health}\nperiodSeconds: 1\nfailureThreshold: 1\n"
    w, _state = start_watch(dp, tmp_path, {
        "dns.yaml": service_yaml("dns", DNS_VIP, probe, protocol="UDP", port=DNS_PORT),
        "dns-slice.yaml": slice_yaml("dns", [(a, {}), (b, {})], protocol="UDP", target=DNS_TARGET),
    })
    try:
        import test_wire

        with dp.udp_session("clientA", DNS_VIP, DNS_PORT) as s:
            old = (test_wire.VIP, test_wire.TARGET)
            test_wire.VIP, test_wire.TARGET = DNS_VIP, DNS_TARGET  # pin() and friends read these
            try:
                pinned = pin(dp, s)
                other = b if pinned == a else a
                since = len(w.lines)
                health.stop(pinned)
                w.wait_event("probe", since, address=pinned, ready=False)
                ct = w.wait_event("conntrack", since)
                assert ct["deleted"] >= 1, ct
                after = answered_by(s.send(10))
                assert set(after) == {other}, f"pinned to {pinned}; after its probe failed answered by {after}"
                assert client_flows(dp, s) == {other}
            finally:
                test_wire.VIP, test_wire.TARGET = old
    finally:
        w.stop()
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)


def test_apply_probes_only_with_probe_flag_and_says_so(dp, health, tmp_path):
    """One-shot commands never probe unless --probe: then once, and they say so."""
    a, b = EP4[0], EP4[1]
    health.start(a)  # b has no health server: its probe fails
    m = tmp_path / "m"
    m.mkdir()
    (m / "web.yaml").write_text(service_yaml("web", WEB_VIP, "tcpSocket: {port: 8081}\n"))
    (m / "web-slice.yaml").write_text(slice_yaml("web", [(a, {}), (b, {})]))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_YAML)
    base = [NFTREC, "--state-dir", str(tmp_path / "state"), "apply", str(m), "--config", str(cfg), "--netns", dp.node]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert "probe" not in plain.stderr.lower()
    assert set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {a, b}
    probed = subprocess.run(base + ["--probe"], capture_output=True, text=True, timeout=60)
    assert probed.returncode == 0, probed.stderr
    assert "probed 2 endpoint(s) once" in probed.stderr and b in probed.stderr, probed.stderr
    assert set(answered_by_tcp(servers(dp, WEB_VIP, WEB_PORT, 30))) == {a}
