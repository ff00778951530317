"""The fleet projection's core: fleet.yaml (parse_fleet), a node's layers (selectors with
Kubernetes' semantics, paths substituted and checked), variables in documents (defined,
undefined with file:line, escaped, a bad value named), removal stubs and the merge by
(kind, namespace, name). A property test checks the whole against a from-scratch merge
written here with plain dicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.intake.fleet import Env, Identity, Requirement, Selector, node_layers, parse_fleet, project
from reconciler.intake.fleetmerge import check_fleet_document, is_removal, merge, substitute_document, uses_variables
from reconciler.intake.load import Document, read_file
from reconciler.intake.model import Source
from reconciler.intake.validate import check_tree

FLEET = "root/fleet.yaml"


def fleet_of(text: str):
    fleet, problems = parse_fleet(FLEET, text.encode())
    assert problems == [] and fleet is not None, [str(p) for p in problems]
    return fleet


def fleet_problems(text: str) -> list[str]:
    fleet, problems = parse_fleet(FLEET, text.encode())
    assert fleet is None and problems
    return [str(p) for p in problems]


HEAD = "apiVersion: nftrec/v1alpha1\nkind: Fleet\n"


# --- selectors: Kubernetes' semantics ------------------------------------------------------
#
# Cases from kubernetes/kubernetes staging/src/k8s.io/apimachinery/pkg/labels/selector_test.go
# (TestSelectorMatches, TestRequirementSelectorMatching) and
# staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/helpers_test.go (TestLabelSelectorAsSelector:
# an empty selector is Everything; matchLabels and matchExpressions are ANDed).

def req(key, op, *values):
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


SELECTOR_CASES = [
    # (selector as written in fleet.yaml, node labels, matches)
    ({}, {"x": "y"}, True),  # Everything
    ({}, {}, True),
    ({"matchLabels": {"x": "y"}}, {"x": "y"}, True),
    ({"matchLabels": {"x": "y", "z": "w"}}, {"x": "y", "z": "w"}, True),
    ({"matchLabels": {"x": "y"}}, {"x": "z"}, False),
    ({"matchLabels": {"x": "z"}}, {}, False),
    ({"matchLabels": {"x": "y", "z": "w"}}, {"x": "w", "z": "w"}, False),
    ({"matchLabels": {"foo": "bar", "foobar": "bar", "baz": "blah"}}, {"foo": "bar", "baz": "blah"}, False),
    ({"matchExpressions": [req("x", "NotIn", "y"), req("z", "NotIn", "w")]}, {"x": "z", "z": "a"}, True),
    ({"matchExpressions": [req("x", "NotIn", "y"), req("z", "NotIn", "w")]}, {"x": "z", "z": "w"}, False),
    ({"matchExpressions": [req("x", "Exists")]}, {"x": "z"}, True),
    ({"matchExpressions": [req("x", "Exists")]}, {"y": "z"}, False),
    ({"matchExpressions": [req("x", "DoesNotExist")]}, {"y": "z"}, True),
    ({"matchExpressions": [req("x", "DoesNotExist")]}, {"x": "z"}, False),
    ({"matchExpressions": [req("x", "In", "foo"), req("y", "NotIn", "alpha")]}, {"x": "foo", "y": "baz"}, True),
    ({"matchExpressions": [req("x", "In", "foo"), req("y", "In", "alpha")]}, {"x": "foo", "y": "baz"}, False),
    # a missing key: NotIn and DoesNotExist match, In and Exists do not
    ({"matchExpressions": [req("x", "NotIn", ""), req("y", "Exists")]}, {"y": ""}, True),
    ({"matchExpressions": [req("x", "DoesNotExist"), req("y", "Exists")]}, {"y": ""}, True),
    ({"matchExpressions": [req("x", "NotIn", ""), req("y", "DoesNotExist")]}, {"y": ""}, False),
    ({"matchExpressions": [req("x", "In", "")]}, {"y": "baz"}, False),
    ({"matchExpressions": [req("x", "In", "a", "b")]}, {"x": "b"}, True),
    ({"matchExpressions": [req("x", "NotIn", "a", "b")]}, {"x": "b"}, False),
    # matchLabels and matchExpressions ANDed (TestLabelSelectorAsSelector's foo=bar, baz in (norf,qux))
    ({"matchLabels": {"foo": "bar"}, "matchExpressions": [req("baz", "In", "qux", "norf")]},
     {"foo": "bar", "baz": "norf"}, True),
    ({"matchLabels": {"foo": "bar"}, "matchExpressions": [req("baz", "In", "qux", "norf")]},
     {"foo": "bar", "baz": "other"}, False),
    ({"matchLabels": {"foo": "bar"}, "matchExpressions": [req("baz", "In", "qux", "norf")]}, {"baz": "qux"}, False),
    ({"matchLabels": {"example.com/ring": "canary"}}, {"example.com/ring": "canary"}, True),
]


@pytest.mark.parametrize("selector, labels, matches", SELECTOR_CASES)
def test_selector_semantics_are_kubernetes(selector, labels, matches):
    text = HEAD + "layers:\n- path: base\n- path: picked\n  selector: " + json.dumps(selector) + "\n"
    fleet = fleet_of(text)
    p = node_layers(fleet, Identity("n1", tuple(sorted(labels.items()))))
    assert p.problems == ()
    assert [layer.rel for layer in p.layers] == (["base", "picked"] if matches else ["base"])
    assert fleet.layers[1].selector.matches(labels) is matches


def test_selector_object():
    sel = Selector((("tier", "edge"),), (Requirement("site", "In", ("lyon", "nice")),))
    assert sel.matches({"tier": "edge", "site": "nice"})
    assert not sel.matches({"tier": "edge"})
    assert Selector().matches({})


# --- parse_fleet ------------------------------------------------------------------------------


def test_parse_fleet_valid():
    fleet = fleet_of(HEAD + """\
