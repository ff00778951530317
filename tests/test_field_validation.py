"""Unknown fields of the accepted kinds are errors by default (kubectl's strict field
validation), with the nearest known name; --field-validation / fieldValidation relax it;
--strict makes every other warning an error. What Kubernetes accepts (rendered Helm charts,
kubectl's output: tests/data/k8s-valid) still passes with no problem at all."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.intake import read_inventory, run_validate

DATA = Path(__file__).parent / "data" / "k8s-valid"

MISSPELLED = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespce: prod
spec:
  clusterIp: 10.96.0.10
  ports:
  - port: 80
    targetPrt: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
  condition: {ready: true}
ports:
- port: 8080
  protocl: TCP
"""


def _tree(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "a.yaml").write_text(text)
    return d


def _validate(root, **kw) -> tuple[int, dict]:
    out = io.StringIO()
    rc = run_validate(root, output="json", stream=out, **kw)
    return rc, json.loads(out.getvalue())


def test_misspelled_fields_are_errors_with_the_nearest_name(tmp_path):
    rc, doc = _validate(_tree(tmp_path, MISSPELLED))
    assert rc == 1
    unknown = {p["field"]: p for p in doc["problems"] if p["message"].startswith("unknown field")}
    assert set(unknown) == {"metadata.namespce", "spec.clusterIp", "spec.ports[0].targetPrt",
                            "endpoints[0].condition", "ports[0].protocl"}
    assert all(p["severity"] == "error" for p in unknown.values())
    assert "did you mean namespace?" in unknown["metadata.namespce"]["message"]
    assert "did you mean clusterIP?" in unknown["spec.clusterIp"]["message"]
    assert "did you mean targetPort?" in unknown["spec.ports[0].targetPrt"]["message"]
    assert "did you mean conditions?" in unknown["endpoints[0].condition"]["message"]
    assert (unknown["spec.clusterIp"]["line"], unknown["spec.clusterIp"]["col"]) == (7, 3)
    assert unknown["spec.ports[0].targetPrt"]["line"] == 10


@pytest.mark.parametrize("kind", ["Endpoints", "ServiceCIDR"])
def test_unknown_fields_of_the_other_kinds(tmp_path, kind):
    text = {"Endpoints": "apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\nsubsets:\n"
                         "- adresses: [{ip: 10.0.0.1}]\n  ports: [{port: 80}]\n",
            "ServiceCIDR": "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}\n"
                           "spec: {cidr: [10.96.0.0/16]}\n"}[kind]
    res = read_inventory(_tree(tmp_path, text))
    msgs = [p.message for p in res.errors if p.message.startswith("unknown field")]
    assert len(msgs) == 1 and ("did you mean addresses?" in msgs[0] or "did you mean cidrs?" in msgs[0])


def test_warn_and_ignore(tmp_path):
    root = _tree(tmp_path, MISSPELLED)
    res = read_inventory(root, fields="warn")
    assert res.ok and len([p for p in res.problems if p.message.startswith("unknown field")]) == 5
    assert {s.name for s in res.inventory.services} == {"web"}  # a warning does not drop the object
    res = read_inventory(root, fields="ignore")
    assert res.ok and not [p for p in res.problems if p.message.startswith("unknown field")]


def test_node_config_and_command_line(tmp_path):
    root = _tree(tmp_path, MISSPELLED)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nfieldValidation: Warn\n")
    assert _validate(root, config_path=cfg)[0] == 0
    assert _validate(root, config_path=cfg, fields="strict")[0] == 1  # the command line wins
    cfg.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nfieldValidation: warn\n")
    rc, doc = _validate(root, config_path=cfg)
    assert rc == 1 and any(p["kind"] == "NodeConfig" and p["field"] == "fieldValidation" for p in doc["problems"])


