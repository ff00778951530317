"""Schema and cross-document validation: each class of bad input, each cross check, and
every example directory."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from reconciler.intake.problems import Problem
from reconciler.intake.report import run_validate

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
    (svc(ports="  ports:\n    - {port: 80, targetPort: -1}\n"), "spec.ports[0].targetPort: -1 is out of range", None),
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
    rc, out = validate(tmp_path, allow_empty=True)  # no Service at all: allowed, to see the warning alone
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
    rc, out = validate(tmp_path, allow_empty=True)
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

# Manifest examples; examples/systemd, container, grafana and ci hold deployment files.
NOT_MANIFESTS = {"systemd", "container", "grafana", "ci"}
EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and p.name not in NOT_MANIFESTS) if EXAMPLES.is_dir() else []


def example_cases() -> list:
    """(directory, node config or None): a fleet root once per node config of its nodes
    (examples/fleet.NODE.config.yaml), --strict."""
    cases = []
    for name in [p.name for p in EXAMPLE_DIRS if p.name != "git-sync"] + ["git-sync/current"]:
        configs = [c.name for c in sorted(EXAMPLES.glob(f"{name}.config.yaml")) + sorted(EXAMPLES.glob(f"{name}.*.config.yaml"))]
        cases += [(name, c) for c in configs] or [(name, None)]
    return cases


@pytest.mark.parametrize("directory,config", example_cases())
def test_examples_validate(directory, config):
    root = EXAMPLES / directory
    strict = (root / "fleet.yaml").is_file()
    rc, out = validate(root, config_path=str(EXAMPLES / config) if config else None, strict=strict)
    assert rc == 0, out
    assert " 0 errors" in out and (not strict or " 0 warnings" in out), out


def test_example_config_files_valid():
    for cfg in EXAMPLES.glob("*.config.yaml"):
        from reconciler.intake.config import load_node_config

        _, problems = load_node_config(str(cfg), discover=False)
        assert not problems, (cfg, problems)


# --- review of issue 2 --------------------------------------------------------------------


def test_missing_required_fields_reported_once_each(tmp_path):
    write(tmp_path, "f.yaml", "apiVersion: v1\nkind: Service\n")
    rc, out = validate(tmp_path)
    assert rc == 1
    assert out.count("metadata is required") == 1 and out.count("spec is required") == 1, out


def test_null_means_unset_as_in_kubernetes(tmp_path):
    write(tmp_path, "a.yaml", svc(extra_spec="  selector: null\n  externalIPs: null\n  clusterIPs: null\n"
                                  "  ipFamilies: null\n  sessionAffinityConfig: null\n", top="  labels: null\n")
          + "---\n" + "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n"
          "  labels: {kubernetes.io/service-name: web}\n  annotations: null\naddressType: IPv4\n"
          "ports: [{name: http, port: 8080, protocol: null}]\nendpoints:\n"
          "  - addresses: [10.244.0.1]\n    conditions: {ready: null, serving: null}\n    hints: null\n    nodeName: null\n")
    rc, out = validate(tmp_path)
    assert rc == 0, out
    write(tmp_path, "a.yaml", svc(ports="  ports: null\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.ports: a Service needs at least one port" in out and "not null" not in out, out


def test_empty_namespace_means_default(tmp_path):
    write(tmp_path, "a.yaml", svc(ns='""') + "---\n" + eps(ns='""'))
    rc, out = validate(tmp_path)
    assert rc == 0, out
    write(tmp_path, "b.yaml", svc(ip="10.96.0.11"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "Service default/web is defined twice" in out, out


def test_zero_and_empty_mean_unset_for_defaulted_ports(tmp_path):
    # Kubernetes defaults targetPort 0 or "" to port; nodePort 0 / healthCheckNodePort 0 mean "not set"
    np = "  type: NodePort\n"
    write(tmp_path, "a.yaml", svc(name="a", extra_spec=np, ports="  ports:\n    - {port: 80, targetPort: 0, nodePort: 0}\n")
          + "---\n" + svc(name="b", ip="10.96.0.11", extra_spec=np + "  healthCheckNodePort: 0\n",
                          ports="  ports:\n    - {port: 81, targetPort: \"\", nodePort: 0}\n"))
    rc, out = validate(tmp_path)
    assert rc == 0 and "already used" not in out and "only used by" not in out, out
    assert out.count("no nodePort is set") == 2


def test_float_numbers_are_not_ports(tmp_path):
    write(tmp_path, "a.yaml", svc(extra_spec="  type: NodePort\n  sessionAffinity: ClientIP\n"
                                  "  sessionAffinityConfig: {clientIP: {timeoutSeconds: 100.0}}\n",
                                  ports="  ports:\n    - {name: a, port: 80.0, targetPort: 8080.0, nodePort: 30080.0}\n")
          + "---\n" + eps(ports="ports: [{name: a, port: 8080.0}]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1
    for f in ("spec.ports[0].port", "spec.ports[0].targetPort", "spec.ports[0].nodePort",
              "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "ports[0].port: must be a whole number, not a number (8080.0)"):
        assert f in out, (f, out)


def test_digit_string_target_port_says_drop_the_quotes(tmp_path):
    write(tmp_path, "a.yaml", svc(ports="  ports:\n    - {port: 80, targetPort: \"8080\"}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.ports[0].targetPort: '8080'" in out and "without quotes" in out, out


@pytest.mark.parametrize("value,hint", [
    ("::ffff:10.0.0.1", "IPv4-mapped"),
    ("fe80::1%eth0", "zone"),
    ("' 10.0.0.1'", "spaces"),
    ("10.0.0.1/32", "CIDR"),
])
def test_ip_refusals_say_why(tmp_path, value, hint):
    write(tmp_path, "a.yaml", svc(extra_spec=f"  externalIPs: [{json.dumps(value.strip(chr(39)))}]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.externalIPs[0]:" in out and hint in out, out


def test_ipv4_mapped_cluster_ip_and_endpoint_refused(tmp_path):
    write(tmp_path, "a.yaml", svc(ip="::ffff:10.96.0.10") + "---\n" + eps(at="IPv6", addr="::ffff:10.244.0.1"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.clusterIP:" in out and "endpoints[0].addresses[0]:" in out, out


@pytest.mark.parametrize("addr,what", [("127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"),
                                       ("169.254.1.1", "link-local"), ("224.0.0.5", "link-local multicast")])
def test_special_ips_refused_as_kubernetes_does(tmp_path, addr, what):
    write(tmp_path, "a.yaml", svc(extra_spec=f"  externalIPs: [{addr}]\n") + "---\n" + eps(addr=addr)
          + "---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: other}\nsubsets:\n"
          f"  - addresses: [{{ip: {addr}}}]\n    ports: [{{port: 80}}]\n")
    rc, out = validate(tmp_path)
    assert rc == 1
    for f in ("spec.externalIPs[0]", "endpoints[0].addresses[0]", "subsets[0].addresses[0].ip"):
        assert f"{f}: '{addr}' may not be" in out and what in out, (f, out)


def test_slice_address_errors_come_with_the_other_errors(tmp_path):
    write(tmp_path, "a.yaml", svc() + "---\n" + eps(name="Bad_Name", addr="10.244.0.999"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "metadata.name: 'Bad_Name'" in out and "endpoints[0].addresses[0]: '10.244.0.999'" in out, out


def test_service_cidr_must_be_canonical(tmp_path):
    cidr = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}\nspec:\n  cidrs: [%s]\n"
    write(tmp_path, "a.yaml", cidr % "10.96.0.1/12")
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.cidrs[0]: '10.96.0.1/12'" in out and "10.96.0.0/12" in out, out
    write(tmp_path, "a.yaml", cidr % '"FD00:0::/108"')
    rc, out = validate(tmp_path)
    assert rc == 1 and "fd00::/108" in out, out
    write(tmp_path, "a.yaml", cidr % "10.96.0.0/12, 'fd00::/108'")
    assert validate(tmp_path, allow_empty=True)[0] == 0


def test_require_dual_stack_with_one_ip_warns(tmp_path):
    write(tmp_path, "a.yaml", svc(extra_spec="  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [10.96.0.10]\n"))
    rc, out = validate(tmp_path)
    assert rc == 0 and "warning: Service default/web: spec.ipFamilyPolicy:" in out and "RequireDualStack" in out, out


def test_look_alike_characters_are_named(tmp_path):
    write(tmp_path, "a.yaml", svc(name="w\u0435b"))  # Cyrillic е
    rc, out = validate(tmp_path)
    assert rc == 1 and "U+0435" in out, out


@pytest.mark.parametrize("value,hint", [("10.0.0.0/33", "at most 32"), ("10.0.0.0/08", "leading zero of the prefix"),
                                        ("10.0.0.0", "needs a prefix length"), ("010.0.0.0/8", "leading zeros")])
def test_cidr_refusals_say_why(tmp_path, value, hint):
    write(tmp_path, "a.yaml", svc(extra_spec=f"  type: LoadBalancer\n  loadBalancerSourceRanges: [{value}]\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.loadBalancerSourceRanges[0]:" in out and hint in out, out


def test_cli_validate_with_missing_config_is_a_clean_error(tmp_path):
    import subprocess
    import sys

    write(tmp_path, "m/a.yaml", svc())
    r = subprocess.run([sys.executable, "-m", "reconciler.cli", "validate", str(tmp_path / "m"), "--config", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert f"{tmp_path}/nope.yaml: NodeConfig: cannot read the node config" in r.stdout


# --- the lean validator (schemas._LeanValidator) is jsonschema's, faster -----------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_intake_cache import damaged  # noqa: E402


def _errors(v, data) -> list:
    return [(e.message, list(e.absolute_path), list(e.absolute_schema_path), e.validator, repr(e.validator_value),
             repr(e.instance), [c.message for c in e.context]) for e in v.iter_errors(data)]


_JUNK = st.recursive(st.none() | st.booleans() | st.integers(-5, 70000) | st.sampled_from(
    ["", "x", "None", "TCP", "IPv4", "10.0.0.1", "10.0.0.01", "::1", "fe80::1", "127.0.0.1", "10.0.0.0/8", "a" * 70]),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["name", "port", "x"]), kids, max_size=3),
    max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged(), st.data())
def test_the_lean_validator_reports_exactly_what_jsonschema_reports(case, data):
    """Same errors (message, paths, keyword, value, context) as the plain validator class,
    on generated objects with random damage, twice (the second with the memo warm)."""
    from reconciler.intake.parse import Yaml11Bool
    from reconciler.intake.schemas import FORMATS, _LeanValidator, _Validator, load_schema, validator
    layout, _, _ = case
    docs = [d for _, part, _ in layout for d in part]
    for doc in docs:
        for _ in range(data.draw(st.integers(0, 3))):  # more damage, anywhere
            node = doc
            while True:
                keys = sorted(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
                if not keys:
                    break
                k = data.draw(st.sampled_from(keys))
                if not isinstance(node[k], (dict, list)) or data.draw(st.booleans()):
                    node[k] = data.draw(_JUNK | st.sampled_from([Yaml11Bool("yes"), Yaml11Bool("off")]))
                    break
                node = node[k]
        kind = doc.get("kind") if doc.get("kind") in ("Service", "EndpointSlice", "Endpoints", "ServiceCIDR") else "Service"
        lean = validator(kind)
        assert isinstance(lean, _LeanValidator)
        plain = _Validator(load_schema(kind), format_checker=FORMATS)
        expected = _errors(plain, doc)
        assert _errors(lean, doc) == expected
        assert _errors(lean, doc) == expected


def test_the_lean_validators_memo_tells_true_from_1_and_yes_from_a_string():
    from reconciler.intake.parse import Yaml11Bool
    from reconciler.intake.schemas import validator

    def svc(port, affinity=None):
        spec = {"clusterIP": "10.96.0.1", "ports": [{"port": port, "targetPort": port}]}
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": spec}

    v = validator("Service")
    assert list(v.iter_errors(svc(1))) == []
    assert [e.message for e in v.iter_errors(svc(True))] == ["True is not of type 'integer'", "True is not of type 'integer', 'string'"]
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {
        "name": "a", "labels": {"kubernetes.io/service-name": "a"}}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}}]}
    es = validator("EndpointSlice")
    assert [e.validator for e in es.iter_errors(slice_)] == ["type"]
    slice_["endpoints"][0]["conditions"]["ready"] = Yaml11Bool("yes")  # equal to "yes", not the same type
    assert [(e.validator, type(e.instance)) for e in es.iter_errors(slice_)] == [("type", Yaml11Bool)]


# ipaddress refuses IPv4 octets with leading zeros only from Python 3.9.5 on; 3.9.0 to
# 3.9.4 (Debian 11 ships 3.9.2) read 010 as decimal 10. nftrec refuses them itself.
@pytest.mark.parametrize("addr", ["010.0.0.1", "1.2.3.04"])
def test_ipv4_leading_zeros_are_refused_whatever_the_python_patch_level(tmp_path, addr):
    from reconciler.compile.parse import CompileError, parse_ip, parse_net

    write(tmp_path, "f.yaml", svc(ip=addr, extra_spec=f"  externalIPs: [\"{addr}\"]\n") + "---\n" + eps(addr=addr))
    rc, out = validate(tmp_path)
    assert rc == 1 and "3 errors" in out, out
    for field in ("Service default/web: spec.clusterIP", "Service default/web: spec.externalIPs[0]",
                  "EndpointSlice default/web-1: endpoints[0].addresses[0]"):
        assert f"{field}: '{addr}'" in out, out
    assert out.count("remove the leading zeros") == 3, out
    with pytest.raises(CompileError, match="clusterIP: not an IP address"):
        parse_ip(addr, "clusterIP")
    with pytest.raises(CompileError, match="sourceRanges: not a CIDR"):
        parse_net(f"{addr}/32", "sourceRanges")


@pytest.mark.parametrize("text,refused", [
    ("010.0.0.1", True), ("1.2.3.04", True), ("10.00.0.1", True), ("::ffff:1.2.3.04", True), ("64:ff9b::010.0.0.1", True),
    ("10.0.0.1", False), ("100.0.0.0", False), ("0.0.0.0", False), ("::1.2.3.0", False), ("fd00::10", False), ("0::1", False),
])
def test_leading_zero_octets_are_found_in_ipv4_and_in_ipv6_dotted_tails(text, refused):
    from reconciler.intake.schemas import parse_ip
    from reconciler.intake.schema_files import leading_zero_octet

    assert leading_zero_octet(text) is refused
    assert (parse_ip(text) is None) is refused
