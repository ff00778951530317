"""examples/grafana/nftrec-dashboard.json queries only metrics nftrec exports.

The metric names are parsed out of every PromQL expression (panel targets and the
template variables' label_values queries) and compared with the sample names that a
real daemon.Metrics registry exposes in generate_latest's text format, so a renamed
metric, a typo or a missing `_total` breaks this test instead of an empty panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from reconciler.daemon.metrics import Metrics, ProbeMetrics

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana" / "nftrec-dashboard.json"

# PromQL words that look like identifiers but name no metric
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
             "unless", "inf", "nan", "atan2"}
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions,
    keywords, label names (inside {...} or by/on/... lists), durations or variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range and subquery durations
    e = _LABEL_LISTS.sub(" ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # Grafana variables ($__range, ${instance})
    names = set()
    for m in _IDENT.finditer(e):
        word, before, after = m.group(), e[:m.start()], e[m.end():]
        if before[-1:].isdigit() or before[-1:] == ".":  # 1e3, 5m after `offset`
            continue
        if after.lstrip().startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function call, an aggregation, or a keyword
        names.add(word)
    return names


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every label_values() variable."""
    out = []
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} target {t['refId']}", t["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", q)
        assert m, f"variable {var['name']}: unexpected query {q!r}"
        out.append((f"variable {var['name']}", m.group(1)))
    return out


def exported_names() -> set[str]:
    """Every sample name a live registry exposes, with every series populated."""
    m = Metrics()
    m.observe_sync("full", 0.1, ok=True)
    m.observe_sync("partial", 0.01, ok=False)
    m.set_counts("ip", 10, 20)
    m.set_revisions("abc", "def")
    m.drift_repaired(2)
    m.conntrack_deleted(1)
    m.rolled_back()
    m.source_failed("unreachable")  # `watch oci://...` (daemon/fetcher.py)
    m.set_rollout("canary", 0, "held", 1.0)  # a fleet node holding a revision (daemon/rollout.py)
    probes = ProbeMetrics(m.registry)  # registered when `watch` runs readiness probes
    probes.results.labels("default/web", "success").inc()
    probes.down.labels("default/web").set(1)
    probes.probed.set(2)
    probes.transitions.labels("default/web", "down").inc()
    text = generate_latest(m.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_extractor_finds_names_and_skips_everything_else():
    expr = ('histogram_quantile(0.95, sum by (le, kind) (rate(nftrec_sync_duration_seconds_bucket'
            '{instance=~"$instance", kind="full"}[$__rate_interval]))) + on (instance) group_left '
            'nftrec_rules offset 5m - time() > bool 1e3 unless up{job="x"}')
    assert metric_names(expr) == {"nftrec_sync_duration_seconds_bucket", "nftrec_rules", "up"}
    # a misspelt name is found, and is not exported: the check below would fail on it
    assert metric_names("rate(nftrec_sync_failure_total[5m])") == {"nftrec_sync_failure_total"}
    assert "nftrec_sync_failure_total" not in exported_names()


def test_the_dashboard_is_grafana_json_with_panels_and_variables():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    assert len(d["panels"]) >= 6
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "instance"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("where,expr", queries(json.loads(DASHBOARD.read_text())))
def test_every_query_names_only_exported_metrics(where, expr):
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - exported_names()
    assert not unknown, f"{where}: {sorted(unknown)} not exported by nftrec; {expr!r}"


def test_every_exported_metric_has_a_panel():
    """A new metric shows up in the dashboard too (`_created` samples are bookkeeping)."""
    used = {n for _, e in queries(json.loads(DASHBOARD.read_text())) for n in metric_names(e)}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported_names() if not n.endswith("_created")}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families - shown == set()
