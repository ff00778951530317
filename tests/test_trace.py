"""`nftrec trace`: the evaluator on the golden examples (the rulesets in tests/golden), the
command's text and JSON, and `--live` against a ruleset applied in a namespace.

The data-plane check that trace agrees with the wire is in tests/dataplane (every
`Topology.probe` is traced; see tests/dataplane/trace_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from reconciler.compile import Rule
from reconciler.compile.services import compile_ruleset
from reconciler.engine.trace import UnknownExpression, trace_packet
from reconciler.engine.tracecommand import service_sources
from reconciler.engine.tracereport import Packet, format_text

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
NFTREC = str(Path(sys.executable).with_name("nftrec"))
NODE_IP = "192.168.50.2"  # edge-small's nodeIPs[0]; nodePortAddresses [primary]
POD, OUTSIDE, BLOCKED = "10.244.0.5", "192.168.50.7", "192.168.60.7"
LB = "192.168.50.100"  # edge/ingress: eTP Local, source ranges 192.168.50.0/24, 203.0.113.0/24


def _example(name: str):
    from reconciler.intake.config import load_node_config
    from reconciler.intake.inventory import read_inventory

    result = read_inventory(EXAMPLES / name)
    config, _ = load_node_config(str(EXAMPLES / f"{name}.config.yaml"), discover=False)
    return result.inventory, config, compile_ruleset(result.inventory, config)


@pytest.fixture(scope="module")
def edge():
    return _example("edge-small")


def trace(example, src, dst, dport, proto="tcp", origin="pod"):
    inventory, config, ruleset = example
    return trace_packet(ruleset, Packet(src, dst, dport, proto, origin), config.node_ips,
                        sources=service_sources(inventory))


def eps(tr) -> dict[str, Fraction]:
    return dict(tr.endpoints)


# --- ClusterIP ---------------------------------------------------------------------------------


def test_clusterip_from_a_pod_spreads_evenly_without_masquerade(edge):
    tr = trace(edge, POD, "10.96.0.10", 80)
    assert eps(tr) == {"10.244.0.11:8080": Fraction(1, 2), "10.244.0.12:8080": Fraction(1, 2)}
    assert tr.verdicts == {"dnat"} and tr.masquerade == {False}
    assert tr.service == "default/web"
    assert tr.services["default/web"].endswith("edge-small/services.yaml:2")
    chains = [s.chain for s in tr.outcomes[0].steps]
    assert chains[:4] == ["filter-prerouting-pre-dnat", "nat-prerouting", "services",
                          "service-SUSTUHLJ-default/web/tcp/http"]
    assert tr.outcomes[0].steps[2].note.startswith("10.96.0.10 . tcp . 80 -> goto service-")


def test_clusterip_from_outside_the_cluster_cidrs_is_masqueraded(edge):
    tr = trace(edge, OUTSIDE, "10.96.0.10", 80, origin="external")
    assert set(eps(tr)) == {"10.244.0.11:8080", "10.244.0.12:8080"}
    assert tr.masquerade == {True}
    assert any(s.chain == "masquerading" and s.index == 0 for s in tr.outcomes[0].steps)


def test_udp_port_of_a_two_protocol_service(edge):
    tr = trace(edge, POD, "10.96.0.53", 53, proto="udp")
    assert eps(tr) == {"10.244.0.2:53": Fraction(1, 2), "10.244.0.3:53": Fraction(1, 2)}
    assert tr.service == "kube-system/dns"


def test_bad_port_on_a_clusterip_is_rejected_by_cluster_ips_check(edge):
    tr = trace(edge, POD, "10.96.0.10", 81)
    (o,) = tr.outcomes
    assert o.verdict == "reject" and o.decided_by.chain == "cluster-ips-check" and o.decided_by.index == 0
    assert tr.service == "default/web"  # the cluster-ips element it matched


def test_unallocated_clusterip_is_dropped(edge):
    tr = trace(edge, POD, "10.96.0.99", 80)
    (o,) = tr.outcomes
    assert o.verdict == "drop" and o.decided_by.chain == "cluster-ips-check" and o.decided_by.index == 1
    assert tr.service is None


def test_address_outside_every_service_range_is_forwarded_untouched(edge):
    tr = trace(edge, POD, "8.8.8.8", 53, proto="udp")
    assert [o.verdict for o in tr.outcomes] == ["forward"] and tr.masquerade == {False}


# --- NodePort ----------------------------------------------------------------------------------


def test_nodeport_on_the_node_ip_is_dnated_and_masqueraded(edge):
    tr = trace(edge, OUTSIDE, NODE_IP, 30443, origin="external")
    assert eps(tr) == {"10.244.1.21:8443": Fraction(1)} and tr.masquerade == {True}
    assert tr.service == "shop/api"


def test_unknown_nodeport_is_delivered_to_the_node(edge):
    tr = trace(edge, OUTSIDE, NODE_IP, 30999, origin="external")
    assert [o.verdict for o in tr.outcomes] == ["local"]


def test_nodeport_from_the_node_itself_short_circuits_and_masquerades(edge):
    tr = trace(edge, NODE_IP, NODE_IP, 30080, origin="node")
    assert set(eps(tr)) == {"10.244.0.31:8080", "10.244.2.31:8080"}  # eTP Local, local traffic
    assert tr.masquerade == {True}
    assert {s.hook for s in tr.outcomes[0].steps} == {"output", "postrouting"}


# --- LoadBalancer with source ranges, eTP Local -----------------------------------------------


def test_lb_source_range_denies_with_the_firewall_rule(edge):
    tr = trace(edge, BLOCKED, LB, 80, origin="external")
    (o,) = tr.outcomes
    assert o.verdict == "drop"
    assert o.decided_by.chain == "firewall-UZIZZOKK-edge/ingress/tcp/http" and o.decided_by.hook == "prerouting"
    assert tr.service == "edge/ingress" and tr.services["edge/ingress"].endswith("services.yaml:31")


def test_lb_allowed_source_etp_local_reaches_only_the_local_endpoint_unmasqueraded(edge):
    tr = trace(edge, "203.0.113.9", LB, 80, origin="external")
    assert eps(tr) == {"10.244.0.31:8080": Fraction(1)} and tr.masquerade == {False}
    assert any(s.chain == "local-UZIZZOKK-edge/ingress/tcp/http" for s in tr.outcomes[0].steps)


def test_etp_local_pod_traffic_is_short_circuited_to_all_endpoints(edge):
    tr = trace(edge, POD, NODE_IP, 30444)  # its NodePort: the LB IP would be firewalled for a pod
    assert eps(tr) == {"10.244.0.31:8443": Fraction(1, 2), "10.244.2.31:8443": Fraction(1, 2)}
    assert tr.masquerade == {False}
    assert any("short-circuit pod traffic" in s.rule for s in tr.outcomes[0].steps)


def test_etp_local_without_local_endpoints_drops_external_traffic():
    from reconciler.intake.model import Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, \
        NodeConfig, Service, ServicePort

    svc = Service(namespace="default", name="loc", type="LoadBalancer", cluster_ips=("10.96.0.80",),
                  ip_families=("IPv4",), external_traffic_policy="Local",
                  ports=(ServicePort(name="", protocol="TCP", port=80, target_port=8080, node_port=30082),),
                  load_balancer_ingress=(LoadBalancerIngress("203.0.113.11"),))
    slc = EndpointSlice(namespace="default", name="loc-1", service_name="loc", address_type="IPv4",
                        endpoints=(Endpoint(addresses=("10.244.1.11",), node_name="other"),),
                        ports=(EndpointPort("", "TCP", 8080),))
    cfg = NodeConfig(node_name="me", node_ips=("198.51.100.1",), cluster_cidrs=("10.244.0.0/16",))
    rs = compile_ruleset(Inventory(services=(svc,), endpoint_slices=(slc,)), cfg)
    for dst, port in (("203.0.113.11", 80), ("198.51.100.1", 30082)):
        tr = trace_packet(rs, Packet("198.51.100.2", dst, port, "tcp", "external"), cfg.node_ips)
        (o,) = tr.outcomes
        assert o.verdict == "drop" and o.decided_by.chain in ("service-endpoints-check", "nodeport-endpoints-check")
    tr = trace_packet(rs, Packet("198.51.100.1", "203.0.113.11", 80, "tcp", "node"), cfg.node_ips)
    assert eps(tr) == {"10.244.1.11:8080": Fraction(1)} and tr.masquerade == {True}


# --- no endpoints, affinity, hairpin -----------------------------------------------------------


def test_no_endpoints_is_rejected_through_reject_chain(edge):
    tr = trace(edge, POD, "10.96.0.16", 80)
    (o,) = tr.outcomes
    assert o.verdict == "reject" and o.decided_by.chain == "reject-chain"
    assert [s.chain for s in o.steps][-2:] == ["service-endpoints-check", "reject-chain"]
    assert tr.service == "default/idle"
    assert tr.services["default/idle"].endswith("services.yaml:103")


def test_affinity_is_said_and_every_endpoint_is_possible(edge):
    tr = trace(edge, POD, "10.96.0.14", 8080)
    assert eps(tr) == {"10.244.0.51:8080": Fraction(1, 2), "10.244.0.52:8080": Fraction(1, 2)}
    assert all(o.affinity for o in tr.outcomes)
    assert any("affinity" in n for n in tr.notes)
    assert any("records 10.244.0.5 in @affinity-" in s.note for s in tr.outcomes[0].steps)


def test_hairpin_endpoint_reaching_itself_is_masqueraded(edge):
    tr = trace(edge, "10.244.0.71", "10.96.0.17", 80)
    assert eps(tr) == {"10.244.0.71:8080": Fraction(1)} and tr.masquerade == {True}
    assert any(s.chain == "masquerading" and s.index == 1 for s in tr.outcomes[0].steps)
    assert trace(edge, "10.244.0.72", "10.96.0.17", 80).masquerade == {False}


def test_ipv6_hairpin_goes_through_the_shard_of_the_endpoint_address():
    """layout sharded: `ip6 daddr & ::3f vmap @hairpin-shards` picks the shard chain of the
    DNATed address; only the branch back to the client itself is masqueraded."""
    ex = _example("dual-stack")
    tr = trace(ex, "fd00:10:244::10", "fd00:10:96::1:10", 80)
    by_ep = {o.endpoint: o for o in tr.outcomes}
    assert by_ep["[fd00:10:244::10]:8080"].masquerade and not by_ep["[fd00:10:244::1:10]:8080"].masquerade
    steps = [(s.chain, s.index) for s in by_ep["[fd00:10:244::10]:8080"].steps]
    assert ("masquerading", 1) in steps and ("hairpin-10", 0) in steps


def test_ipv6_uses_the_ip6_table():
    ex = _example("dual-stack")
    tr = trace(ex, "fd00:10:244::5", "fd00:10:96::1:10", 80)
    assert tr.family == "ip6"
    assert eps(tr) == {"[fd00:10:244::10]:8080": Fraction(1, 2), "[fd00:10:244::1:10]:8080": Fraction(1, 2)}


# --- never guess ---------------------------------------------------------------------------------


def test_an_unknown_expression_is_reported_not_guessed(edge):
    _, _, rs = edge
    table = rs.tables["ip"]
    services = table.chains["services"]
    table.chains["services"] = replace(services, rules=(Rule("tcp flags syn ip daddr 10.96.0.10 drop"),)
                                       + services.rules)
    try:
        with pytest.raises(UnknownExpression) as e:
            trace(edge, POD, "10.96.0.10", 80)
        assert e.value.chain == "services" and "tcp flags" in str(e.value)
    finally:
        table.chains["services"] = services


def test_bad_input_is_refused(edge):
    from reconciler.engine.trace import TraceError

    for p in (Packet(POD, "fd00::1", 80), Packet(POD, "10.96.0.10", 0), Packet(POD, "10.96.0.10", 80, "icmp")):
        with pytest.raises(TraceError):
            trace_packet(edge[2], p)
    with pytest.raises(TraceError, match="'010.96.0.10': an IPv4 octet written with a leading zero"):
        trace_packet(edge[2], Packet(POD, "010.96.0.10", 80))  # Python 3.9.0-3.9.4's ipaddress would read 10.96.0.10


# --- the command ---------------------------------------------------------------------------------


def _cli(*args: str, ok: int = 0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([NFTREC, "trace", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1"}, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == ok, proc.stdout + proc.stderr
    return proc


def test_cli_text_and_json():
    base = [str(EXAMPLES / "edge-small"), "--config", str(EXAMPLES / "edge-small.config.yaml")]
    text = _cli("--src", BLOCKED, "--dst", LB, "--dport", "80", "--from", "external", *base).stdout
    assert "DROP by firewall-UZIZZOKK-edge/ingress/tcp/http rule 4: drop" in text  # after 3 `return`s
    assert "service: edge/ingress (" in text and "services.yaml:31)" in text
    assert "prerouting  firewall-check  [1]" in text
    data = json.loads(_cli("--src", POD, "--dst", "10.96.0.10", "--dport", "80", *base, "-o", "json").stdout)
    assert data["endpoints"] == {"10.244.0.11:8080": {"probability": "1/2", "probabilityValue": 0.5},
                                 "10.244.0.12:8080": {"probability": "1/2", "probabilityValue": 0.5}}
    assert data["masquerade"] == [False] and data["service"] == "default/web"
    assert data["source"].endswith("services.yaml:2") and data["ruleset"] == "desired"
    assert len(data["outcomes"]) == 2 and data["outcomes"][0]["path"][0]["chain"] == "filter-prerouting-pre-dnat"
    err = _cli("--src", POD, "--dst", "fd00::1", "--dport", "80", *base, ok=1).stderr
    assert "different IP families" in err


def test_text_output_names_each_branch(edge):
    text = format_text(trace(edge, POD, "10.96.0.10", 80))
    assert "branch 1/2 (probability 1/2): DNAT to 10.244.0.11:8080, not masqueraded" in text
    assert "DNAT to 10.244.0.12:8080 with probability 1/2, not masqueraded" in text


def test_live_trace_agrees_with_the_desired_one(netns, tmp_path):
    """Apply edge-small in a namespace; `trace --live` (nft's listing, parsed back) gives the
    same verdicts, endpoints, masquerade and Service as the desired ruleset."""
    base = ["--config", str(EXAMPLES / "edge-small.config.yaml"), "--netns", netns]
    proc = subprocess.run([NFTREC, "--state-dir", str(tmp_path / "state"), "apply", str(EXAMPLES / "edge-small"),
                           *base], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    packets = [(POD, "10.96.0.10", "80", "pod"), (OUTSIDE, "10.96.0.10", "80", "external"),
               (BLOCKED, LB, "80", "external"), ("203.0.113.9", LB, "80", "external"),
               (POD, "10.96.0.16", "80", "pod"), (POD, "10.96.0.14", "8080", "pod"),
               ("10.244.0.71", "10.96.0.17", "80", "pod"), (POD, "10.96.0.99", "80", "pod")]
    keys = ("verdicts", "endpoints", "masquerade", "service", "source")
    for src, dst, port, origin in packets:
        args = ["--src", src, "--dst", dst, "--dport", port, "--from", origin, str(EXAMPLES / "edge-small"),
                *base, "-o", "json"]
        desired = json.loads(_cli(*args).stdout)
        live = json.loads(_cli(*args, "--live").stdout)
        assert live["ruleset"] == "live"
        assert {k: live[k] for k in keys} == {k: desired[k] for k in keys}, (src, dst, port)


def test_trace_without_dir_reads_only_the_applied_ruleset(netns, tmp_path):
    """No DIR: the ruleset the state recorded as applied, whatever lies in the working
    directory (here a broken manifest and a stray Service); before any apply, an error
    that says what to pass."""
    junk = tmp_path / "cwd"
    junk.mkdir()
    (junk / "broken.yaml").write_text("kind: Service\nspec: [\n")
    (junk / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: stray}\n"
                                   "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n")
    state = ["--state-dir", str(tmp_path / "state")]
    base = ["--config", str(EXAMPLES / "edge-small.config.yaml"), "--netns", netns]
    packet = ["--src", POD, "--dst", "10.96.0.10", "--dport", "80", "-o", "json"]
    run = [NFTREC, *state, "trace", *packet, *base]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=junk)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no applied ruleset in " in proc.stderr and "pass the manifest directory: nftrec trace DIR" in proc.stderr
    assert not (tmp_path / "state" / "netns").exists()
    proc = subprocess.run([NFTREC, *state, "apply", str(EXAMPLES / "edge-small"), *base], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=junk)
    assert proc.returncode == 0, proc.stderr
    applied = json.loads(proc.stdout)
    desired = json.loads(_cli(*packet, str(EXAMPLES / "edge-small"), *base).stdout)
    assert applied["ruleset"] == "applied" and applied["service"] == "default/web"
    assert applied["endpoints"] == desired["endpoints"] and applied["verdicts"] == desired["verdicts"]
    proc = subprocess.run([NFTREC, *state, "cleanup", "--netns", netns], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=junk)
    assert proc.returncode == 1 and "cleaned up at " in proc.stderr, proc.stderr  # no ruleset is applied now


def test_numgen_over_a_named_map_is_read_from_the_map(edge):
    """A DNAT layout with the endpoints in a named map (`numgen … map @m`) is evaluated
    from the map's elements, not guessed."""
    from reconciler.compile import Element, NamedSet

    _, _, rs = edge
    table = rs.tables["ip"]
    name = "service-SUSTUHLJ-default/web/tcp/http"
    saved = table.chains[name]
    m = NamedSet("eps-web", "integer", "ipv4_addr . inet_service")
    m.add(Element(("0",), "10.244.0.11 . 8080"))
    m.add(Element(("1",), "10.244.0.99 . 8081"))
    table.sets["eps-web"] = m
    table.chains[name] = replace(saved, rules=(Rule("meta l4proto tcp dnat ip addr . port to numgen random mod 2 "
                                                    "map @eps-web"),))
    try:
        tr = trace(edge, POD, "10.96.0.10", 80)
        assert eps(tr) == {"10.244.0.11:8080": Fraction(1, 2), "10.244.0.99:8081": Fraction(1, 2)}
    finally:
        table.chains[name] = saved
        del table.sets["eps-web"]