x-owner: ops team
layers:
- path: base
- path: sites/${labels.site}
  selector:
    matchLabels: {tier: edge}
    matchExpressions:
    - {key: ring, operator: NotIn, values: [canary]}
    - {key: example.com/gone, operator: DoesNotExist, values: []}
- path: nodes/${nodeName}
  optional: true
variables: {dnsIP: 172.30.0.10, zone: "7"}
""")
    assert fleet.file == FLEET
    assert [(layer.path, layer.optional, layer.line) for layer in fleet.layers] == [
        ("base", False, 5), ("sites/${labels.site}", False, 6), ("nodes/${nodeName}", True, 12)]
    assert fleet.layers[0].selector is None
    assert fleet.layers[1].selector == Selector(
        (("tier", "edge"),), (Requirement("ring", "NotIn", ("canary",)), Requirement("example.com/gone", "DoesNotExist")))
    assert fleet.variables == (("dnsIP", "172.30.0.10"), ("zone", "7"))


@pytest.mark.parametrize("body, expected", [
    ("layers: [{path: base}]\nrollout: {interval: 30m}\n", "root/fleet.yaml:4:1: Fleet: rollout.waves: waves is required"),
    ("layers: [{path: base, selectr: {}}]\n", "root/fleet.yaml:3:23: Fleet: layers[0].selectr: unknown key 'selectr'"),
    ("layers: []\n", "root/fleet.yaml:3:1: Fleet: layers: has 0 entries; it must have at least 1"),
    ("variables: {}\n", "root/fleet.yaml:1:1: Fleet: layers: layers is required but missing"),
    ("layers:\n- optional: true\n", "root/fleet.yaml:4:3: Fleet: layers[0].path: path is required but missing"),
    ("layers:\n- path: ''\n", "root/fleet.yaml:4:9: Fleet: layers[0].path: '' has 0 characters; it must be at least 1"),
    ("layers:\n- path: a\n  optional: yes\n", "root/fleet.yaml:5:13: Fleet: layers[0].optional: 'yes' is a boolean only "
                                              "to YAML 1.1; write true"),
    ("layers:\n- path: a\n  selector: no\n", "root/fleet.yaml:5:13: Fleet: layers[0].selector: must be a mapping, not a "
                                             "string ('no')"),
    ("layers:\n- path: a\n  selector: {matchLabels: {site: 12}}\n",
     "root/fleet.yaml:5:34: Fleet: layers[0].selector.matchLabels.site: must be a string, not a whole number (12)"),
    ("layers:\n- path: a\n  selector: {matchLabels: {-bad: x}}\n",
     "root/fleet.yaml:5:14: Fleet: layers[0].selector.matchLabels: '-bad' is not a label key"),
    ("layers:\n- path: a\n  selector: {matchLabels: {site: 'a b'}}\n",
     "root/fleet.yaml:5:34: Fleet: layers[0].selector.matchLabels.site: 'a b' is not a label value"),
    ("layers:\n- path: a\n  selector:\n    matchExpressions: [{key: site, operator: Equals, values: [a]}]\n",
     "root/fleet.yaml:6:46: Fleet: layers[0].selector.matchExpressions[0].operator: 'Equals' is not allowed; use In, "
     "NotIn, Exists or DoesNotExist"),
    ("layers:\n- path: a\n  selector:\n    matchExpressions:\n    - {key: site, operator: In}\n",
     "root/fleet.yaml:7:7: Fleet: layers[0].selector.matchExpressions[0]: operator In needs at least one value"),
    ("layers:\n- path: a\n  selector:\n    matchExpressions:\n    - {key: site, operator: NotIn, values: []}\n",
     "root/fleet.yaml:7:7: Fleet: layers[0].selector.matchExpressions[0]: operator NotIn needs at least one value"),
    ("layers:\n- path: a\n  selector:\n    matchExpressions:\n    - {key: site, operator: Exists, values: [a]}\n",
     "root/fleet.yaml:7:37: Fleet: layers[0].selector.matchExpressions[0].values: operator Exists takes no values"),
    ("layers:\n- path: a\n  selector:\n    matchExpressions:\n    - {operator: Exists}\n",
     "root/fleet.yaml:7:7: Fleet: layers[0].selector.matchExpressions[0].key: key is required but missing"),
    ("layers: [{path: a}]\nvariables: {1st: x}\n", "root/fleet.yaml:4:1: Fleet: variables: '1st' is not a variable name"),
    ("layers: [{path: a}]\nvariables: {big: " + "x" * 254 + "}\n",
     "root/fleet.yaml:4:18: Fleet: variables.big: 'xxxxxxxx"),
    ("layers: [{path: a}]\nvariables: {port: 8080}\n",
     "root/fleet.yaml:4:19: Fleet: variables.port: must be a string, not a whole number (8080)"),
])
def test_parse_fleet_schema_errors(body, expected):
    problems = fleet_problems(HEAD + body)
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize("text, expected", [
    ("apiVersion: v1\nkind: Fleet\nlayers: [{path: a}]\n", "root/fleet.yaml:1:13: Fleet: apiVersion: 'v1' is not allowed; use nftrec/v1alpha1"),
    ("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nlayers: [{path: a}]\n",
     "root/fleet.yaml:2:7: Fleet: kind: 'NodeConfig' is not allowed; use Fleet"),
    ("", "root/fleet.yaml: Fleet: is empty; fleet.yaml is one mapping"),
    (HEAD + "layers: [{path: a}]\n---\n" + HEAD + "layers: [{path: b}]\n", "root/fleet.yaml: Fleet: holds 2 YAML documents"),
    ("- a\n", "root/fleet.yaml:1:1: Fleet: this document is a list"),
    (HEAD + "layers: [{path: a}\n", "root/fleet.yaml:4:1: Fleet: YAML syntax error"),
    (HEAD + "layers: [{path: a}]\nlayers: [{path: b}]\n", "root/fleet.yaml:4:1: Fleet: the key 'layers' appears twice"),
])
def test_parse_fleet_file_errors(text, expected):
    problems = fleet_problems(text)
    assert any(p.startswith(expected) for p in problems), problems


def test_parse_fleet_reports_every_problem_at_once():
    problems = fleet_problems(HEAD + "layers:\n- path: ''\n- path: b\n  selector:\n    matchExpressions:\n"
                              "    - {key: k, operator: In}\nrollout: {waves: [{name: a}]}\n")
    assert [p.split(": ")[2] for p in problems] == ["layers[0].path", "layers[1].selector.matchExpressions[0]",
                                                    "rollout.interval", "rollout.waves[0]"]


# --- node_layers ------------------------------------------------------------------------------


LAYERED = HEAD + """\
layers:
- path: base
- path: sites/${labels.site}
  selector: {matchLabels: {tier: edge}}
