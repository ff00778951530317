"""Topology-aware routing (issue 9 items 3 and 4).

- kube-proxy 1.35's topologyModeFromHints / availableForTopology (pkg/proxy/topology.go;
  PreferSameTrafficDistribution is GA there): node hints, then zone hints, then all;
- beyond kube-proxy: hints derived from spec.trafficDistribution the way the
  EndpointSlice controller's trafficdist heuristic writes them, when no slice has any;
- the NodeConfig switch, the schema/validation of hints, and what `plan` says.
"""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.compile.services import compile_ruleset
from reconciler.compile.topology import EndpointInfo, categorize_endpoints
from reconciler.compile.render import render_script
from reconciler.compile.topology import derive_hints, derive_slice, derived_topology_hints, topology_mode
from reconciler.compile import derived_topology_hints as exported_derived_topology_hints
from reconciler.engine.plan import format_text, make_plan, to_json
from reconciler.compile.ruleset import Ruleset
from reconciler.compile.layout import chain_range
from reconciler.intake.config import load_node_config
from reconciler.intake.inventory import read_inventory
from reconciler.intake.model import Endpoint, EndpointPort, EndpointSlice, Inventory, NodeConfig, Service, ServicePort
from reconciler.intake.report import run_validate

NODE = "node-a"
CFG = NodeConfig(NODE, node_ips=("192.168.0.2",), zone="zone-a")
CHAIN = "service-ULMVA6XW-ns1/svc1/tcp/p80"


def svc(td=None, **kw):
    return Service("ns1", "svc1", "ClusterIP", ("172.30.0.41",), ports=(ServicePort("p80", "TCP", 80, 80),),
                   traffic_distribution=td, **kw)


def ep(ip, node=None, zone=None, zones=None, nodes=None, **kw):
    return Endpoint((ip,), node_name=node, zone=zone, hint_zones=zones, hint_nodes=nodes, **kw)


def slc(*endpoints, name="svc1-abc", family="IPv4"):
    return EndpointSlice("ns1", name, "svc1", family, tuple(endpoints), (EndpointPort("p80", "TCP", 80),))


def targets(services, slices, config=CFG) -> list[str]:
    """The endpoint IPs the service chain DNATs to (sorted), [] when it rejects; the
    same in both layouts (sharded: through the chain's index range of its map)."""
    inv = Inventory(tuple(services), tuple(slices))
    text = render_script(compile_ruleset(inv, replace(config, layout="kube-proxy")))
    prefix = f"add rule ip nftrec {CHAIN} "
    rules = [l[len(prefix):] for l in text.splitlines() if l.startswith(prefix)]
    if not rules:
        got = []
    else:
        (rule,) = [r for r in rules if "dnat" in r]
        got = sorted(set(re.findall(r"(10\.180\.0\.\d+)", rule)))
    sharded = compile_ruleset(inv, replace(config, layout="sharded")).tables["ip"]
    chain = sharded.chains.get(CHAIN)
    rng = chain_range(chain) if chain is not None else None
    if rng is not None:
        m, k, n = rng
        values = [sharded.sets[m].elements[(str(i),)].value for i in range(k, k + n)]
        assert sorted(set(v.split(" . ")[0] for v in values)) == got
    else:
        assert got == [] or len(got) == 1 and chain is not None and chain.rules[-1].body.endswith(f"dnat to {got[0]}:80")
    return got


# --- topologyModeFromHints ------------------------------------------------------------------


def E(ip, ready=True, serving=True, terminating=False, local=False, zones=(), nodes=()):
    return EndpointInfo(ip, 80, ready, serving, terminating, local, frozenset(zones), frozenset(nodes))


def ips(eps_):
    return None if eps_ is None else [e.ip for e in eps_]


def cat(eps_, zone="zone-a", node=NODE, uses_local=False):
    return categorize_endpoints(eps_, uses_cluster=True, uses_local=uses_local, zone=zone, node_name=node)


def test_mode_same_node_when_every_ready_endpoint_has_node_hints_and_one_names_us():
    eps_ = [E("1", nodes=(NODE,)), E("2", nodes=("node-b",)), E("3", nodes=("node-b", NODE))]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameNode"
    c = cat(eps_)
    assert ips(c.cluster) == ["1", "3"] and ips(c.all_reachable) == ["1", "3"]


