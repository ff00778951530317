"""The typed model: Kubernetes defaults, legacy Endpoints, and property-based round trips
(generated valid manifests validate with zero problems and come back as the same values)."""

from __future__ import annotations

import ipaddress
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from reconciler.intake import model
from reconciler.intake.inventory import read_inventory

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def dump(root: Path, rel: str, docs: list[dict]) -> None:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        yaml.dump_all(docs, f)


def test_defaults_and_normalisation(tmp_path):
    dump(tmp_path, "a.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"clusterIPs": ["fd00:0010:0096:0000:0000:0000:0000:000a", "10.96.0.10"],
                  "type": "LoadBalancer", "loadBalancerSourceRanges": ["192.168.50.7/24"],
                  "ports": [{"port": 80, "nodePort": 30080}]},
         "status": {"loadBalancer": {"ingress": [{"ip": "192.168.50.100"}, {"hostname": "lb.example.com"},
                                                 {"ip": "192.168.50.101", "ipMode": "Proxy"}]}}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv4", "ports": [{"port": 8080}],
         "endpoints": [{"addresses": ["10.244.0.1"]},
                       {"addresses": ["10.244.0.2"], "conditions": {"ready": False}},
                       {"addresses": ["10.244.0.3"], "conditions": {"ready": False, "serving": False, "terminating": True},
                        "nodeName": "edge-1", "zone": "a", "hints": {"forZones": [{"name": "a"}]}}]},
    ])
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    [svc] = res.inventory.services
    assert svc.namespace == "default" and svc.type == "LoadBalancer"
    assert svc.cluster_ips == ("fd00:10:96::a", "10.96.0.10")
    assert svc.ip_families == ("IPv6", "IPv4")  # derived from the IPs when omitted
    assert svc.ports == (model.ServicePort("", "TCP", 80, 80, 30080),)  # targetPort defaults to port
    assert svc.load_balancer_source_ranges == ("192.168.50.0/24",)
    assert svc.load_balancer_ingress == (model.LoadBalancerIngress("192.168.50.100"),
                                         model.LoadBalancerIngress("192.168.50.101", "Proxy"))
    assert (svc.external_traffic_policy, svc.internal_traffic_policy) == ("Cluster", "Cluster")
    assert (svc.session_affinity, svc.affinity_timeout_seconds) == ("None", 10800)
    [sl] = res.inventory.endpoint_slices
    assert sl.ports == (model.EndpointPort("", "TCP", 8080),)
    a, b, c = sl.endpoints
    assert (a.ready, a.serving, a.terminating, a.hint_zones) == (True, True, False, None)
    assert (b.ready, b.serving, b.terminating) == (False, True, False)  # serving nil -> true
    assert (c.ready, c.serving, c.terminating, c.node_name, c.zone, c.hint_zones) == (False, False, True, "edge-1", "a", ("a",))
    assert svc.source.line == 1 and sl.source.file.endswith("a.yaml")


def test_headless_external_name_and_affinity(tmp_path):
    dump(tmp_path, "a.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "h", "namespace": "x"},
         "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "e"},
         "spec": {"type": "ExternalName", "externalName": "db.example.com"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
         "spec": {"clusterIP": "10.96.0.5", "sessionAffinity": "ClientIP", "ports": [{"port": 80}]}},
    ])
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    h, e, s = res.inventory.services
    assert h.headless and h.cluster_ips == () and h.key == "x/h"
    assert e.type == "ExternalName" and e.cluster_ips == () and e.ip_families == ()
    assert (s.session_affinity, s.affinity_timeout_seconds, s.ip_families) == ("ClientIP", 10800, ("IPv4",))