- path: rings/canary
  selector:
    matchExpressions: [{key: ring, operator: In, values: [canary]}]
- path: nodes/${nodeName}
  optional: true
variables: {region: eu/west, up: "../etc", hidden: .git}
"""


def test_node_layers_order_selectors_optional():
    fleet = fleet_of(LAYERED)
    p = node_layers(fleet, Identity("edge-7", (("ring", "canary"), ("site", "lyon"), ("tier", "edge"))))
    assert p.ok and p.problems == ()
    assert [(x.index, x.rel, x.optional, x.line) for x in p.layers] == [
        (0, "base", False, 4), (1, "sites/lyon", False, 5), (2, "rings/canary", False, 7), (3, "nodes/edge-7", True, 10)]
    assert p.env == Env("edge-7", (("ring", "canary"), ("site", "lyon"), ("tier", "edge")),
                        (("hidden", ".git"), ("region", "eu/west"), ("up", "../etc")))
    # a node the selectors leave out: its unmatched layer's variables are never needed
    p = node_layers(fleet, Identity("core-1", (("tier", "core"),)))
    assert p.ok and [x.rel for x in p.layers] == ["base", "nodes/core-1"]


def test_undefined_variable_in_a_layer_path_names_the_node_and_line():
    p = node_layers(fleet_of(LAYERED), Identity("edge-9", (("tier", "edge"),)))
    assert not p.ok
    assert [str(x) for x in p.problems] == [
        "root/fleet.yaml:5:1: Fleet: layers[1].path: ${labels.site} is undefined for node edge-9 (it has no label "
        "'site'); add the label to its node config (nodeLabels), or give the layer a selector that requires it "
        "(matchExpressions: [{key: site, operator: Exists}])"]
    assert [x.rel for x in p.layers] == ["base", "nodes/edge-9"]  # the others still resolved, for the report


@pytest.mark.parametrize("path, why", [
    ("x/${vars.nope}", "${vars.nope} is undefined for node n1 (fleet.yaml has no variable 'nope'); add it under variables"),
    ("x/${}", "${} is undefined for node n1 (no such variable); use ${nodeName}, ${labels.KEY} or ${vars.NAME}"),
    ("x/${node}", "${node} is undefined for node n1 (no such variable)"),
    ("x/${vars.up}", "'x/../etc' ('x/${vars.up}' for node n1) leaves its directory with '..'"),
    ("${vars.up}/x", "'../etc/x' ('${vars.up}/x' for node n1) leaves its directory with '..'"),
    ("a/../b", "'a/../b' leaves its directory with '..'"),
    ("/etc/nftrec", "'/etc/nftrec' is an absolute path"),
    ("x/${vars.hidden}", "'x/.git' ('x/${vars.hidden}' for node n1) has a component starting with '.'"),
    ("./base", "'./base' has a component starting with '.'"),
    ("//", "'//' is an absolute path"),
    ("x/${vars.none}", "${vars.none} is '' for node n1 (fleet.yaml's variable none); a value in a layer path must name a "
                       "directory"),
    ("x/${vars.edge}", "${vars.edge} is 'a/' for node n1"),
    ("x${vars.root}", "${vars.root} is '/' for node n1"),
    ("x/${labels.site}", "${labels.site} is '' for node n1 (the node's label site)"),
    ("${vars.dots}", "'..' ('${vars.dots}' for node n1) leaves its directory"),
    ('"a\\tb"', "'a\\tb' contains a control character"),
])
def test_layer_paths_refused(path, why):
    p = node_layers(fleet_of(HEAD + f"layers:\n- path: base\n- path: {path}\nvariables: {{up: '../etc', hidden: .git, none: '', edge: a/, root: /, dots: '..'}}\n"),
                    Identity("n1", (("site", ""),)))
    assert [x.rel for x in p.layers] == ["base"]
    assert len(p.problems) == 1 and p.problems[0].field == "layers[1].path" and p.problems[0].line == 5
    assert p.problems[0].message.startswith(why), p.problems[0].message


def test_layer_path_cleaned_and_slash_in_a_value_adds_depth():
    fleet = fleet_of(HEAD + "layers:\n- path: base/\n- path: sites//${vars.region}\n- path: a/$${x}\n"
                     "variables: {region: eu/west}\n")
    p = node_layers(fleet, Identity("n1"))
    assert p.ok and [x.rel for x in p.layers] == ["base", "sites/eu/west", "a/${x}"]


@pytest.mark.parametrize("second, how", [
    ("base", "'base' is the same directory as layers[0] ('base', line 4)"),
    ("base/", "'base' is the same directory as layers[0]"),
    ("base/extra", "'base/extra' is nested with layers[0] ('base', line 4)"),
    ("${labels.top}", "'base' is the same directory as layers[0]"),
])
def test_equal_or_nested_layers_refused(second, how):
    p = node_layers(fleet_of(HEAD + f"layers:\n- path: base\n- path: '{second}'\n"), Identity("n1", (("top", "base"),)))
    assert [x.rel for x in p.layers] == ["base"]
    assert [x.message for x in p.problems][0].startswith(how)
    # the other way round: the outer layer after the inner one
    p = node_layers(fleet_of(HEAD + "layers:\n- path: base/extra\n- path: base\n"), Identity("n1"))
    assert p.problems[0].message.startswith("'base' is nested with layers[0] ('base/extra', line 4)")


def test_siblings_with_a_common_prefix_are_not_nested():
    p = node_layers(fleet_of(HEAD + "layers:\n- path: base\n- path: base-2\n- path: base2/x\n"), Identity("n1"))
    assert p.ok and [x.rel for x in p.layers] == ["base", "base-2", "base2/x"]


def test_project_carries_fleet_problems():
    p = project(FLEET, (HEAD + "layers: []\n").encode(), Identity("n1"))
    assert p.fleet is None and not p.ok and p.problems[0].field == "layers"
    p = project(FLEET, LAYERED.encode(), Identity("n1"))
    assert p.ok and [x.rel for x in p.layers] == ["base", "nodes/n1"]


# --- documents: substitution ------------------------------------------------------------------


ENV = Env("edge-7", (("example.com/zone", "z1"), ("ip", "10.96.0.300"), ("site", "lyon")), (("dnsIP", "172.30.0.10"),))


def read_docs(tmp_path: Path, text: str, name: str = "svc.yaml") -> list[Document]:
    f = tmp_path / name
    f.write_text(text)
    problems: list = []
    docs: list[Document] = []
    read_file(f"root/base/{name}", f, problems, docs)
    assert problems == []
    return docs


SUBSTITUTED = """\
apiVersion: v1
kind: Service
metadata:
  name: dns-${labels.site}
  labels: {"${nodeName}": keep, site: "${labels.site}", zone: "${labels.example.com/zone}"}
  annotations: {note: "costs $${HOME} and $$ {x}"}