def test_mode_same_node_wins_over_zone_hints():
    eps_ = [E("1", nodes=(NODE,), zones=("zone-b",)), E("2", nodes=("node-b",), zones=("zone-a",))]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameNode"
    assert ips(cat(eps_).cluster) == ["1"]


def test_node_hints_for_other_nodes_only_fall_back_to_zone_hints():
    eps_ = [E("1", nodes=("node-b",), zones=("zone-a",)), E("2", nodes=("node-c",), zones=("zone-b",))]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameZone"
    assert ips(cat(eps_).cluster) == ["1"]


def test_node_hints_for_other_nodes_and_no_zone_hints_use_all():
    eps_ = [E("1", nodes=("node-b",)), E("2", nodes=("node-c",))]
    assert topology_mode(eps_, "zone-a", NODE) == ""
    assert ips(cat(eps_).cluster) == ["1", "2"]


def test_one_ready_endpoint_without_node_hints_ignores_node_hints():
    eps_ = [E("1", nodes=(NODE,), zones=("zone-a",)), E("2", zones=("zone-a",)), E("3", nodes=(NODE,), zones=("zone-b",))]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameZone"
    assert ips(cat(eps_).cluster) == ["1", "2"]
    # and without zone hints: everything
    eps_ = [E("1", nodes=(NODE,)), E("2")]
    assert topology_mode(eps_, "zone-a", NODE) == "" and ips(cat(eps_).cluster) == ["1", "2"]


def test_only_ready_endpoints_decide_the_mode():
    # a not-ready endpoint without hints does not break PreferSameNode ...
    eps_ = [E("1", nodes=(NODE,)), E("2", nodes=("node-b",)), E("3", ready=False)]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameNode" and ips(cat(eps_).cluster) == ["1"]
    # ... and a not-ready endpoint hinted for us does not make it
    eps_ = [E("1", nodes=("node-b",)), E("2", ready=False, serving=False, nodes=(NODE,))]
    assert topology_mode(eps_, "zone-a", NODE) == "" and ips(cat(eps_).cluster) == ["1"]


def test_no_ready_endpoints_no_topology_and_terminating_fallback_ignores_hints():
    eps_ = [E("1", ready=False, terminating=True, nodes=("node-b",)),
            E("2", ready=False, terminating=True, nodes=(NODE,))]
    assert topology_mode(eps_, "zone-a", NODE) == ""
    assert ips(cat(eps_).cluster) == ["1", "2"]


def test_same_node_with_local_policy_unions_cluster_and_local():
    eps_ = [E("1", nodes=(NODE,)), E("2", nodes=("node-b",)), E("3", nodes=("node-b",), local=True)]
    c = cat(eps_, uses_local=True)
    assert ips(c.cluster) == ["1"] and ips(c.local) == ["3"] and ips(c.all_reachable) == ["1", "3"]


def test_zone_hints_unchanged_without_node_hints():
    eps_ = [E("1", zones=("zone-a",)), E("2", zones=("zone-b",))]
    assert topology_mode(eps_, "zone-a", NODE) == "PreferSameZone"
    assert topology_mode(eps_, "zone-z", NODE) == ""


# --- node hints through the compiler ----------------------------------------------------------


def test_for_nodes_hints_compile_to_the_endpoints_named_for_this_node():
    s = svc()
    sl = slc(ep("10.180.0.1", node="node-b", nodes=(NODE,)), ep("10.180.0.2", node="node-b", nodes=("node-b",)),
             ep("10.180.0.3", node="node-c", nodes=("node-c", NODE)))
    assert targets([s], [sl]) == ["10.180.0.1", "10.180.0.3"]
    # another node that no hint names: all endpoints
    assert targets([s], [sl], replace(CFG, node_name="node-z")) == ["10.180.0.1", "10.180.0.2", "10.180.0.3"]
    # node-b: its own endpoint only
    assert targets([s], [sl], replace(CFG, node_name="node-b")) == ["10.180.0.2"]