def test_legacy_endpoints_become_slices(tmp_path):
    dump(tmp_path, "a.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "legacy"},
         "spec": {"clusterIPs": ["10.96.0.17", "fd00:10:96::17"], "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "legacy"},
         "subsets": [{"addresses": [{"ip": "10.244.0.71", "nodeName": "edge-1"}, {"ip": "fd00:10:244::71"}],
                      "notReadyAddresses": [{"ip": "10.244.0.72"}],
                      "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]},
    ])
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    v4, v6 = res.inventory.endpoint_slices
    assert (v4.service_name, v4.address_type, v6.address_type) == ("legacy", "IPv4", "IPv6")
    assert v4.endpoints == (model.Endpoint(("10.244.0.71",), ready=True, node_name="edge-1"),
                            model.Endpoint(("10.244.0.72",), ready=False))
    assert v6.endpoints == (model.Endpoint(("fd00:10:244::71",)),)
    assert v4.ports == (model.EndpointPort("http", "TCP", 8080),)


def test_service_cidr_and_revision(tmp_path):
    dump(tmp_path, "c.yaml", [{"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "x"},
                               "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112"]}}])
    res = read_inventory(tmp_path)
    assert res.ok
    assert res.inventory.service_cidrs == (model.ServiceCIDR("x", ("10.96.0.0/16", "fd00:10:96::/112")),)
    assert res.inventory.revision.startswith("sha256:")
    # host bits set: Kubernetes refuses a ServiceCIDR that is not in canonical form
    dump(tmp_path, "c.yaml", [{"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "x"},
                               "spec": {"cidrs": ["10.96.1.2/16"]}}])
    res = read_inventory(tmp_path)
    assert not res.ok and not res.inventory.service_cidrs


def test_kubernetes_defaults_for_zero_empty_and_null(tmp_path):
    dump(tmp_path, "a.yaml", [{"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "web", "namespace": "", "labels": None},
                               "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "externalIPs": None,
                                        "healthCheckNodePort": 0, "sessionAffinityConfig": None,
                                        "ports": [{"name": "a", "port": 80, "targetPort": 0, "nodePort": 0},
                                                  {"name": "b", "port": 81, "targetPort": "", "protocol": None}]}}])
    res = read_inventory(tmp_path)
    assert res.ok, res.problems
    [s] = res.inventory.services
    assert (s.namespace, s.external_ips, s.health_check_node_port, s.affinity_timeout_seconds) == ("default", (), 0, 10800)
    assert [(p.port, p.target_port, p.node_port, p.protocol) for p in s.ports] == [(80, 80, 0, "TCP"), (81, 81, 0, "TCP")]


def test_invalid_documents_stay_out_of_the_model(tmp_path):
    dump(tmp_path, "a.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "good"}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"}, "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": 0}]}},
    ])
    res = read_inventory(tmp_path)
    assert not res.ok and [s.name for s in res.inventory.services] == ["good"]


def test_edge_small_example_model():
    res = read_inventory(EXAMPLES / "edge-small")
    assert res.ok, res.errors
    keys = {s.key for s in res.inventory.services}
    assert {"default/web", "shop/api", "edge/ingress", "kube-system/dns", "default/legacy", "shop/external-db"} <= keys
    assert res.inventory.service_cidrs[0].cidrs == ("10.96.0.0/16",)


# --- property-based round trip ------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
bools = st.sampled_from([None, True, False])


