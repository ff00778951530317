"""Issue 9, item 1: nftrec refuses only what the API server (and kubectl's YAML reader)
refuses, plus what is unsafe for nft. One section per mismatch that was fixed: an empty
port name, space-padded loadBalancerSourceRanges, IPv6 in YAML flow sequences, YAML 1.1
booleans. Each test goes from manifest text through validate, the model and compile."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reconciler.compile.render import render_script
from reconciler.compile.services import compile_ruleset
from reconciler.intake import parse
from reconciler.intake.inventory import read_inventory
from reconciler.intake.inventory import load_manifests
from reconciler.intake.model import NodeConfig
from reconciler.intake.report import run_validate
from reconciler.intake.validate import check

CFG = NodeConfig("node-a", node_ips=("192.168.0.2", "fd00::2"))


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).write_text(text)


def validate(root: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_validate(str(root), stream=out, **kw)
    return rc, out.getvalue()


def render(root: Path) -> str:
    res = read_inventory(root)
    assert res.ok, res.problems
    return render_script(compile_ruleset(res.inventory, CFG))


def service(spec: str, name: str = "web", status: str = "") -> str:
    return f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n{spec}{status}"


def endpoint_slice(body: str, svc: str = "web", at: str = "IPv4") -> str:
    return ("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata: {{name: {svc}-1, namespace: demo, labels: {{kubernetes.io/service-name: {svc}}}}}\n"
            f"addressType: {at}\n{body}")


# --- 1. a single-port Service with name: "" ------------------------------------------------


def test_single_port_service_accepts_an_empty_port_name(tmp_path):
    # validateServicePort: a name is required only with several ports, and checked only
    # when non-empty; kube-proxy matches slice port name "" to Service port name ""
    write(tmp_path, "svc.yaml", service('  clusterIP: 10.96.0.10\n  ports:\n  - {name: "", port: 80, targetPort: 8080}\n'))
    write(tmp_path, "eps.yaml", endpoint_slice('ports: [{name: "", port: 8080}]\nendpoints:\n- addresses: [10.244.1.5]\n'))
    rc, out = validate(tmp_path)
    assert rc == 0 and "0 errors, 0 warnings" in out, out
    assert "dnat to 10.244.1.5:8080" in render(tmp_path)


def test_empty_port_name_compiles_like_a_missing_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d, name in (("a", 'name: "", '), ("b", "")):
        write(tmp_path / d, "svc.yaml", service(f"  clusterIP: 10.96.0.10\n  ports:\n  - {{{name}port: 80, targetPort: 8080}}\n"))
        write(tmp_path / d, "eps.yaml", endpoint_slice(f"ports: [{{{name}port: 8080}}]\nendpoints:\n- addresses: [10.244.1.5]\n"))
    assert render(tmp_path / "a") == render(tmp_path / "b")


@pytest.mark.parametrize("ports, message", [
    # several ports: each needs a name (requireName = len(ports) > 1)
    ('  - {name: "", port: 80}\n  - {name: b, port: 81}\n', "spec.ports[0]: a Service with several ports must name every port"),
    # non-empty: still a DNS-1123 label
    ("  - {name: Web, port: 80}\n", "spec.ports[0].name: 'Web' is not empty or a DNS-1123 label"),
    ("  - {name: -a, port: 80}\n", "spec.ports[0].name: '-a' is not empty or a DNS-1123 label"),
    # and unique
    ("  - {name: a, port: 80}\n  - {name: a, port: 81}\n", "spec.ports[1].name: port name 'a' is already used by spec.ports[0]"),
])
def test_port_names_are_still_checked_when_not_empty_or_several(tmp_path, ports, message):
    write(tmp_path, "svc.yaml", service(f"  clusterIP: 10.96.0.10\n  ports:\n{ports}"))
    rc, out = validate(tmp_path)
    assert rc == 1 and message in out, out


# --- 2. space-padded loadBalancerSourceRanges ------------------------------------------------

LB = ("  type: LoadBalancer\n  clusterIP: 10.96.0.11\n  loadBalancerSourceRanges: [{ranges}]\n"
      "  ports: [{{port: 443, nodePort: 30443}}]\n")
LB_STATUS = "status:\n  loadBalancer:\n    ingress: [{ip: 192.0.2.10}]\n"


def test_space_padded_source_ranges_are_trimmed_as_kubernetes_trims_them(tmp_path):
    # ValidateService: value = strings.TrimSpace(value); kube-proxy trims again
    ranges = '" 203.0.113.0/25", "192.168.0.0/16 ", "\\t10.1.2.3/8\\u00a0"'
    write(tmp_path, "svc.yaml", service(LB.format(ranges=ranges), status=LB_STATUS))
    rc, out = validate(tmp_path)
    assert rc == 0 and "0 errors" in out, out
    svc = read_inventory(tmp_path).inventory.services[0]
    assert svc.load_balancer_source_ranges == ("203.0.113.0/25", "192.168.0.0/16", "10.0.0.0/8")
    text = render(tmp_path)
    # the sharded layout writes each range as a `return` rule (deviation 14)
    assert all(f"ip saddr {r} return\n" in text for r in ("203.0.113.0/25", "192.168.0.0/16", "10.0.0.0/8", "192.0.2.10"))


@pytest.mark.parametrize("entry", [
    '" "', '"10.0.0.0 /8"', '"10.0.0.0/ 8"', '"10.0.0.0/8 ; drop"', '"10.0.0.0/8 } accept"',
    '"10.0.0.0/8\\" accept"', '"10.0.0.0/8,192.168.0.0/16"', '"010.0.0.0/8"', '"10.0.0.0/33"',
])
def test_source_ranges_refuse_inner_spaces_and_nft_syntax(tmp_path, entry):
    # only spaces around the CIDR are Kubernetes' accident; nothing else may reach nft
    write(tmp_path, "svc.yaml", service(LB.format(ranges=entry), status=LB_STATUS))
    rc, out = validate(tmp_path)
    assert rc == 1 and "spec.loadBalancerSourceRanges[0]:" in out and "is not a valid CIDR" in out, out


def test_padded_source_range_error_hints_at_the_real_problem(tmp_path):
    write(tmp_path, "svc.yaml", service(LB.format(ranges='" 10.0.0.1"'), status=LB_STATUS))
    rc, out = validate(tmp_path)
    assert rc == 1 and "a CIDR needs a prefix length" in out and "remove the spaces" not in out, out


# --- 3. IPv6 addresses in YAML flow sequences ------------------------------------------------

V6 = ("  clusterIP: fd00:10:96::10\n  clusterIPs: [fd00:10:96::10]\n  ipFamilies: [IPv6]\n"
      "  externalIPs: [fd00:10:180::1]\n  ports: [{port: 80}]\n")


def test_ipv6_in_flow_sequences_is_read_as_kubectl_reads_it(tmp_path):
    # libyaml 0.1.7 (ruamel.yaml.clib) refuses ':' inside a flow plain scalar; go-yaml,
    # kubectl and YAML 1.2 read these as strings
    write(tmp_path, "svc.yaml", service(V6))
    write(tmp_path, "eps.yaml", endpoint_slice("ports: [{port: 80}]\nendpoints:\n- addresses: [fd00:10:244::5, fd00:10:244::6]\n", at="IPv6"))
    rc, out = validate(tmp_path)
    assert rc == 0 and "2 objects, 0 errors" in out, out
    docs = {d.kind: d.data for d in load_manifests(tmp_path).documents}
    assert docs["Service"]["spec"]["externalIPs"] == ["fd00:10:180::1"]
    assert docs["EndpointSlice"]["endpoints"][0]["addresses"] == ["fd00:10:244::5", "fd00:10:244::6"]
    assert "dnat to [fd00:10:244::5]:80" in render(tmp_path)


def test_the_fallback_parser_reads_the_same_data_and_positions(tmp_path):
    text = ("kind: List\nitems:\n- a: [{ip}, 'x', yes, \"no\", 010, 2024-01-02, =, 0x1F, 1.5, ~, true]\n"
            "  b: &s {{c: [1, 2]}}\n- d: *s\n  e: {{f: {ip}}}\n")
    fast = parse._parse_yaml_with(text.format(ip='"fd00::1"'), parse._KubeLoader)  # quoted: no fallback needed
    slow = parse.parse_yaml(text.format(ip="fd00::1"))
    assert slow == fast  # data, document position and the List items' positions
    assert [type(v) for v in slow[0][0]["items"][0]["a"][:4]] == [str, str, parse.Yaml11Bool, str]


def test_normal_files_stay_on_the_fast_parser(tmp_path, monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("the pure-Python parser was used")
    monkeypatch.setattr(parse, "_PureKubeLoader", refuse)
    write(tmp_path, "svc.yaml", service("  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n"))
    assert validate(tmp_path)[0] == 0
    write(tmp_path, "svc.yaml", "a: [b\n")  # broken in another way: the C parser's own error
    rc, out = validate(tmp_path)
    assert rc == 1 and "svc.yaml:2:1: YAML syntax error: did not find expected ',' or ']'" in out, out


@pytest.mark.parametrize("text, where, message", [
    # kubectl refuses a flow scalar starting with ':' too (kubernetes-sigs/yaml#92)
    ("a: [::1]\n", "f.yaml:1:5:", "YAML syntax error: did not find expected node content"),
    ("a: [fd00::1, ::1]\n", "f.yaml:1:14:", "YAML syntax error: found character ':' that cannot start any token"),
    # the real error after an IPv6 address is reported where it is, not at the address
    ("a: [fd00::1]\nb:\n\tc: 1\n", "f.yaml:3:1:", "YAML does not allow tabs for indentation; indent with spaces"),
    ('a: [fd00::1]\nb: "x\n', "f.yaml:3:1:", "YAML syntax error: found unexpected end of stream (while scanning a quoted scalar)"),
    # go-yaml refuses unknown directives; ruamel's pure parser would skip them
    ("a: [fd00::1]\n...\n%FOO bar\n---\nb: 1\n", "f.yaml:3:1:", "YAML syntax error: found unknown directive name"),
])
def test_broken_yaml_stays_refused_with_file_and_line(tmp_path, text, where, message):
    write(tmp_path, "f.yaml", text)
    rc, out = validate(tmp_path)
    assert rc == 1 and f"{where} {message}" in out, out


# --- 4. YAML 1.1 booleans in boolean fields ----------------------------------------------------

# go-yaml v2's resolve table (sigs.k8s.io/yaml, kubectl's reader)
YAML11 = [(w, True) for w in ("y", "Y", "yes", "Yes", "YES", "on", "On", "ON")] + \
         [(w, False) for w in ("n", "N", "no", "No", "NO", "off", "Off", "OFF")]


@pytest.mark.parametrize("word, value", YAML11)
def test_yaml_1_1_booleans_are_booleans_in_boolean_fields(tmp_path, word, value):
    write(tmp_path, "eps.yaml", endpoint_slice(f"ports: [{{port: 80}}]\nendpoints:\n- addresses: [10.244.1.5]\n"
                                               f"  conditions: {{ready: {word}, serving: true}}\n"))
    rc, out = validate(tmp_path, allow_empty=True)  # a slice alone: no Service
    spelled = "true" if value else "false"
    assert rc == 0, out
    assert (f"eps.yaml:8:23: warning: EndpointSlice demo/web-1: endpoints[0].conditions.ready: '{word}' is read as {spelled}, "
            f"as kubectl reads it") in out and f"write {spelled}" in out, out
    ep = read_inventory(tmp_path).inventory.endpoint_slices[0].endpoints[0]
    assert ep.ready is value


def test_yaml_1_1_boolean_on_a_service_field(tmp_path):
    write(tmp_path, "svc.yaml", service(LB.format(ranges="") + "  allocateLoadBalancerNodePorts: Off\n"))
    rc, out = validate(tmp_path)
    assert rc == 0 and "spec.allocateLoadBalancerNodePorts: 'Off' is read as false" in out, out
    assert load_manifests(tmp_path).documents[0].data["spec"]["allocateLoadBalancerNodePorts"] == "Off"
    res = read_inventory(tmp_path)
    assert res.ok and [p.severity for p in res.problems] == ["warning"]


@pytest.mark.parametrize("value, hint", [
    ('"yes"', "write true (quoted, 'yes' is a string to kubectl too)"),  # quoted: a string to kubectl as well
    ("yEs", ""),  # not in go-yaml's table: a string to kubectl
    ("1", ""),
])
def test_other_strings_in_boolean_fields_stay_refused(tmp_path, value, hint):
    write(tmp_path, "eps.yaml", endpoint_slice(f"endpoints:\n- addresses: [10.244.1.5]\n  conditions: {{ready: {value}}}\n"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "endpoints[0].conditions.ready: must be true or false" in out and hint in out, out


def test_yaml_1_1_words_in_string_fields_stay_strings(tmp_path):
    # only boolean fields convert: port names and zone hints keep the text
    write(tmp_path, "svc.yaml", service("  clusterIP: 10.96.0.10\n  ports: [{name: on, port: 80}]\n"))
    write(tmp_path, "eps.yaml", endpoint_slice(
        "ports: [{name: on, port: 80}]\nendpoints:\n- addresses: [10.244.1.5]\n  conditions: {ready: no}\n"
        "  hints: {forZones: [{name: yes}]}\n"))
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    svc, slice_ = res.inventory.services[0], res.inventory.endpoint_slices[0]
    assert svc.ports[0].name == "on" and slice_.ports[0].name == "on"
    assert slice_.endpoints[0].ready is False and slice_.endpoints[0].hint_zones == ("yes",)


def test_an_alias_shared_with_a_string_field_keeps_its_text(tmp_path):
    # one mapping, reached as annotations (strings) and as conditions (booleans)
    write(tmp_path, "eps.yaml", endpoint_slice("endpoints:\n- addresses: [10.244.1.5]\n  conditions: *c\n")
          .replace("namespace: demo,", "namespace: demo, annotations: &c {ready: no},"))
    checked = check(load_manifests(tmp_path))
    assert checked.ok, checked.problems
    data = checked.objects[0].doc.data
    assert data["metadata"]["annotations"] == {"ready": "no"} and isinstance(data["metadata"]["annotations"]["ready"], str)
    assert data["endpoints"][0]["conditions"] == {"ready": False}


# --- more places where nftrec was stricter than Kubernetes without a reason ----------------


def test_slice_may_list_more_than_100_ports(tmp_path):
    # validatePorts: maxPorts = 20000 (kubernetes#99795 raised it from 100)
    ports = ", ".join(f"{{name: p{i}, port: {1000 + i}}}" for i in range(101))
    write(tmp_path, "eps.yaml", endpoint_slice(f"ports: [{ports}]\nendpoints:\n- addresses: [10.244.1.5]\n"))
    rc, out = validate(tmp_path, allow_empty=True)
    assert rc == 0, out


def test_affinity_config_without_client_ip_is_ignored_as_kubernetes_drops_it(tmp_path):
    # SetDefaults_Service sets SessionAffinityConfig = nil unless ClientIP, before validation
    write(tmp_path, "svc.yaml", service("  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n"
                                        "  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n"))
    rc, out = validate(tmp_path)
    assert rc == 0 and "warning: Service demo/web: spec.sessionAffinityConfig: is ignored because sessionAffinity is not ClientIP" in out, out
    svc = read_inventory(tmp_path).inventory.services[0]
    assert svc.session_affinity == "None" and svc.affinity_timeout_seconds == 10800


def test_node_config_stays_yaml_1_2(tmp_path):
    # the node config is nftrec's own file, not a Kubernetes object kubectl reads
    from reconciler.intake.config import load_node_config
    cfg = tmp_path / "config.yaml"
    cfg.write_text("masqueradeAll: yes\n")
    _, problems = load_node_config(str(cfg), discover=False)
    assert [p.message for p in problems] == ["must be true or false, not a string ('yes'); write true "
                                             "(the node config is YAML 1.2, which reads yes as a string)"]