def test_node_hints_from_yaml(tmp_path):
    (tmp_path / "a.yaml").write_text("""\
apiVersion: v1
kind: Service
metadata: {name: svc1, namespace: ns1}
spec:
  clusterIP: 172.30.0.41
  trafficDistribution: PreferSameNode
  ports: [{name: p80, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc1-abc, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
addressType: IPv4
ports: [{name: p80, port: 80}]
endpoints:
  - addresses: [10.180.0.1]
    hints: {forNodes: [{name: node-a}], forZones: [{name: zone-a}]}
  - addresses: [10.180.0.2]
    hints: {forNodes: [{name: node-b}]}
""")
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    (s,) = res.inventory.services
    assert s.traffic_distribution == "PreferSameNode"
    (sl,) = res.inventory.endpoint_slices
    assert [(e.hint_nodes, e.hint_zones) for e in sl.endpoints] == [(("node-a",), ("zone-a",)), (("node-b",), None)]
    assert targets(res.inventory.services, res.inventory.endpoint_slices) == ["10.180.0.1"]


# --- hints derived from trafficDistribution ---------------------------------------------------

SPREAD = (ep("10.180.0.1", node=NODE, zone="zone-a"), ep("10.180.0.2", node="node-b", zone="zone-a"),
          ep("10.180.0.3", node="node-c", zone="zone-b"))
ALL = ["10.180.0.1", "10.180.0.2", "10.180.0.3"]


def test_prefer_same_node_without_hints_uses_the_same_node_endpoint():
    assert targets([svc("PreferSameNode")], [slc(*SPREAD)]) == ["10.180.0.1"]


def test_prefer_same_node_without_an_endpoint_here_falls_back_to_the_zone_then_all():
    # derived forZones are the fallback, as in a cluster
    assert targets([svc("PreferSameNode")], [slc(*SPREAD)], replace(CFG, node_name="node-z")) == \
        ["10.180.0.1", "10.180.0.2"]
    assert targets([svc("PreferSameNode")], [slc(*SPREAD)], replace(CFG, node_name="node-z", zone="zone-q")) == ALL


@pytest.mark.parametrize("td", ["PreferSameZone", "PreferClose"])
def test_prefer_same_zone_and_prefer_close_derive_zone_hints_only(td):
    assert targets([svc(td)], [slc(*SPREAD)]) == ["10.180.0.1", "10.180.0.2"]
    assert targets([svc(td)], [slc(*SPREAD)], replace(CFG, zone="zone-b")) == ["10.180.0.3"]
    out, names = derive_hints(svc(td), [slc(*SPREAD)], CFG)
    assert names == ("svc1-abc",)
    assert all(e.hint_nodes is None for e in out[0].endpoints)
    assert [e.hint_zones for e in out[0].endpoints] == [("zone-a",), ("zone-a",), ("zone-b",)]


def test_switch_off_or_no_traffic_distribution_uses_all_endpoints():
    assert targets([svc("PreferSameNode")], [slc(*SPREAD)], replace(CFG, derive_topology_hints=False)) == ALL
    assert targets([svc(None)], [slc(*SPREAD)]) == ALL


def test_explicit_hints_on_a_ready_endpoint_leave_the_slice_as_written():
    # one ready endpoint carries a hint: nothing is derived for its slice, so not every
    # ready endpoint has hints and kube-proxy's rules use them all
    sl = slc(ep("10.180.0.1", node=NODE, zone="zone-a"), ep("10.180.0.2", node="node-b", zone="zone-a", zones=("zone-a",)),
             ep("10.180.0.3", node="node-c", zone="zone-b"))
    assert derive_slice(sl, True) is None
    assert targets([svc("PreferSameNode")], [sl]) == ALL
    # an empty hints list is no hint (kube-proxy reads it as none): derived
    sl = slc(ep("10.180.0.1", node=NODE, zones=()), ep("10.180.0.2", node="node-b"))
    assert targets([svc("PreferSameNode")], [sl]) == ["10.180.0.1"]


def test_hints_on_not_ready_endpoints_do_not_stop_derivation_and_are_kept():
    stale = ep("10.180.0.9", node="node-b", zone="zone-a", nodes=("node-b",), ready=False, serving=False)
    sl = slc(*SPREAD, stale)
    new = derive_slice(sl, True)
    assert new is not None and new.endpoints[-1] == stale  # untouched
    assert [e.hint_nodes for e in new.endpoints[:3]] == [(NODE,), ("node-b",), ("node-c",)]
    assert targets([svc("PreferSameNode")], [sl]) == ["10.180.0.1"]


