"""Schema and cross-document validation: each class of bad input, each cross check, and
every example directory."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from reconciler.problems import Problem
from reconciler.validate import run_validate

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def validate(root: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_validate(str(root), stream=out, **kw)
    return rc, out.getvalue()


def svc(name="web", ns="default", ip="10.96.0.10", extra_spec="", ports="  ports:\n    - {name: http, port: 80, targetPort: 8080}\n", top=""):
    return (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n{top}spec:\n"
            f"  clusterIP: {ip}\n{extra_spec}{ports}")


def eps(name="web-1", svc_name="web", ns="default", at="IPv4", addr="10.244.0.1", ports="ports: [{name: http, port: 8080}]\n"):
    return (f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
            f"  labels: {{kubernetes.io/service-name: {svc_name}}}\naddressType: {at}\n{ports}"
            f"endpoints:\n  - addresses: [\"{addr}\"]\n")


def test_valid_pair(tmp_path):
    write(tmp_path, "a.yaml", svc() + "---\n" + eps())
    rc, out = validate(tmp_path)
    assert rc == 0, out
    assert out.strip() == f"{tmp_path}: 2 objects, 0 errors, 0 warnings"


# --- single-document errors -------------------------------------------------------------

BAD = [
    # (file text, expected "file:line:col" fragment, expected substring)
    ("metadata: {name: x}\nspec: {}\n", "f.yaml:1:1: default/x: kind: kind is missing", None),
    ("kind: Service\nmetadata: {name: x}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 1}]}\n",
     "f.yaml:1:1: Service default/x: apiVersion: apiVersion is required but missing", None),
    ("apiVersion: v2\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 1}]}\n",
     "f.yaml:1:13: Service default/x: apiVersion: 'v2' is not allowed; use v1", None),
    (svc(ports="  ports:\n    - port: \"80\"\n"), "f.yaml:9:13: Service default/web: spec.ports[0].port: must be a whole number, not a string ('80'); write it without quotes", None),
    (svc(ports="  ports:\n    - port: 65536\n"), "f.yaml:9:13: Service default/web: spec.ports[0].port: 65536 is out of range; it must be a port number from 1 to 65535", None),
    (svc(ports="  ports:\n    - port: 0\n"), "f.yaml:9:13: Service default/web: spec.ports[0].port", "out of range"),
    (svc(ports="  ports:\n    - {port: 80, nodePort: 70000}\n"), "f.yaml:9:28: Service default/web: spec.ports[0].nodePort", "out of range"),
    (svc(ip="10.96.0.300"), "f.yaml:7:14: Service default/web: spec.clusterIP: '10.96.0.300' is not an IP address", None),
    (svc(ip="010.0.0.1"), "f.yaml:7:14: Service default/web: spec.clusterIP: '010.0.0.1'", "remove the leading zeros"),
    (svc(extra_spec="  externalIPs: [192.168.001.1]\n"), "f.yaml:8:17: Service default/web: spec.externalIPs[0]: '192.168.001.1' is not a valid IP address", "leading zeros"),
    (svc(extra_spec="  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/33]\n"),
     "f.yaml:9:30: Service default/web: spec.loadBalancerSourceRanges[0]: '10.0.0.0/33' is not a valid CIDR", None),
    (svc(extra_spec="  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0]\n"),
     "spec.loadBalancerSourceRanges[0]: '10.0.0.0' is not a valid CIDR", None),
    (svc(extra_spec="  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}\n"),
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 86401 is out of range", None),
    (svc(extra_spec="  type: Foo\n"), "f.yaml:8:9: Service default/web: spec.type: 'Foo' is not allowed; use ClusterIP, NodePort, LoadBalancer or ExternalName", None),
    (svc(extra_spec="  ipFamilies: [IPv5]\n"), "spec.ipFamilies[0]: 'IPv5' is not allowed; use IPv4 or IPv6", None),
    (svc(ports="  ports:\n    - {port: 80, protocol: tcp}\n"), "spec.ports[0].protocol: 'tcp' is not allowed; use TCP, UDP or SCTP", None),
    (svc(ports="  ports:\n    - {port: 80, targetPort: \"8080\"}\n"), "spec.ports[0].targetPort: '8080' is not a port number from 1 to 65535 or a port name", None),
    (svc(ports="  ports:\n    - {port: 80, targetPort: 0}\n"), "spec.ports[0].targetPort: 0 is out of range", None),
    (eps(addr="010.244.0.1"), "f.yaml:10:17: EndpointSlice default/web-1: endpoints[0].addresses[0]: '010.244.0.1' is not a valid IPv4 address", "leading zeros"),
    (svc(name="Web"), "f.yaml:4:9: Service default/Web: metadata.name: 'Web' is not a DNS-1035 label", None),
    (svc(ns="My_NS"), "f.yaml:5:14: Service My_NS/web: metadata.namespace: 'My_NS' is not a DNS-1123 label", None),
]


@pytest.mark.parametrize("text,where,extra", BAD)
def test_bad_document(tmp_path, text, where, extra):
    write(tmp_path, "f.yaml", text)
    rc, out = validate(tmp_path)
    assert rc == 1
    assert (f"{tmp_path}/{where}" if where.startswith("f.yaml") else where) in out, out
    if extra:
        assert extra in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("name", ['we"b', "we{b}", "we;b", "we\nb", 'web"; flush ruleset; "'])
def test_hostile_names_are_refused_and_shown_on_one_line(tmp_path, name):
    write(tmp_path, "f.yaml", svc(name=json.dumps(name)))
    rc, out = validate(tmp_path)
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 2  # one problem on one line + the summary
    assert lines[0].startswith(f"{tmp_path}/f.yaml:4:9: Service default/'")
    assert "metadata.name:" in lines[0] and "is not a DNS-1035 label" in lines[0]


def test_all_problems_not_only_the_first(tmp_path):
    write(tmp_path, "f.yaml", svc(ip="999.1.1.1", ports="  ports:\n    - {port: 0, protocol: XTP}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert "spec.clusterIP" in out and "spec.ports[0].port" in out and "spec.ports[0].protocol" in out
    assert "3 errors" in out


def test_missing_required_spec_field(tmp_path):
    write(tmp_path, "f.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "f.yaml:1:1: Service default/x: spec: spec is required but missing; add it" in out


def test_slice_without_service_name_label(tmp_path):
    write(tmp_path, "f.yaml", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s\n  labels: {app: x}\naddressType: IPv4\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "f.yaml:5:3: EndpointSlice default/s: metadata.labels['kubernetes.io/service-name']: the label kubernetes.io/service-name is missing" in out


def test_service_rules_beyond_the_schema(tmp_path):
    write(tmp_path, "f.yaml", svc(ports="  ports:\n    - {port: 80}\n    - {port: 81}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.ports[0]: a Service with several ports must name every port" in out
    write(tmp_path, "f.yaml", svc(extra_spec="  clusterIPs: [10.96.0.11]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.clusterIP: clusterIP '10.96.0.10' differs from clusterIPs[0] '10.96.0.11'" in out
    write(tmp_path, "f.yaml", svc(ports="  ports:\n    - {port: 80, nodePort: 30080}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "nodePort is only used by NodePort and LoadBalancer Services" in out


# --- cross-document checks --------------------------------------------------------------


def test_duplicate_object(tmp_path):
    write(tmp_path, "a.yaml", svc())
    write(tmp_path, "b.yaml", svc(ip="10.96.0.11"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert f"{tmp_path}/b.yaml:4:9: Service default/web: metadata.name: Service default/web is defined twice; the first is at {tmp_path}/a.yaml:1" in out


def test_same_name_other_namespace_is_fine(tmp_path):
    write(tmp_path, "a.yaml", svc() + "---\n" + svc(ns="other", ip="10.96.0.11"))
    assert validate(tmp_path)[0] == 0


def test_two_services_claim_one_cluster_ip_port(tmp_path):
    write(tmp_path, "a.yaml", svc(name="a") + "---\n" + svc(name="b"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert f"{tmp_path}/a.yaml:17:14: Service default/b: spec.clusterIP: 10.96.0.10 port 80/TCP is already claimed by Service default/a" in out
    # same IP, other port: allowed (the map key is ip . protocol . port)
    write(tmp_path, "a.yaml", svc(name="a") + "---\n" + svc(name="b", ports="  ports:\n    - {port: 81}\n"))
    assert validate(tmp_path)[0] == 0


def test_external_ip_collides_with_cluster_ip(tmp_path):
    write(tmp_path, "a.yaml", svc(name="a") + "---\n" + svc(name="b", ip="10.96.0.11", extra_spec="  externalIPs: [10.96.0.10]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "Service default/b: spec.externalIPs[0]: 10.96.0.10 port 80/TCP is already claimed by Service default/a" in out


def test_node_port_collision(tmp_path):
    np = "  type: NodePort\n"
    write(tmp_path, "a.yaml", svc(name="a", extra_spec=np, ports="  ports:\n    - {port: 80, nodePort: 30080}\n") + "---\n"
          + svc(name="b", ip="10.96.0.11", extra_spec=np, ports="  ports:\n    - {port: 81, nodePort: 30080}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert f"{tmp_path}/a.yaml:21:28: Service default/b: spec.ports[0].nodePort: nodePort 30080/TCP is already used by Service default/a" in out
    # same number, other protocol: allowed
    write(tmp_path, "a.yaml", svc(name="a", extra_spec=np, ports="  ports:\n    - {port: 80, nodePort: 30080}\n") + "---\n"
          + svc(name="b", ip="10.96.0.11", extra_spec=np, ports="  ports:\n    - {port: 81, nodePort: 30080, protocol: UDP}\n"))
    assert validate(tmp_path)[0] == 0


def test_wrong_family_cluster_ips(tmp_path):
    write(tmp_path, "a.yaml", svc(ip="10.96.0.10", extra_spec="  ipFamilies: [IPv6]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.clusterIP: '10.96.0.10' is an IPv4 address but spec.ipFamilies[0] is IPv6" in out
    write(tmp_path, "a.yaml", svc(ip="10.96.0.10", extra_spec="  clusterIPs: [10.96.0.10, 10.96.0.11]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.clusterIPs[1]: both clusterIPs are IPv4" in out


def test_wrong_family_slice_address(tmp_path):
    write(tmp_path, "a.yaml", svc() + "---\n" + eps(at="IPv6", addr="10.244.0.1"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert f"{tmp_path}/a.yaml:20:17: EndpointSlice default/web-1: endpoints[0].addresses[0]: '10.244.0.1' is an IPv4 address but the slice's addressType is IPv6" in out


def test_slice_without_service_is_a_warning(tmp_path):
    write(tmp_path, "a.yaml", eps(svc_name="ghost"))
    rc, out = validate(tmp_path)
    assert rc == 0
    assert f"{tmp_path}/a.yaml:6:40: warning: EndpointSlice default/web-1: metadata.labels['kubernetes.io/service-name']: there is no Service default/ghost" in out
    assert "0 errors, 1 warning" in out


def test_named_target_port_unresolved(tmp_path):
    write(tmp_path, "a.yaml", svc(ports="  ports:\n    - {name: http, port: 80, targetPort: web}\n") + "---\n"
          + eps(ports="ports: [{name: web, port: 8080}]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1
    assert (f"{tmp_path}/a.yaml:9:42: Service default/web: spec.ports[0].targetPort: targetPort 'web' is a name, "
            "and no EndpointSlice of this Service has a port named 'http'") in out
    write(tmp_path, "a.yaml", svc(ports="  ports:\n    - {name: http, port: 80, targetPort: web}\n") + "---\n" + eps())
    assert validate(tmp_path)[0] == 0


def test_named_target_port_via_legacy_endpoints(tmp_path):
    write(tmp_path, "a.yaml", svc(ports="  ports:\n    - {name: http, port: 80, targetPort: web}\n") + "---\n"
          "apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\nsubsets:\n  - addresses: [{ip: 10.244.0.1}]\n"
          "    ports: [{name: http, port: 8080}]\n")
    assert validate(tmp_path)[0] == 0


def test_unknown_kinds_one_notice_per_kind(tmp_path):
    dep = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d%d}\n"
    write(tmp_path, "a.yaml", "---\n".join(dep % i for i in range(3)) + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    rc, out = validate(tmp_path)
    assert rc == 0
    assert f"{tmp_path}/a.yaml:1:1: notice: Deployment: 3 objects of kind Deployment were skipped" in out
    assert f"{tmp_path}/a.yaml:13:1: notice: ConfigMap: 1 object of kind ConfigMap was skipped" in out
    assert out.count("notice:") == 2
    rc, out = validate(tmp_path, strict=True)
    assert rc == 1 and out.count("skipped") == 2 and "notice:" not in out


def test_json_output(tmp_path):
    write(tmp_path, "a.yaml", svc(ip="010.0.0.1"))
    rc, out = validate(tmp_path, output="json")
    doc = json.loads(out)
    assert rc == 1 and doc["valid"] is False and doc["objects"] == 1 and doc["errors"] == 1
    [p] = doc["problems"]
    assert p["line"] == 7 and p["col"] == 14 and p["kind"] == "Service" and p["obj"] == "default/web"
    assert p["field"] == "spec.clusterIP" and p["severity"] == "error"


def test_problem_format():
    p = Problem("a.yaml", 3, 5, "Service", "default/web", "spec.ports[0].port", "70000 is out of range")
    assert p.format_text() == "a.yaml:3:5: Service default/web: spec.ports[0].port: 70000 is out of range"
    assert Problem("a.yaml", 0, 0, "", "", "", "cannot read").format_text() == "a.yaml: cannot read"
    assert Problem("a.yaml", 1, 1, "", "", "", "x", "warning").format_text() == "a.yaml:1:1: warning: x"


def test_config_problems_reported(tmp_path):
    write(tmp_path, "m/a.yaml", svc())
    write(tmp_path, "c.yaml", "nodeName: edge-1\nbogus: 1\n")
    rc, out = validate(tmp_path / "m", config_path=str(tmp_path / "c.yaml"))
    assert rc == 1 and f"{tmp_path}/c.yaml:2:1: NodeConfig: bogus: unknown key 'bogus'" in out


# --- examples ---------------------------------------------------------------------------

# Manifest examples; examples/systemd and examples/container hold deployment files.
NOT_MANIFESTS = {"systemd", "container"}
EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and p.name not in NOT_MANIFESTS) if EXAMPLES.is_dir() else []


@pytest.mark.parametrize("directory", [p.name for p in EXAMPLE_DIRS if p.name != "git-sync"] + ["git-sync/current"])
def test_examples_validate(directory):
    root = EXAMPLES / directory
    config = EXAMPLES / f"{directory}.config.yaml"
    rc, out = validate(root, config_path=str(config) if config.is_file() else None)
    assert rc == 0, out
    assert " 0 errors" in out


def test_example_config_files_valid():
    for cfg in EXAMPLES.glob("*.config.yaml"):
        from reconciler.config import load_node_config

        _, problems = load_node_config(str(cfg), discover=False)
        assert not problems, (cfg, problems)