@st.composite
def manifests(draw):
    n = draw(st.integers(1, 6))
    svc_names = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    docs, expected_svcs, expected_slices = [], [], []
    node_port = 30000
    for i, name in enumerate(svc_names):
        ns = draw(st.sampled_from(["default", "shop", "kube-system"]))
        stype = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
        dual = draw(st.booleans())
        v4 = ipaddress.ip_address(f"10.96.{i // 200}.{i % 200 + 1}")
        v6 = ipaddress.ip_address(f"fd00:10:96::{i + 1:x}")
        v6_primary = dual and draw(st.booleans())
        ips = [v6, v4] if v6_primary else ([v4, v6] if dual else [draw(st.sampled_from([v4, v6]))])
        written = [ip.exploded if draw(st.booleans()) and ip.version == 6 else str(ip) for ip in ips]
        nports = draw(st.integers(1, 3))
        numbers = draw(st.lists(st.integers(1, 65535), min_size=nports, max_size=nports, unique=True))
        ports, eports = [], []
        for j, num in enumerate(numbers):
            proto = draw(st.sampled_from(["TCP", "UDP", "SCTP"]))
            pname = f"p{j}" if nports > 1 or draw(st.booleans()) else ""
            tp = draw(st.one_of(st.none(), st.integers(1, 65535), st.just("web") if pname else st.none()))
            p = {"port": num, "protocol": proto}
            if pname:
                p["name"] = pname
            if tp is not None:
                p["targetPort"] = tp
            np_ = 0
            if stype != "ClusterIP":
                node_port += 1
                np_ = node_port
                p["nodePort"] = np_
            ports.append(p)
            eports.append(model.EndpointPort(pname, proto, draw(st.integers(1, 65535))))
        spec = {"type": stype, "ports": ports}
        if len(written) == 1 and draw(st.booleans()):
            spec["clusterIP"] = written[0]
        else:
            spec["clusterIPs"] = written
            spec["clusterIP"] = written[0]
        fams = tuple("IPv4" if ip.version == 4 else "IPv6" for ip in ips)
        if draw(st.booleans()):
            spec["ipFamilies"] = list(fams)
        etp = draw(st.sampled_from(["Cluster", "Local"])) if stype != "ClusterIP" else "Cluster"
        if stype != "ClusterIP":
            spec["externalTrafficPolicy"] = etp
        itp = draw(st.sampled_from(["Cluster", "Local"]))
        spec["internalTrafficPolicy"] = itp
        aff, timeout = "None", 10800
        if draw(st.booleans()):
            aff = "ClientIP"
            spec["sessionAffinity"] = aff
            if draw(st.booleans()):
                timeout = draw(st.integers(1, 86400))
                spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec})
        expected_svcs.append(model.Service(
            namespace=ns, name=name, type=stype, cluster_ips=tuple(str(ip) for ip in ips), ip_families=fams,
            ports=tuple(model.ServicePort(p.get("name", ""), p["protocol"], p["port"], p.get("targetPort", p["port"]),
                                          p.get("nodePort", 0)) for p in ports),
            external_traffic_policy=etp, internal_traffic_policy=itp, session_affinity=aff,
            affinity_timeout_seconds=timeout))
        for k in range(draw(st.integers(0, 2))):
            fam = draw(st.sampled_from(fams))
            endpoints, eps_model = [], []
            for e in range(draw(st.integers(0, 3))):
                addr = ipaddress.ip_address(f"10.244.{i}.{k * 10 + e + 1}" if fam == "IPv4" else f"fd00:10:244::{i:x}:{k * 10 + e + 1:x}")
                ready, serving, term = draw(bools), draw(bools), draw(bools)
                cond = {c: v for c, v in (("ready", ready), ("serving", serving), ("terminating", term)) if v is not None}
                ep = {"addresses": [str(addr)]}
                if cond:
                    ep["conditions"] = cond
                node = draw(st.sampled_from([None, "edge-1", "edge-2"]))
                if node:
                    ep["nodeName"] = node
                endpoints.append(ep)
                eps_model.append(model.Endpoint((str(addr),), ready is not False, serving is not False, term is True, node))
            sname = f"{name}-{k}"
            docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                         "metadata": {"name": sname, "namespace": ns, "labels": {"kubernetes.io/service-name": name}},
                         "addressType": fam, "endpoints": endpoints,
                         "ports": [{"name": p.name, "protocol": p.protocol, "port": p.port} for p in eports]})
            expected_slices.append(model.EndpointSlice(ns, sname, name, fam, tuple(eps_model), tuple(eports)))
    return docs, expected_svcs, expected_slices


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.integers(1, 3))
def test_generated_manifests_round_trip(gen, files):
    docs, svcs, slices = gen
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for f in range(files):  # spread over files; each file multi-document
            part = docs[f::files]
            if part:
                dump(root, f"sub{f}/m{f}.yaml", part)
        res = read_inventory(root)
    assert res.problems == [], [p.format_text() for p in res.problems]
    assert res.documents == len(docs)
    key = lambda o: (o.namespace, o.name)  # noqa: E731
    assert sorted(res.inventory.services, key=key) == sorted(svcs, key=key)
    assert sorted(res.inventory.endpoint_slices, key=key) == sorted(slices, key=key)