def test_not_ready_endpoints_get_no_hints():
    sl = slc(ep("10.180.0.1", node=NODE), ep("10.180.0.2", node="node-b", ready=False, serving=True, terminating=True))
    new = derive_slice(sl, True)
    assert new.endpoints[0].hint_nodes == (NODE,) and new.endpoints[1].hint_nodes is None


def test_derivation_is_per_slice():
    explicit = slc(ep("10.180.0.1", node=NODE, nodes=("node-b",)), name="a-explicit")
    bare = slc(ep("10.180.0.2", node=NODE), ep("10.180.0.3", node="node-c"), name="b-bare")
    out, names = derive_hints(svc("PreferSameNode"), [explicit, bare], CFG)
    assert names == ("b-bare",) and out[0] is explicit
    # every ready endpoint now has node hints; .2 (derived) names this node, .1 (explicit) does not
    assert targets([svc("PreferSameNode")], [explicit, bare]) == ["10.180.0.2"]


def test_endpoints_without_node_name_or_zone_get_no_hints():
    sl = slc(ep("10.180.0.1"), ep("10.180.0.2"))
    assert derive_slice(sl, True) is None
    assert derive_hints(svc("PreferSameNode"), [sl], CFG)[1] == ()
    # a mix: the one without nodeName has no node hint, so node hints are ignored (all)
    sl = slc(ep("10.180.0.1", node=NODE), ep("10.180.0.2"))
    assert targets([svc("PreferSameNode")], [sl]) == ["10.180.0.1", "10.180.0.2"]


def test_fqdn_slices_are_not_derived():
    sl = slc(Endpoint(("a.example",), node_name=NODE), family="FQDN")
    assert derive_hints(svc("PreferSameNode"), [sl], CFG)[1] == ()


def test_derived_topology_hints_reports_services_and_slices():
    web = svc("PreferSameNode")
    other = replace(svc("PreferClose"), name="other")
    headless = replace(svc("PreferSameNode"), name="headless", cluster_ips=())
    slices = [slc(*SPREAD, name="b"), slc(*SPREAD[:1], name="a"),
              replace(slc(*SPREAD, name="o"), service_name="other"),
              replace(slc(*SPREAD, name="h"), service_name="headless"),
              replace(slc(ep("10.180.0.5", node=NODE, nodes=(NODE,)), name="x"), service_name="svc1")]
    got = derived_topology_hints([web, other, headless], slices, CFG)
    assert got == {"ns1/svc1": ("PreferSameNode", ("a", "b")), "ns1/other": ("PreferClose", ("o",))}
    assert derived_topology_hints([web, other], slices, replace(CFG, derive_topology_hints=False)) == {}
    assert exported_derived_topology_hints is derived_topology_hints


# --- plan ---------------------------------------------------------------------------------------


def test_plan_says_which_hints_were_derived():
    inv = Inventory((svc("PreferSameNode"),), (slc(*SPREAD),))
    desired = compile_ruleset(inv, CFG)
    derived = derived_topology_hints(inv.services, inv.endpoint_slices, CFG)
    plan = make_plan(desired, Ruleset(), {s.key: s for s in inv.services}, derived)
    text = format_text(plan)
    assert "+ ns1/svc1 ClusterIP 172.30.0.41:80/TCP -> 1 endpoint (topology hints derived: PreferSameNode)" in text
    assert "Note: topology hints derived from spec.trafficDistribution" in text and "ns1/svc1 (PreferSameNode: svc1-abc)" in text
    doc = to_json(plan)
    assert doc["derivedHints"] == [{"service": "ns1/svc1", "trafficDistribution": "PreferSameNode", "slices": ["svc1-abc"]}]
    # nothing to change: the note still shows how the ruleset was made
    from reconciler.kernel.live import canonical
    same = make_plan(desired, canonical(desired), {}, derived)
    assert same.empty and "Note: topology hints derived" in format_text(same)
    # nothing derived: no note, and the JSON field is an empty list
    plain = make_plan(desired, Ruleset())
    assert "topology hints" not in format_text(plain) and to_json(plain)["derivedHints"] == []


def test_plan_note_is_bounded():
    derived = {f"ns/s{i}": ("PreferClose", ("x",)) for i in range(10)}
    plan = make_plan(Ruleset(), Ruleset(), {}, derived)
    assert "and 7 more" in format_text(plan)


# --- node config -------------------------------------------------------------------------------