spec:
  clusterIP: ${vars.dnsIP}
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  sessionAffinity: None
"""


def test_substitute_document_defined_escaped_keys_and_non_strings_untouched(tmp_path):
    doc, = read_docs(tmp_path, SUBSTITUTED)
    before = json.dumps(doc.data, sort_keys=True)
    new, subs, problems = substitute_document(doc, ENV)
    assert problems == []
    assert new.data["metadata"] == {"name": "dns-lyon", "labels": {"${nodeName}": "keep", "site": "lyon", "zone": "z1"},
                                    "annotations": {"note": "costs ${HOME} and $$ {x}"}}
    assert new.data["spec"]["clusterIP"] == "172.30.0.10"
    assert new.data["spec"]["ports"] == [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}]
    # copy-on-write: the original is untouched, unchanged parts are shared
    assert json.dumps(doc.data, sort_keys=True) == before
    assert new.data["spec"]["ports"] is doc.data["spec"]["ports"]
    assert new.source == doc.source and new.file == doc.file and new.src is doc.src
    assert {k: [(s.variable, s.value) for s in v] for k, v in subs.items()} == {
        "metadata.name": [("labels.site", "lyon")],
        "metadata.labels.site": [("labels.site", "lyon")],
        "metadata.labels.zone": [("labels.example.com/zone", "z1")],
        "spec.clusterIP": [("vars.dnsIP", "172.30.0.10")],
    }
    # an escape alone substitutes nothing but still changes the text
    assert "metadata.annotations.note" not in subs
    # a value is never substituted again
    again, _, problems = substitute_document(doc, Env("${vars.dnsIP}", (("example.com/zone", "z"), ("site", "${nodeName}")),
                                                          ENV.variables))
    assert problems == [] and again.data["metadata"]["name"] == "dns-${nodeName}"


def test_substitute_document_without_variables_is_the_same_document(tmp_path):
    doc, = read_docs(tmp_path, "apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: {'${x}': y}}\n"
                     "spec: {clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: 8080}]}\n")
    new, subs, problems = substitute_document(doc, ENV)
    assert new is doc and subs == {} and problems == []
    assert not uses_variables(doc)
    assert uses_variables(read_docs(tmp_path, SUBSTITUTED)[0])
    assert uses_variables(read_docs(tmp_path, "kind: Service\nspec: {ports: [{name: '$${x}'}]}\n")[0])


def test_undefined_variable_in_a_document_has_file_line_col(tmp_path):
    docs = read_docs(tmp_path, "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n" + SUBSTITUTED.replace(
        "site: \"${labels.site}\"", "site: \"${labels.rack}\""))
    new, subs, problems = substitute_document(docs[1], ENV)
    assert [str(p) for p in problems] == [
        "root/base/svc.yaml:9:39: Service default/dns-lyon: metadata.labels.site: ${labels.rack} is undefined for node "
        "edge-7 (it has no label 'rack'); add the label to its node config (nodeLabels), or move this object to a layer "
        "whose selector requires it"]
    assert new.data["metadata"]["labels"]["site"] == "${labels.rack}"  # left as written
    _, check = check_fleet_document(docs[1], ENV)
    assert [p.field for p in check.problems] == ["metadata.labels.site"]  # not also its schema error


def test_a_bad_value_from_a_label_is_a_schema_error_naming_the_label(tmp_path):
    doc, = read_docs(tmp_path, SUBSTITUTED.replace("${vars.dnsIP}", "${labels.ip}"))
    new, check = check_fleet_document(doc, ENV)
    assert [str(p) for p in check.problems] == [
        "root/base/svc.yaml:8:14: Service default/dns-lyon: spec.clusterIP: '10.96.0.300' is not an IP address, \"None\" "
        "for a headless Service, or empty (the value comes from ${labels.ip} = '10.96.0.300', the node's label ip)"]
    assert check.obj is not None and not check.obj.valid and check.obj.doc is new


def test_a_substituted_number_stays_a_string(tmp_path):
    doc, = read_docs(tmp_path, "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  clusterIP: 10.96.0.1\n"
                     "  ports: [{port: \"${vars.p}\", targetPort: 80}]\n")
    _, check = check_fleet_document(doc, Env("n", (), (("p", "8080"),)))
    assert [(p.field, p.message) for p in check.problems] == [
        ("spec.ports[0].port", "must be a whole number, not a string ('8080'); write it without quotes (the value comes "
                               "from ${vars.p} = '8080', fleet.yaml's variable p)")]


# --- documents: removal stubs -----------------------------------------------------------------


def doc(data: dict, line: int = 1, file: str = "root/l/a.yaml") -> Document:
    return Document(data, Source(file, line, 1), file, 0, (), None)


def svc(name, ns=None, ip="10.96.0.1", port=80, **extra) -> dict:
    meta = {"name": name, **({"namespace": ns} if ns is not None else {})}
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": ip, "ports": [{"port": port, "targetPort": port}], **extra}}


def stub(kind, name, ns=None, value="true") -> dict:
    meta = {"name": name, "annotations": {"fleet.nftrec.io/remove": value}}
    if ns is not None:
        meta["namespace"] = ns
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def test_removal_stub_is_not_validated_as_an_object():
    d = doc(stub("Service", "web"))
    assert is_removal(d)
    new, check = check_fleet_document(d, ENV)
    assert check.obj is None and check.problems == () and check.unknown_kind is None


@pytest.mark.parametrize("data, field, message", [
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"annotations": {"fleet.nftrec.io/remove": "true"}}},
     "metadata.name", "a removal stub (fleet.nftrec.io/remove: \"true\") needs the kind"),
    (stub("ConfigMap", "x"), "kind", "a removal stub"),
    (stub("Service", "web", value="yes"), "metadata.annotations['fleet.nftrec.io/remove']",
     "'yes' is not allowed; write \"true\" to remove the object an earlier layer defines, or leave the annotation out"),
    (stub("Service", "web", value=True), "metadata.annotations['fleet.nftrec.io/remove']",
     "True is not allowed; write \"true\" to remove the object an earlier layer defines, quoted"),
])
def test_bad_removal_stubs(data, field, message):
    _, check = check_fleet_document(doc(data), ENV)
    assert check.obj is None
    assert [p.field for p in check.problems] == [field]
    assert check.problems[0].message.startswith(message), check.problems[0].message


def test_remove_false_is_an_ordinary_object():
    d = doc(svc("web", meta={"annotations": {"fleet.nftrec.io/remove": "false"}}))
    assert not is_removal(d)
    _, check = check_fleet_document(d, ENV)
    assert check.obj is not None and check.obj.valid and check.problems == ()


def test_a_stub_is_substituted():
    d = doc(stub("Service", "dns-${labels.site}", value="${vars.gone}"))
    new, check = check_fleet_document(d, Env("n", (("site", "lyon"),), (("gone", "true"),)))
    assert is_removal(new) and new.data["metadata"]["name"] == "dns-lyon" and check.problems == ()


# --- merge --------------------------------------------------------------------------------------


def run(layered: list[tuple[int, dict]], env: Env = ENV):
    docs, checks, layers = [], [], []
    for i, (layer, data) in enumerate(layered):
        new, check = check_fleet_document(doc(data, line=i + 1, file=f"root/l{layer}/f.yaml"), env)
        docs.append(new)
        checks.append(check)
        layers.append(layer)
    return merge(docs, checks, layers)


def test_later_layer_replaces_the_object_whole():
    first = svc("web", ip="10.96.0.1", sessionAffinity="ClientIP", meta={"labels": {"a": "b"}})
    later = svc("web", ns="default", ip="10.96.0.2")
    docs, checks, problems = run([(0, first), (0, svc("other", ip="10.96.0.9")), (1, later)])
    assert problems == []
    assert [d.data for d in docs] == [svc("other", ip="10.96.0.9"), later]
    assert "sessionAffinity" not in docs[1].data["spec"] and "labels" not in docs[1].data["metadata"]
    assert [c.obj.doc for c in checks] == docs
    assert check_tree([], docs, checks).ok


def test_identity_is_kind_namespace_name():
    docs, _, problems = run([(0, svc("web")), (0, svc("web", ns="other", ip="10.96.0.3")),
                             (0, {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web"}, "subsets": []}),
                             (1, svc("web", ns="other", ip="10.96.0.4"))])
    assert problems == []
    assert [(d.data["kind"], d.data["metadata"].get("namespace"), d.file) for d in docs] == [
        ("Service", None, "root/l0/f.yaml"), ("Endpoints", None, "root/l0/f.yaml"), ("Service", "other", "root/l1/f.yaml")]


def test_service_cidr_is_cluster_scoped():
    cidr = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "extra"},
            "spec": {"cidrs": ["10.100.0.0/16"]}}
    docs, _, problems = run([(0, cidr), (1, {**stub("ServiceCIDR", "extra", ns="elsewhere")})])
    assert docs == [] and problems == []


def test_removal_and_removal_of_nothing():
    docs, _, problems = run([(0, svc("web")), (0, svc("db", ip="10.96.0.2")), (1, stub("Service", "web")),
                             (1, stub("Service", "ghost", ns="x")), (2, svc("web", ip="10.96.0.5"))])
    assert [(d.data["metadata"]["name"], d.data["spec"]["clusterIP"]) for d in docs] == [("db", "10.96.0.2"),
                                                                                          ("web", "10.96.0.5")]
    assert [str(p) for p in problems] == [
        "root/l1/f.yaml:4:1: warning: Service x/ghost: metadata.name: removes nothing: no earlier layer has Service "
        "x/ghost; remove this stub"]


def test_removal_twice_warns_the_second_time():
    _, _, problems = run([(0, svc("web")), (1, stub("Service", "web")), (2, stub("Service", "web"))])
    assert [(p.file, p.severity) for p in problems] == [("root/l2/f.yaml", "warning")]


def test_removal_and_definition_in_one_layer_is_an_error():
    for order, line in (([(1, stub("Service", "web")), (1, svc("web"))], 3), ([(1, svc("web")), (1, stub("Service", "web"))], 2)):
        _, _, problems = run([(0, svc("web"))] + order)
        assert [p.message for p in problems if p.is_error] == [
            f"Service default/web is both removed here and defined in the same layer (root/l1/f.yaml:{line}); a removal "
            "applies to earlier layers only: keep one"]


def test_duplicates_in_one_layer_are_left_for_check_tree():
    docs, checks, problems = run([(0, svc("web")), (1, svc("web", ip="10.96.0.2")), (1, svc("web", ip="10.96.0.3"))])
    assert problems == [] and len(docs) == 2
    checked = check_tree(problems, docs, checks)
    assert [p.message.split(";")[0] for p in checked.problems if p.is_error] == [
        "Service default/web is defined twice"]


def test_duplicates_replaced_by_a_later_layer_are_still_reported():
    docs, checks, problems = run([(0, svc("web")), (0, svc("web", ip="10.96.0.2")), (1, svc("web", ip="10.96.0.3"))])
    assert len(docs) == 1
    assert [(p.file, p.line, p.message.split(";")[0]) for p in problems] == [
        ("root/l0/f.yaml", 2, "Service default/web is defined twice")]
    assert not check_tree(problems, docs, checks).ok


def test_a_replaced_or_removed_objects_errors_still_count():
    bad = svc("web", ip="10.96.0.999")
    docs, checks, problems = run([(0, bad), (1, svc("web", ip="10.96.0.2")),
                                  (0, svc("db", port=0)), (1, stub("Service", "db"))])
    assert [d.data["spec"]["clusterIP"] for d in docs] == ["10.96.0.2"]
    assert sorted(p.field for p in problems if p.is_error) == ["spec.clusterIP", "spec.ports[0].port"]
    assert not check_tree(problems, docs, checks).ok


def test_unknown_kinds_and_unnamed_objects_pass_through():
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}}
    unnamed = {"apiVersion": "v1", "kind": "Service", "metadata": {}, "spec": {"clusterIP": "10.96.0.1"}}
    docs, checks, problems = run([(0, cm), (1, dict(cm)), (0, unnamed), (1, dict(unnamed))])
    assert len(docs) == 4 and problems == []
    assert [c.unknown_kind for c in checks] == ["ConfigMap", "ConfigMap", None, None]


# --- the property: a node's effective manifests against a from-scratch merge --------------------


LABEL_KEYS = ("site", "ring", "tier")
LABEL_VALUES = ("a", "b", "")
NAMES = ("web", "db", "dns")


def _k8s_matches(selector: dict | None, labels: dict) -> bool:
    """Kubernetes' LabelSelector semantics, written out again with plain dicts."""
    if selector is None:
        return True
    ok = all(k in labels and labels[k] == v for k, v in (selector.get("matchLabels") or {}).items())
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In":
            ok = ok and key in labels and labels[key] in values
        elif op == "NotIn":
            ok = ok and not (key in labels and labels[key] in values)
        elif op == "Exists":
            ok = ok and key in labels
        else:
            ok = ok and key not in labels
    return ok


