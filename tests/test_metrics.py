"""reconciler.daemon.metrics: values after calls, scraped over real HTTP on 127.0.0.1:0."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.daemon.metrics import Metrics, MetricsError, parse_address
from reconciler.daemon.healthz import healthy, ready


# No proxies: an http_proxy in the environment must not intercept 127.0.0.1.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> tuple[int, str, str]:
    try:
        with _opener.open(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def served():
    m = Metrics()
    state = {"health": (True, "synced 3s ago")}
    srv = m.serve("127.0.0.1:0", lambda: state["health"])
    try:
        yield m, srv, state
    finally:
        srv.close()


def scrape(srv) -> dict:
    code, ctype, body = get(srv.url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    return samples(body)


def test_values_after_calls(served):
    m, srv, _ = served
    assert srv.port > 0
    s = scrape(srv)
    assert s[("nftrec_sync_failures_total", ())] == 0
    assert s[("nftrec_sync_duration_seconds_count", (("kind", "full"),))] == 0
    assert s[("nftrec_sync_duration_seconds_count", (("kind", "partial"),))] == 0
    assert not any(k[0] == "nftrec_applied_revision_info" for k in s)

    m.observe_sync("full", 0.25, ok=True)
    s = scrape(srv)
    t_ok = s[("nftrec_last_sync_timestamp_seconds", ())]
    assert t_ok > 1e9 and s[("nftrec_last_sync_attempt_timestamp_seconds", ())] == t_ok
    m.observe_sync("partial", 0.01, ok=False)
    m.observe_sync("partial", 0.02, ok=True)
    m.observe_sync("partial", 3.0, ok=False)
    m.set_counts("ip", rules=120, elements=40)
    m.set_counts("ip6", rules=7, elements=0)
    m.set_revisions("abc123", "abc123")
    m.set_revisions("abc123", "def456")  # a rejected revision: the old one stays applied
    m.drift_repaired(3)
    m.drift_repaired(0)  # a full sync without drift: not a repair
    m.drift_repaired(2)
    m.conntrack_deleted(4)
    m.conntrack_deleted(0)

    s = scrape(srv)
    assert s[("nftrec_sync_duration_seconds_count", (("kind", "full"),))] == 1
    assert s[("nftrec_sync_duration_seconds_sum", (("kind", "full"),))] == pytest.approx(0.25)
    assert s[("nftrec_sync_duration_seconds_count", (("kind", "partial"),))] == 3
    assert s[("nftrec_sync_duration_seconds_bucket", (("kind", "partial"), ("le", "0.016")))] == 1
    assert s[("nftrec_sync_failures_total", ())] == 2
    assert s[("nftrec_last_sync_attempt_timestamp_seconds", ())] >= s[("nftrec_last_sync_timestamp_seconds", ())] >= t_ok
    assert s[("nftrec_rules", (("family", "ip"),))] == 120
    assert s[("nftrec_set_elements", (("family", "ip"),))] == 40
    assert s[("nftrec_rules", (("family", "ip6"),))] == 7
    assert s[("nftrec_set_elements", (("family", "ip6"),))] == 0
    assert s[("nftrec_drift_repairs_total", ())] == 2
    assert s[("nftrec_drift_objects_repaired_total", ())] == 5
    assert s[("nftrec_conntrack_entries_deleted_total", ())] == 4
    applied = [k for k in s if k[0] == "nftrec_applied_revision_info"]
    attempted = [k for k in s if k[0] == "nftrec_attempted_revision_info"]
    assert applied == [("nftrec_applied_revision_info", (("revision", "abc123"),))]
    assert attempted == [("nftrec_attempted_revision_info", (("revision", "def456"),))]

    m.set_revisions("def456", None)  # one series at a time; None: no series
    s = scrape(srv)
    assert [k for k in s if k[0] == "nftrec_applied_revision_info"] == [
        ("nftrec_applied_revision_info", (("revision", "def456"),))]
    assert not any(k[0] == "nftrec_attempted_revision_info" for k in s)


def test_instances_do_not_share_state():
    a, b = Metrics(), Metrics()  # own registries: no "Duplicated timeseries" error
    a.conntrack_deleted(5)
    sa = samples(_text(a))
    sb = samples(_text(b))
    assert sa[("nftrec_conntrack_entries_deleted_total", ())] == 5
    assert sb[("nftrec_conntrack_entries_deleted_total", ())] == 0


def _text(m: Metrics) -> str:
    from prometheus_client import generate_latest
    return generate_latest(m.registry).decode()


def test_bad_arguments():
    m = Metrics()
    with pytest.raises(ValueError, match="sync kind"):
        m.observe_sync("fast", 1.0, True)
    with pytest.raises(ValueError):
        m.conntrack_deleted(-1)
    with pytest.raises(ValueError):
        m.drift_repaired(-1)


def test_healthz_flips(served):
    _, srv, state = served
    assert get(srv.url + "/healthz")[0::2] == (200, "ok: synced 3s ago\n")
    state["health"] = (False, "revision def456 is invalid")
    assert get(srv.url + "/healthz")[0::2] == (503, "unhealthy: revision def456 is invalid\n")
    state["health"] = (True, "synced")
    assert get(srv.url + "/healthz?verbose")[0] == 200


def test_readyz_is_served_apart_from_healthz():
    state = {"ready": (False, "revision def456 was not applied (removal-guard): ...")}
    srv = Metrics().serve("127.0.0.1:0", lambda: (True, "synced"), lambda: state["ready"])
    try:
        assert get(srv.url + "/healthz")[0::2] == (200, "ok: synced\n")
        assert get(srv.url + "/readyz")[0::2] == (503, "not ready: revision def456 was not applied (removal-guard): ...\n")
        state["ready"] = (True, "synced")
        assert get(srv.url + "/readyz")[0::2] == (200, "ok: synced\n")
    finally:
        srv.close()
    srv = Metrics().serve("127.0.0.1:0", lambda: (True, "synced"))  # no readiness given: no /readyz
    try:
        assert get(srv.url + "/readyz")[0] == 404
    finally:
        srv.close()


def test_healthz_check_raising_is_unhealthy():
    def boom():
        raise RuntimeError("state lock broken")
    srv = Metrics().serve("127.0.0.1:0", boom)
    try:
        code, _, body = get(srv.url + "/healthz")
        assert code == 503 and "state lock broken" in body
    finally:
        srv.close()


def test_404(served):
    _, srv, _ = served
    assert get(srv.url + "/")[0] == 404
    assert get(srv.url + "/metricsx")[0] == 404


def test_ipv6_loopback():
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.fail("no IPv6 sockets in this environment")
    srv = Metrics().serve("[::1]:0", lambda: (True, "x"))
    try:
        assert srv.url.startswith("http://[::1]:")
        assert get(srv.url + "/healthz")[0] == 200
    finally:
        srv.close()


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", ":9105", "::1:9105",
    "[127.0.0.1]:9105", "example.com:9105", "300.1.1.1:9105", "",
])
def test_bad_address_is_clear(address):
    with pytest.raises(MetricsError, match="bad metrics address"):
        Metrics().serve(address, lambda: (True, ""))


def test_parse_address():
    assert parse_address("127.0.0.1:9105") == ("127.0.0.1", 9105)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("[0:0::1]:1") == ("::1", 1)
    assert parse_address("localhost:9105") == ("127.0.0.1", 9105)


def test_address_in_use_is_clear():
    first = Metrics().serve("127.0.0.1:0", lambda: (True, ""))
    try:
        with pytest.raises(MetricsError, match=r"cannot listen on metrics address .*in use"):
            Metrics().serve(f"127.0.0.1:{first.port}", lambda: (True, ""))
    finally:
        first.close()


def test_close_frees_the_port():
    srv = Metrics().serve("127.0.0.1:0", lambda: (True, ""))
    port = srv.port
    srv.close()
    srv.close()  # idempotent
    again = Metrics().serve(f"127.0.0.1:{port}", lambda: (True, ""))
    again.close()


def test_a_refused_revision_is_healthy_while_the_last_good_ruleset_is_live():
    """healthz.healthy() describes the data plane: a refused newest revision (each kind) is
    named but fails /healthz only while nothing was applied; the gauge names the kind."""
    from types import SimpleNamespace

    from reconciler.daemon.reconcile import Daemon

    clock = [100.0]
    d = SimpleNamespace(invalid=None, rejected=None, repairs=None, config=None, started=0.0, last_success=90.0,
                        clock=lambda: clock[0], applied=SimpleNamespace(inventory=SimpleNamespace(revision="abc123")))
    d.refusal = lambda: Daemon.refusal(d)
    m = Metrics()
    assert healthy(d) == (True, "revision abc123 applied 10.0s ago")
    for why, field, value in [("invalid", "invalid", ("def456", "2 error(s) in the input", "invalid")),
                              ("unverified", "invalid", ("def456", "refused (unsigned): no signature", "unverified")),
                              ("removal-guard", "invalid", ("def456", "the revision would remove 6 of the 10 Services",
                                                            "removal-guard")),
                              ("rolled-back", "rejected", ("def456", "health check(s) did not pass"))]:
        d.invalid = d.rejected = None
        setattr(d, field, value)
        ok, text = healthy(d)
        assert ok and f"revision def456 was refused ({why}): {value[1]}" in text, text
        assert "the last good ruleset (revision abc123) stays in the kernel" in text, text
        assert ready(d) == (False, f"revision def456 was not applied ({why}): {value[1]}; revision abc123 stays in "
                                   f"the kernel")
        m.set_refused(Daemon.refusal(d)[0])
        got = samples(_scrape(m))
        assert {k[1][0][1]: v for k, v in got.items() if k[0] == "nftrec_revision_refused"} == {
            r: float(r == why) for r in ("invalid", "unverified", "rolled-back", "removal-guard")}, got
    rejected, d.rejected = d.rejected, None
    assert ready(d) == healthy(d) == (True, "revision abc123 applied 10.0s ago")
    d.rejected = rejected
    d.last_success = d.applied = None  # nothing applied yet: nothing good is live
    ok, text = healthy(d)
    assert not ok and text.startswith("no revision applied yet; revision def456 was refused (rolled-back)"), text
    m.set_refused(None)
    assert not [v for k, v in samples(_scrape(m)).items() if k[0] == "nftrec_revision_refused" and v]


def _scrape(m: Metrics) -> str:
    srv = m.serve("127.0.0.1:0", lambda: (True, "ok"))
    try:
        return get(srv.url + "/metrics")[2]
    finally:
        srv.close()