def test_config_switch(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("nodeName: n\n")
    cfg, problems = load_node_config(str(p), discover=False)
    assert not problems and cfg.derive_topology_hints is True
    p.write_text("nodeName: n\nderiveTopologyHints: false\n")
    cfg, problems = load_node_config(str(p), discover=False)
    assert not problems and cfg.derive_topology_hints is False
    p.write_text("nodeName: n\nderiveTopologyHints: 'no'\n")
    cfg, problems = load_node_config(str(p), discover=False)
    assert [(x.line, x.field) for x in problems] == [(2, "deriveTopologyHints")], problems
    assert "must be" in problems[0].message


# --- validation --------------------------------------------------------------------------------

SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
  - addresses: [10.244.0.1]
    hints:
{hints}
"""


def validate(tmp_path: Path, text: str) -> tuple[int, str]:
    (tmp_path / "f.yaml").write_text(text)
    out = io.StringIO()
    return run_validate(str(tmp_path), stream=out), out.getvalue()


@pytest.mark.parametrize("hints,where,what", [
    ("      forNodes: [{name: Node_A}]", "f.yaml:9:25: EndpointSlice default/web-1: endpoints[0].hints.forNodes[0].name:",
     "'Node_A' is not a node name"),
    ("      forZones: [{name: '-a'}]", "f.yaml:9:25: EndpointSlice default/web-1: endpoints[0].hints.forZones[0].name:",
     "is not a label value"),
    ("      forNodes: [" + ", ".join(f"{{name: n{i}}}" for i in range(9)) + "]",
     "f.yaml:9:7: EndpointSlice default/web-1: endpoints[0].hints.forNodes:", "at most 8"),
    ("      forZones: [" + ", ".join(f"{{name: z{i}}}" for i in range(9)) + "]",
     "f.yaml:9:7: EndpointSlice default/web-1: endpoints[0].hints.forZones:", "at most 8"),
    ("      forNodes: [{name: a}, {name: a}]", "f.yaml:9:36: EndpointSlice default/web-1: endpoints[0].hints.forNodes[1].name:",
     "node 'a' is already hinted in endpoints[0].hints.forNodes[0]"),
    ("      forZones: [{name: z}, {name: z}]", "f.yaml:9:36: EndpointSlice default/web-1: endpoints[0].hints.forZones[1].name:",
     "zone 'z' is already hinted"),
    ("      forNodes: [{nam: a}]", "f.yaml:9:18: EndpointSlice default/web-1: endpoints[0].hints.forNodes[0].name:",
     "name is required but missing"),
])
def test_invalid_hints_are_refused_with_file_and_line(tmp_path, hints, where, what):
    rc, out = validate(tmp_path, SLICE.format(hints=hints))
    assert rc == 1 and where in out and what in out, out


def test_valid_hints_and_traffic_distribution(tmp_path):
    text = SLICE.format(hints="      forNodes: [{name: edge-1.example}]\n      forZones: [{name: ''}, {name: a_b.c}]")
    text += ("---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n"
             "  trafficDistribution: PreferSameNode\n  ports: [{name: http, port: 80, targetPort: 8080}]\n")
    rc, out = validate(tmp_path, text)
    assert rc == 0, out


def test_invalid_traffic_distribution(tmp_path):
    rc, out = validate(tmp_path, "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.10\n"
                                 "  trafficDistribution: PreferSameRack\n  ports: [{port: 80}]\n")
    assert rc == 1 and "f.yaml:6:24: Service default/web: spec.trafficDistribution:" in out
    assert "use PreferClose, PreferSameZone or PreferSameNode" in out, out


def test_legacy_endpoints_are_derived_too(tmp_path):
    (tmp_path / "a.yaml").write_text("""\
apiVersion: v1
kind: Service
metadata: {name: svc1, namespace: ns1}
spec:
  clusterIP: 172.30.0.41
  trafficDistribution: PreferSameNode
  ports: [{name: p80, port: 80}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: svc1, namespace: ns1}
subsets:
  - addresses: [{ip: 10.180.0.1, nodeName: node-a}, {ip: 10.180.0.2, nodeName: node-b}]
    ports: [{name: p80, port: 80}]
""")
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    inv = res.inventory
    assert targets(inv.services, inv.endpoint_slices) == ["10.180.0.1"]
    assert targets(inv.services, inv.endpoint_slices, replace(CFG, derive_topology_hints=False)) == \
        ["10.180.0.1", "10.180.0.2"]