def test_command_line_option(tmp_path):
    root = _tree(tmp_path, MISSPELLED)
    run = [str(Path(sys.executable).with_name("nftrec")), "validate", str(root)]
    assert subprocess.run(run, capture_output=True).returncode == 1
    assert subprocess.run(run + ["--field-validation=Warn"], capture_output=True).returncode == 0
    bad = subprocess.run(run + ["--field-validation=loose"], capture_output=True, text=True)
    assert bad.returncode == 64 and "strict, warn or ignore" in bad.stderr


WARNINGS = {
    "a slice whose Service is missing": """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, labels: {kubernetes.io/service-name: wbe}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
""",
    "a Service with no ClusterIP": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n",
    "a NodePort with no nodePort": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
                                   "spec: {type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
}


@pytest.mark.parametrize("case", sorted(WARNINGS))
def test_strict_makes_warnings_errors(tmp_path, case):
    root = _tree(tmp_path, WARNINGS[case])
    relaxed = read_inventory(root)
    assert relaxed.ok and any(p.severity == "warning" for p in relaxed.problems)
    strict = read_inventory(root, strict=True)
    assert not strict.ok and not any(p.severity == "warning" for p in strict.problems)
    assert all("--strict" in p.message for p in strict.errors)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.yaml")))
def test_what_kubernetes_accepts_passes(name, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / name).write_text((DATA / name).read_text())
    res = read_inventory(d, strict=True)
    assert res.problems == [] and res.documents >= 4


def test_the_cache_serves_every_mode(tmp_path):
    root, cache = _tree(tmp_path, MISSPELLED), tmp_path / "cache"
    for fields, ok in (("strict", False), ("warn", True), ("ignore", True), ("strict", False)):
        for _ in range(2):  # cold, then warm
            assert read_inventory(root, fields=fields, cache_dir=cache).ok is ok, fields


def test_unknown_fields_of_a_list_wrapper(tmp_path):
    root = _tree(tmp_path, "apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\n  resourceVerison: \"1\"\n"
                           "itmes: []\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web}\n"
                           "  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n")
    res = read_inventory(root)
    assert [(p.field, p.line) for p in res.errors] == [("metadata.resourceVerison", 5), ("itmes", 6)]
    assert "did you mean items?" in res.errors[1].message
    assert read_inventory(root, fields="ignore").problems == []


def test_stdin_reads_with_the_mode(tmp_path):
    nftrec = str(Path(sys.executable).with_name("nftrec"))
    for extra, rc in (([], 1), (["--field-validation=ignore"], 0)):
        done = subprocess.run([nftrec, "validate", "-", *extra], input=MISSPELLED, capture_output=True, text=True)
        assert done.returncode == rc, done.stdout + done.stderr


KUBECTL = [
    ["create", "service", "clusterip", "web", "--tcp=80:8080", "--tcp=443:8443"],
    ["create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080"],
    ["create", "service", "loadbalancer", "lb", "--tcp=53:5353"],
    ["create", "service", "externalname", "ext", "--external-name=db.example.com"],
    ["create", "service", "clusterip", "headless", "--clusterip=None"],
    ["create", "deployment", "app", "--image=nginx"],  # another kind: skipped, not an error
]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (scripts/setup --test)")
def test_what_kubectl_writes_passes(tmp_path):
    """Real `kubectl create ... --dry-run=client -o yaml` output (no cluster needed) carries
    fields nftrec does not read (creationTimestamp: null, selector, status.loadBalancer):
    none of it is an unknown field."""
    d = tmp_path / "m"
    d.mkdir()
    for i, args in enumerate(KUBECTL):
        out = subprocess.run(["kubectl", *args, "--dry-run=client", "-o", "yaml"], capture_output=True,
                             text=True, timeout=60, check=True, cwd=tmp_path).stdout
        (d / f"{i}.yaml").write_text(out)
    res = read_inventory(d)
    assert not [p for p in res.problems if p.is_error], res.problems
    assert not [p for p in res.problems if p.code == "unknown-field"], res.problems
    assert res.documents == len(KUBECTL)