def _expected(layers: list[dict], objects: list[list[dict]], node: str, labels: dict) -> dict:
    effective: dict = {}
    for layer, objs in zip(layers, objects):
        if not _k8s_matches(layer.get("selector"), labels):
            continue
        for o in objs:
            meta = o["metadata"]
            key = (o["kind"], "" if o["kind"] == "ServiceCIDR" else meta.get("namespace") or "default", meta["name"])
            if meta.get("annotations", {}).get("fleet.nftrec.io/remove") == "true":
                effective.pop(key, None)
            else:
                effective[key] = json.loads(json.dumps(o).replace("${nodeName}", node))
    return effective


def test_property_effective_manifests_equal_a_from_scratch_merge():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    label_key = st.sampled_from(LABEL_KEYS)
    label_value = st.sampled_from(LABEL_VALUES)
    expression = st.one_of(
        st.builds(lambda k, op, vs: {"key": k, "operator": op, "values": vs},
                  label_key, st.sampled_from(("In", "NotIn")), st.lists(label_value, min_size=1, max_size=2)),
        st.builds(lambda k, op: {"key": k, "operator": op}, label_key, st.sampled_from(("Exists", "DoesNotExist"))))
    selector = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "matchLabels": st.dictionaries(label_key, label_value, max_size=2),
        "matchExpressions": st.lists(expression, max_size=2)}))

    def obj(kind, ns, name, removal, n):
        if removal:
            return stub(kind, name, ns=ns)
        if kind == "ServiceCIDR":
            return {"apiVersion": "networking.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                    "spec": {"cidrs": [f"10.{n}.0.0/16"]}}
        return svc(name, ns=ns, port=n + 1, meta={"labels": {"from": f"{n}-${{nodeName}}"}})

    one = st.builds(obj, st.sampled_from(("Service", "ServiceCIDR")), st.sampled_from((None, "default", "other")),
                    st.sampled_from(NAMES), st.booleans(), st.integers(0, 200))

    def unique(objs):  # one identity once per layer (several are check_tree's duplicate error)
        seen, out = set(), []
        for o in objs:
            m = o["metadata"]
            key = (o["kind"], "" if o["kind"] == "ServiceCIDR" else m.get("namespace") or "default", m["name"])
            if key not in seen:
                seen.add(key)
                out.append(o)
        return out

    layer_objects = st.lists(one, max_size=4).map(unique)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(selector, layer_objects), min_size=1, max_size=4),
           st.dictionaries(label_key, label_value, max_size=3), st.sampled_from(("n1", "edge-7")))
    def check(spec, labels, node):
        layers = [{"path": f"l{i}", **({"selector": sel} if sel is not None else {})} for i, (sel, _) in enumerate(spec)]
        fleet_yaml = json.dumps({"apiVersion": "nftrec/v1alpha1", "kind": "Fleet", "layers": layers})
        p = project(FLEET, fleet_yaml.encode(), Identity(node, tuple(sorted(labels.items()))))
        assert p.ok, p.problems
        docs, checks, layer_of = [], [], []
        for resolved in p.layers:
            for data in spec[resolved.index][1]:
                new, check_ = check_fleet_document(doc(json.loads(json.dumps(data)), file=f"root/{resolved.rel}/f.yaml"),
                                                   p.env)
                docs.append(new)
                checks.append(check_)
                layer_of.append(resolved.index)
        out, _, problems = merge(docs, checks, layer_of)
        assert not any(x.is_error for x in problems)
        got = {}
        for d in out:
            m = d.data["metadata"]
            key = (d.data["kind"], "" if d.data["kind"] == "ServiceCIDR" else m.get("namespace") or "default", m["name"])
            assert key not in got
            got[key] = d.data
        assert got == _expected(layers, [objs for _, objs in spec], node, labels)

    check()


