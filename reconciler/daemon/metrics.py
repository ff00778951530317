"""Prometheus metrics and the `/metrics` + `/healthz` HTTP endpoint of `nftrec watch`.

Each `Metrics` has its own CollectorRegistry, so tests and several instances never
clash; the stdlib HTTP server runs on a daemon thread and scrapes never block the loop.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("nftrec.metrics")

SYNC_KINDS = ("full", "partial")
ROLLOUT_HOLDS = ("held", "paused", "local-hold", "halted")  # intake's Decision states that hold
REFUSALS = ("invalid", "unverified", "rolled-back", "removal-guard")  # why the newest revision was not applied
# kube-proxy's sync_proxy_rules_duration_seconds buckets: 1 ms … ~16 s.
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))


class MetricsError(RuntimeError):
    """A bad metrics address, or the server cannot listen on it."""


class _Revisions:
    """`nftrec_{applied,attempted}_revision_info{revision="…"} 1`: a custom collector so
    a scrape sees exactly one series per metric (or none while unknown), never the
    moment between removing the old label value and adding the new one."""

    def __init__(self) -> None:
        # One tuple, replaced whole: a scrape never sees a half-updated pair.
        self.pair: tuple[str | None, str | None] = (None, None)

    def collect(self):
        applied, attempted = self.pair
        for name, value, doc in (
            ("nftrec_applied_revision_info", applied, "Revision of the manifests in the kernel now."),
            ("nftrec_attempted_revision_info", attempted, "Last revision read (applied or rejected)."),
        ):
            fam = GaugeMetricFamily(name, doc, labels=["revision"])
            if value is not None:
                fam.add_metric([value], 1)
            yield fam


class _Signer:
    """`nftrec_verified_signer_info{signer="…",key="…"} 1`: who signed the last revision
    that `verify` passed (one series, replaced whole, as _Revisions)."""

    def __init__(self) -> None:
        self.last: tuple[str, str] | None = None

    def collect(self):
        fam = GaugeMetricFamily("nftrec_verified_signer_info", "Signer and key of the last verified revision.",
                                labels=["signer", "key"])
        if self.last is not None:
            fam.add_metric(list(self.last), 1)
        yield fam


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._sync_duration = Histogram(
            "nftrec_sync_duration_seconds", "Duration of one sync (compile + transaction).",
            ["kind"], buckets=SYNC_BUCKETS, registry=r)
        for kind in SYNC_KINDS:  # export both series from the start (rate() needs a 0)
            self._sync_duration.labels(kind)
        self._sync_failures = Counter(
            "nftrec_sync_failures", "Syncs that failed (the previous ruleset stays).", registry=r)
        self._last_sync = Gauge(
            "nftrec_last_sync_timestamp_seconds", "Unix time of the last successful sync.", registry=r)
        self._last_attempt = Gauge(
            "nftrec_last_sync_attempt_timestamp_seconds", "Unix time of the last sync attempt.", registry=r)
        self._rules = Gauge("nftrec_rules", "Rules in nftrec's table.", ["family"], registry=r)
        self._elements = Gauge("nftrec_set_elements", "Set and map elements in nftrec's table.",
                               ["family"], registry=r)
        self._drift_repairs = Counter(
            "nftrec_drift_repairs", "Full syncs that found and repaired drift in the kernel (periodic, or "
            "right after another process changed nftrec's tables).", registry=r)
        self._drift_objects = Counter(
            "nftrec_drift_objects_repaired", "Kernel objects repaired by full syncs.", registry=r)
        self._conntrack = Counter(
            "nftrec_conntrack_entries_deleted", "Stale UDP conntrack entries deleted.", registry=r)
        self._rollbacks = Counter(
            "nftrec_rollbacks", "Revisions rolled back because their healthChecks did not pass after the apply "
            "(or nftrec watch stopped first).", registry=r)
        self._refused = Gauge(
            "nftrec_revision_refused", "1 while the newest revision read is refused, by why: invalid (the input), "
            "unverified (by verify), rolled-back (its healthChecks failed), removal-guard (it removes more of the "
            "applied Services than removalGuard allows); the last good ruleset stays in the "
            "kernel.", ["reason"], registry=r)
        self.set_refused(None)
        self._revisions = _Revisions()
        r.register(self._revisions)
        self._unverified = Counter(
            "nftrec_revision_verification_failures", "Revisions refused by verify (unsigned, unknown-key, "
            "bad-signature, bad-object, rollback, ...).", ["reason"], registry=r)
        self._signer = _Signer()
        r.register(self._signer)
        # a fleet's rollout (daemon/rollout.py)
        self._rollout_wave = Gauge("nftrec_rollout_wave", "This node's rollout wave of the newest revision "
                                   "(value: its index from 0, label: its name).", ["wave"], registry=r)
        self._rollout_held = Gauge(
            "nftrec_rollout_held", "1 while the newest revision is held back, by why: held (its wave has not "
            "opened), paused (rollout.paused), local-hold (`nftrec hold`), halted (earlier waves failed it, or their "
            "records cannot be read); the last applied revision stays in the kernel.", ["state"], registry=r)
        self._rollout_opens = Gauge("nftrec_rollout_opens_timestamp_seconds", "Unix time at which the held "
                                    "revision's wave opens for this node (0 when it is not held by its wave).",
                                    registry=r)
        self.set_rollout("", 0, None, None)
        # `watch oci://...` (daemon/fetcher.py): polls of the tag, artifacts pulled, failures by reason
        self._source_polls = Counter("nftrec_source_polls", "Resolves of the watched OCI reference (one HEAD "
                                     "request each for a tag).", registry=r)
        self._source_pulls = Counter("nftrec_source_pulls", "New OCI artifacts pulled, checked and published.",
                                     registry=r)
        self._source_errors = Counter(
            "nftrec_source_errors", "Failed fetches of the OCI source, by reason (unreachable, tls, auth, "
            "not-found, bad-response, digest-mismatch, bad-artifact, unsafe-archive, too-large, store, ...); the "
            "kernel keeps the last good ruleset.", ["reason"], registry=r)

    def set_rollout(self, wave: str, index: int, held: str | None, opens_at: float | None) -> None:
        """The newest revision's rollout: the node's wave, why it is held (None: not held),
        when its wave opens for this node (0: not held by its wave)."""
        self._rollout_wave.clear()
        if wave:
            self._rollout_wave.labels(wave).set(index)
        for state in ROLLOUT_HOLDS:
            self._rollout_held.labels(state).set(1 if state == held else 0)
        self._rollout_opens.set(opens_at or 0)

    def observe_sync(self, kind: str, seconds: float, ok: bool) -> None:
        """One sync attempt of `kind` ("full"|"partial") that took `seconds`."""
        if kind not in SYNC_KINDS:
            raise ValueError(f"sync kind must be one of {SYNC_KINDS}, got {kind!r}")
        now = time.time()
        self._sync_duration.labels(kind).observe(seconds)
        self._last_attempt.set(now)
        if ok:
            self._last_sync.set(now)
        else:
            self._sync_failures.inc()

    def set_counts(self, family: str, rules: int, elements: int) -> None:
        self._rules.labels(family).set(rules)
        self._elements.labels(family).set(elements)

    def set_revisions(self, applied: str | None, attempted: str | None) -> None:
        self._revisions.pair = (applied, attempted)

    def set_refused(self, reason: str | None) -> None:
        """The newest revision's refusal (one of REFUSALS), None when it was not refused."""
        for r in REFUSALS:
            self._refused.labels(r).set(1 if r == reason else 0)

    def verification_failed(self, reason: str) -> None:
        self._unverified.labels(reason).inc()

    def verified(self, signer: str, key: str) -> None:
        self._signer.last = (signer, key)

    def source_polled(self) -> None:
        self._source_polls.inc()

    def source_pulled(self) -> None:
        self._source_pulls.inc()

    def source_failed(self, reason: str) -> None:
        self._source_errors.labels(reason).inc()

    def source_reasons(self, reasons) -> None:
        """Export each reason's series from the start, at 0 (rate() and alerts need one)."""
        for reason in reasons:
            self._source_errors.labels(reason)

    def drift_repaired(self, objects: int) -> None:
        """A full sync repaired `objects` drifted objects; 0 is no repair (not counted),
        so the caller may report after every full sync."""
        if objects < 0:
            raise ValueError(f"objects must be >= 0, got {objects}")
        if objects:
            self._drift_repairs.inc()
            self._drift_objects.inc(objects)

    def conntrack_deleted(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._conntrack.inc(n)

    def rolled_back(self) -> None:
        """A revision failed its health checks and the previous ruleset was restored."""
        self._rollbacks.inc()

    def serve(self, address: str, healthy: Callable[[], tuple[bool, str]],
              ready: Callable[[], tuple[bool, str]] | None = None) -> Server:
        return serve(address, healthy, self.registry, ready)


# --- HTTP --------------------------------------------------------------------------------


class ProbeMetrics:
    """The readiness probes' metrics (daemon/probing.py), on the daemon's registry."""

    def __init__(self, registry):
        self.results = Counter("nftrec_probe_results", "Readiness probe results, by Service and result.",
                               ["service", "result"], registry=registry)
        self.down = Gauge("nftrec_probe_endpoints_down", "Probed endpoints that are down (taken out of "
                          "readiness), by Service.", ["service"], registry=registry)
        self.probed = Gauge("nftrec_probe_endpoints", "Endpoints being probed.", registry=registry)
        self.transitions = Counter("nftrec_probe_transitions", "Probed endpoints that went down or up.",
                                   ["service", "to"], registry=registry)


def parse_address(address: str) -> tuple[str, int]:
    """`127.0.0.1:9105`, `[::1]:9105`, `localhost:9105`; port 0 = any free port.
    IP literals only (plus localhost): a metrics endpoint should not depend on DNS."""
    host, sep, port_text = address.rpartition(":")
    bad = f"bad metrics address {address!r}: expected IPv4:port or [IPv6]:port"
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise MetricsError(bad)
    if host.startswith("[") and host.endswith("]"):
        host, want = host[1:-1], 6
    else:
        want = 4
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise MetricsError(bad) from None
    if ip.version != want:  # "::1:9105" is ambiguous; v6 needs brackets
        raise MetricsError(bad)
    return str(ip), int(port_text)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn() — a DNS lookup that can hang
        # where there is no resolver; the name is only used for CGI variables.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class Server:
    """A running metrics/health endpoint; `port` is the real port (also for port 0)."""

    def __init__(self, httpd: _HTTPServer):
        self._httpd = httpd
        self.host: str = httpd.server_address[0]
        self.port: int = httpd.server_address[1]
        # poll_interval bounds how long close() waits for the serving loop to notice.
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="nftrec-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


def serve(address: str, healthy: Callable[[], tuple[bool, str]], registry: CollectorRegistry,
          ready: Callable[[], tuple[bool, str]] | None = None) -> Server:
    """Serve GET /metrics (Prometheus text format), GET /healthz (200 "ok: <why>" or
    503 "unhealthy: <why>" from `healthy()`) and, with `ready`, GET /readyz (200 "ok: <why>"
    or 503 "not ready: <why>"), 404 otherwise, until `close()`."""
    host, port = parse_address(address)
    checks = {"/healthz": (healthy, "unhealthy"), **({"/readyz": (ready, "not ready")} if ready else {})}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in checks:
                check, bad = checks[path]
                try:
                    ok, why = check()
                except Exception as e:  # a broken check must read as unhealthy, not hang
                    ok, why = False, f"health check failed: {e}"
                text = f"{'ok' if ok else bad}: {why}\n"
                self._send(200 if ok else 503, text.encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # scrapes are not worth stderr lines
            log.debug("metrics http: " + fmt, *args)

    cls = _HTTPServer6 if ":" in host else _HTTPServer
    try:
        httpd = cls((host, port), Handler)
    except OSError as e:
        raise MetricsError(f"cannot listen on metrics address {address!r}: {e.strerror or e}") from e
    return Server(httpd)