# --- schemas/nodeinventory.json (its loader and uniqueness check are validate --fleet's) --------


@pytest.mark.parametrize("data, paths", [
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "x-source": "cmdb",
      "nodes": [{"name": "edge-001", "labels": {"site": "lyon", "example.com/ring": ""}}, {"name": "core.dc1"}]}, []),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory"}, [()]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "Fleet", "nodes": []}, [("kind",)]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "nodes": [{"labels": {}}]}, [("nodes", 0)]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "nodes": [{"name": "Edge_1"}]}, [("nodes", 0, "name")]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "nodes": [{"name": "e", "labels": {"site": "a b"}}]},
     [("nodes", 0, "labels", "site")]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "nodes": [{"name": "e", "labels": {"-x": "a"}}]},
     [("nodes", 0, "labels")]),
    ({"apiVersion": "nftrec/v1alpha1", "kind": "NodeInventory", "nodes": [{"name": "e", "zone": "z"}]}, [("nodes", 0)]),
])
def test_node_inventory_schema(data, paths):
    from reconciler.intake.schemas import validator

    assert [tuple(e.absolute_path) for e in validator("NodeInventory").iter_errors(data)] == paths


def test_label_syntax_is_the_node_configs():
    from reconciler.intake.schemas import load_schema

    labels = load_schema("NodeConfig")["properties"]["nodeLabels"]
    selector = load_schema("Fleet")["properties"]["layers"]["items"]["properties"]["selector"]
    expression = selector["properties"]["matchExpressions"]["items"]["properties"]
    inventory = load_schema("NodeInventory")["properties"]["nodes"]["items"]["properties"]["labels"]
    for written in (selector["properties"]["matchLabels"], inventory):
        assert (written["propertyNames"], written["additionalProperties"]) == (
            labels["propertyNames"], labels["additionalProperties"])
    assert expression["key"]["pattern"] == labels["propertyNames"]["pattern"]
    assert expression["values"]["items"] == labels["additionalProperties"]
