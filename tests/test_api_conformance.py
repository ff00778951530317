"""docs/api-conformance.md, row by row: for each validated field, values that Kubernetes
accepts and refuses, and nftrec's verdict on each.

`k8s` records what Kubernetes does with the value (from the validation functions the doc
names; it is not run here), `nftrec` what nftrec must do. A case where they differ is a
place where nftrec is stricter or looser, and the doc must say so in that row's verdict:
test_doc_verdicts_match_the_cases checks the table against these cases, and that every row
of the table has a case.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.intake.inventory import load_manifests
from reconciler.intake.validate import check

DOC = Path(__file__).resolve().parent.parent / "docs" / "api-conformance.md"
LABEL = "kubernetes.io/service-name"

SVC = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "demo"},
       "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}
LB = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb", "namespace": "demo"},
      "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.11",
               "ports": [{"name": "https", "port": 443, "nodePort": 30443, "protocol": "TCP"}]},
      "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}}
NP = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np", "namespace": "demo"},
      "spec": {"type": "NodePort", "clusterIP": "10.96.0.12", "ports": [{"port": 80, "nodePort": 30080}]}}
XN = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "xn", "namespace": "demo"},
      "spec": {"type": "ExternalName", "externalName": "example.com"}}
SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-abc", "namespace": "demo", "labels": {LABEL: "web"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
         "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": True}}]}
EPS = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "demo"},
       "subsets": [{"addresses": [{"ip": "10.244.1.5"}], "ports": [{"name": "http", "port": 8080}]}]}
CIDR = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.100.0.0/16"]}}
DELETE = object()


@dataclass
class Case:
    row: tuple[str, str]  # (Kind, field) as in the doc's table
    nftrec: bool  # nftrec accepts it
    k8s: bool  # Kubernetes accepts it
    base: dict | None = None
    patch: dict = field(default_factory=dict)  # path ("a.b.0.c" or a tuple) -> value or DELETE
    text: str | None = None  # or the whole file, for YAML-reading rows
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.row[0]}:{self.row[1]}:{self.note or ('ok' if self.nftrec else 'refused')}"


def same(row, base, patch, ok, note=""):
    return Case(row, ok, ok, base, patch, note=note)


def stricter(row, base, patch, note=""):
    return Case(row, False, True, base, patch, note=note or "stricter")


def looser(row, base, patch, note=""):
    return Case(row, True, False, base, patch, note=note or "looser")


def yaml_case(row, text, nftrec, k8s, note=""):
    return Case(row, nftrec, k8s, text=text, note=note)


def svc_ports(*ports):
    return {"spec.ports": list(ports)}


def n_items(n, make):
    return [make(i) for i in range(n)]


R = {  # the rows, by short name
    "name": ("Service", "metadata.name"), "ns": ("Service", "metadata.namespace"),
    "labels": ("Service", "metadata.labels"), "ann": ("Service", "metadata.annotations"),
    "type": ("Service", "spec.type"), "ports": ("Service", "spec.ports"),
    "pname": ("Service", "spec.ports[].name"), "puniq": ("Service", "spec.ports[].name uniqueness"),
    "port": ("Service", "spec.ports[].port"), "pdup": ("Service", "spec.ports[] (port, protocol) duplicates"),
    "proto": ("Service", "spec.ports[].protocol"), "tport": ("Service", "spec.ports[].targetPort"),
    "nport": ("Service", "spec.ports[].nodePort"), "appp": ("Service", "spec.ports[].appProtocol"),
    "cips": ("Service", "spec.clusterIP / spec.clusterIPs"), "cipsyn": ("Service", "spec.clusterIP(s) IP syntax"),
    "headless": ("Service", "spec.clusterIP: None with NodePort/LoadBalancer"),
    "fams": ("Service", "spec.ipFamilies"), "pol": ("Service", "spec.ipFamilyPolicy"),
    "eips": ("Service", "spec.externalIPs[]"), "lbip": ("Service", "spec.loadBalancerIP"),
    "lbsr": ("Service", "spec.loadBalancerSourceRanges[]"), "etp": ("Service", "spec.externalTrafficPolicy"),
    "itp": ("Service", "spec.internalTrafficPolicy"), "aff": ("Service", "spec.sessionAffinity"),
    "afft": ("Service", "spec.sessionAffinityConfig.clientIP.timeoutSeconds"),
    "hcnp": ("Service", "spec.healthCheckNodePort"), "alnp": ("Service", "spec.allocateLoadBalancerNodePorts"),
    "lbc": ("Service", "spec.loadBalancerClass"), "td": ("Service", "spec.trafficDistribution"),
    "sel": ("Service", "spec.selector"), "xname": ("Service", "spec.externalName"),
    "ingip": ("Service", "status.loadBalancer.ingress[].ip"), "ingmode": ("Service", "status.loadBalancer.ingress[].ipMode"),
    "inghost": ("Service", "status.loadBalancer.ingress[].hostname"),
    "s.name": ("EndpointSlice", "metadata.name"), "s.ns": ("EndpointSlice", "metadata.namespace"),
    "s.label": ("EndpointSlice", "metadata.labels[kubernetes.io/service-name]"),
    "s.at": ("EndpointSlice", "addressType"), "s.eps": ("EndpointSlice", "endpoints"),
    "s.naddr": ("EndpointSlice", "endpoints[].addresses"), "s.ip": ("EndpointSlice", "endpoints[].addresses[] (IPv4, IPv6)"),
    "s.fqdn": ("EndpointSlice", "endpoints[].addresses[] (FQDN)"), "s.cond": ("EndpointSlice", "endpoints[].conditions.*"),
    "s.host": ("EndpointSlice", "endpoints[].hostname"), "s.node": ("EndpointSlice", "endpoints[].nodeName"),
    "s.zone": ("EndpointSlice", "endpoints[].zone"), "s.fz": ("EndpointSlice", "endpoints[].hints.forZones"),
    "s.fn": ("EndpointSlice", "endpoints[].hints.forNodes"), "s.ports": ("EndpointSlice", "ports"),
    "s.pname": ("EndpointSlice", "ports[].name"), "s.port": ("EndpointSlice", "ports[].port"),
    "s.proto": ("EndpointSlice", "ports[].protocol"), "s.appp": ("EndpointSlice", "ports[].appProtocol"),
    "e.name": ("Endpoints", "metadata.name"), "e.subsets": ("Endpoints", "subsets[]"),
    "e.ip": ("Endpoints", "subsets[].addresses[].ip, notReadyAddresses[].ip"),
    "e.host": ("Endpoints", "subsets[].addresses[].hostname, .nodeName"),
    "e.pname": ("Endpoints", "subsets[].ports[].name"), "e.port": ("Endpoints", "subsets[].ports[].port, .protocol"),
    "e.appp": ("Endpoints", "subsets[].ports[].appProtocol"),
    "unk": ("Service", "unknown fields"), "s.unk": ("EndpointSlice", "unknown fields"),
    "e.unk": ("Endpoints", "unknown fields"), "c.unk": ("ServiceCIDR", "unknown fields"),
    "c.name": ("ServiceCIDR", "metadata.name"), "c.cidrs": ("ServiceCIDR", "spec.cidrs"),
    "y.bool": ("YAML", "plain y/yes/on/n/no/off in a boolean field"),
    "y.boolstr": ("YAML", "plain y/yes/on/n/no/off in a string field"),
    "y.flow": ("YAML", "IPv6 in flow sequences"), "y.zero": ("YAML", "integers with a leading zero"),
}

CASES = [
    # --- Service metadata
    same(R["name"], SVC, {"metadata.name": "web-1"}, True),
    same(R["name"], SVC, {"metadata.name": "1web"}, False, "leading digit"),
    same(R["name"], SVC, {"metadata.name": "Web"}, False, "upper case"),
    same(R["ns"], SVC, {"metadata.namespace": "team-a"}, True),
    same(R["ns"], SVC, {"metadata.namespace": ""}, True, "empty is default"),
    same(R["ns"], SVC, {"metadata.namespace": "Team_A"}, False),
    same(R["labels"], SVC, {"metadata.labels": {"app": "web", "tier": ""}}, True),
    same(R["labels"], SVC, {"metadata.labels": {"app": "-web"}}, False, "bad value"),
    looser(R["labels"], SVC, {"metadata.labels": {"bad key!": "x"}}, "bad key"),
    same(R["ann"], SVC, {"metadata.annotations": {"example.com/note": "any text at all"}}, True),
    same(R["ann"], SVC, {"metadata.annotations": {"n": 1}}, False, "not a string"),
    looser(R["ann"], SVC, {"metadata.annotations": {"bad key!": "x"}}, "bad key"),
    # --- Service spec
    same(R["type"], SVC, {"spec.type": "NodePort"}, True),
    same(R["type"], SVC, {"spec.type": DELETE}, True, "missing is ClusterIP"),
    same(R["type"], SVC, {"spec.type": "Internal"}, False),
    same(R["ports"], SVC, {"spec.ports": []}, False, "no ports"),
    same(R["ports"], SVC, {"spec.ports": DELETE, "spec.clusterIP": "None"}, True, "headless without ports"),
    same(R["pname"], SVC, {"spec.ports.0.name": ""}, True, "empty single port"),
    same(R["pname"], SVC, {"spec.ports.0.name": DELETE}, True, "missing single port"),
    same(R["pname"], SVC, {"spec.ports.0.name": "HTTP"}, False, "not a label"),
    same(R["pname"], SVC, svc_ports({"name": "", "port": 80}, {"name": "b", "port": 81}), False, "empty of several"),
    same(R["puniq"], SVC, svc_ports({"name": "a", "port": 80}, {"name": "b", "port": 81}), True),
    same(R["puniq"], SVC, svc_ports({"name": "a", "port": 80}, {"name": "a", "port": 81}), False),
    same(R["port"], SVC, {"spec.ports.0.port": 65535}, True),
    same(R["port"], SVC, {"spec.ports.0.port": 0}, False, "zero"),
    same(R["port"], SVC, {"spec.ports.0.port": 65536}, False, "too big"),
    same(R["pdup"], SVC, svc_ports({"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "UDP"}), True),
    same(R["pdup"], SVC, svc_ports({"name": "a", "port": 80}, {"name": "b", "port": 80}), False),
    same(R["proto"], SVC, {"spec.ports.0.protocol": "SCTP"}, True),
    same(R["proto"], SVC, {"spec.ports.0.protocol": "ICMP"}, False),
    same(R["tport"], SVC, {"spec.ports.0.targetPort": "web"}, True, "name"),
    same(R["tport"], SVC, {"spec.ports.0.targetPort": 0}, True, "zero is port"),
    same(R["tport"], SVC, {"spec.ports.0.targetPort": "a--b"}, False, "bad name"),
    same(R["tport"], SVC, {"spec.ports.0.targetPort": "abcdefghijklmnop"}, False, "16 characters"),
    same(R["tport"], SVC, {"spec.ports.0.targetPort": 65536}, False, "too big"),
    same(R["nport"], NP, {"spec.ports.0.nodePort": 30081}, True),
    same(R["nport"], SVC, {"spec.ports.0.nodePort": 30081}, False, "on ClusterIP"),
    same(R["nport"], NP, svc_ports({"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30080}),
         False, "twice"),
    looser(R["nport"], NP, {"spec.ports.0.nodePort": 80}, "outside the allocator range"),
    same(R["appp"], SVC, {"spec.ports.0.appProtocol": "kubernetes.io/h2c"}, True),
    looser(R["appp"], SVC, {"spec.ports.0.appProtocol": "not valid!"}),
    same(R["cips"], SVC, {"spec.clusterIPs": ["10.96.0.10"]}, True),
    same(R["cips"], SVC, {"spec.clusterIP": DELETE, "spec.clusterIPs": ["10.96.0.10", "fd00::10"],
                          "spec.ipFamilyPolicy": "PreferDualStack"}, True, "dual-stack"),
    same(R["cips"], SVC, {"spec.clusterIPs": ["10.96.0.11"]}, False, "differs from clusterIP"),
    same(R["cips"], SVC, {"spec.clusterIP": "None", "spec.clusterIPs": ["None", "10.96.0.11"]}, False, "None and an IP"),
    same(R["cips"], SVC, {"spec.clusterIP": DELETE, "spec.clusterIPs": ["10.96.0.10", "fd00::10", "10.96.0.11"]}, False, "three"),
    same(R["cips"], SVC, {"spec.clusterIP": DELETE, "spec.clusterIPs": ["10.96.0.10", "10.96.0.11"]}, False, "one family twice"),
    looser(R["cips"], SVC, {"spec.clusterIP": "fd00::0010", "spec.clusterIPs": ["fd00::10"]}, "same address, other text"),
    same(R["cipsyn"], SVC, {"spec.clusterIP": "fd00::10"}, True),
    same(R["cipsyn"], SVC, {"spec.clusterIP": "10.96.0.300"}, False, "not an IP"),
    same(R["cipsyn"], SVC, {"spec.clusterIP": "10.96.0.10%eth0"}, False, "zone"),
    stricter(R["cipsyn"], SVC, {"spec.clusterIP": "010.96.0.10"}, "leading zero"),
    stricter(R["cipsyn"], SVC, {"spec.clusterIP": "::ffff:10.96.0.10"}, "IPv4-mapped"),
    same(R["headless"], SVC, {"spec.clusterIP": "None"}, True, "ClusterIP"),
    same(R["headless"], NP, {"spec.clusterIP": "None"}, False, "NodePort"),
    same(R["fams"], SVC, {"spec.ipFamilies": ["IPv4"]}, True),
    same(R["fams"], SVC, {"spec.ipFamilies": ["IPv6"]}, False, "disagrees with clusterIP"),
    same(R["fams"], SVC, {"spec.ipFamilies": ["IPv4", "IPv4"]}, False, "twice"),
    same(R["fams"], SVC, {"spec.ipFamilies": ["IPv5"]}, False, "unknown"),
    stricter(R["fams"], SVC, {"spec.clusterIP": DELETE, "spec.clusterIPs": ["10.96.0.10", "fd00::10"],
                              "spec.ipFamilies": ["IPv4"]}, "one family for two IPs"),
    same(R["pol"], SVC, {"spec.ipFamilyPolicy": "PreferDualStack"}, True),
    same(R["pol"], SVC, {"spec.ipFamilyPolicy": "Dual"}, False, "unknown"),
    stricter(R["pol"], SVC, {"spec.clusterIP": DELETE, "spec.clusterIPs": ["10.96.0.10", "fd00::10"],
                             "spec.ipFamilyPolicy": "SingleStack"}, "SingleStack with two IPs"),
    same(R["eips"], SVC, {"spec.externalIPs": ["203.0.113.5", "2001:db8::5"]}, True),
    same(R["eips"], SVC, {"spec.externalIPs": ["127.0.0.1"]}, False, "loopback"),
    same(R["eips"], SVC, {"spec.externalIPs": ["169.254.1.1"]}, False, "link-local"),
    stricter(R["eips"], SVC, {"spec.externalIPs": ["010.1.2.3"]}, "leading zero"),
    same(R["lbip"], LB, {"spec.loadBalancerIP": "anything"}, True),
    same(R["lbsr"], LB, {"spec.loadBalancerSourceRanges": ["203.0.113.0/25", "2001:db8::/64"]}, True),
    same(R["lbsr"], LB, {"spec.loadBalancerSourceRanges": [" 203.0.113.0/25", "10.0.0.1/8 "]}, True, "padded, host bits"),
    same(R["lbsr"], LB, {"spec.loadBalancerSourceRanges": ["10.0.0.0/33"]}, False, "bad prefix"),
    same(R["lbsr"], LB, {"spec.loadBalancerSourceRanges": ["10.0.0.0 /8"]}, False, "inner space"),
    stricter(R["lbsr"], LB, {"spec.loadBalancerSourceRanges": ["010.0.0.0/8"]}, "leading zero"),
    looser(R["lbsr"], SVC, {"spec.loadBalancerSourceRanges": ["10.0.0.0/8"]}, "on ClusterIP"),
    same(R["etp"], NP, {"spec.externalTrafficPolicy": "Local"}, True),
    same(R["etp"], SVC, {"spec.externalTrafficPolicy": "Local"}, False, "Local on ClusterIP"),
    same(R["etp"], NP, {"spec.externalTrafficPolicy": "Remote"}, False, "unknown"),
    looser(R["etp"], SVC, {"spec.externalTrafficPolicy": "Cluster"}, "Cluster on ClusterIP"),
    same(R["itp"], SVC, {"spec.internalTrafficPolicy": "Local"}, True),
    same(R["itp"], SVC, {"spec.internalTrafficPolicy": "Node"}, False),
    same(R["aff"], SVC, {"spec.sessionAffinity": "ClientIP"}, True),
    same(R["aff"], SVC, {"spec.sessionAffinity": "Sticky"}, False),
    same(R["afft"], SVC, {"spec.sessionAffinity": "ClientIP", "spec.sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86400}}}, True),
    same(R["afft"], SVC, {"spec.sessionAffinity": "ClientIP", "spec.sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}, False, "zero"),
    same(R["afft"], SVC, {"spec.sessionAffinity": "ClientIP", "spec.sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}, False, "too big"),
    same(R["afft"], SVC, {"spec.sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}, True, "without ClientIP: dropped"),
    same(R["hcnp"], LB, {"spec.externalTrafficPolicy": "Local", "spec.healthCheckNodePort": 30100}, True),
    same(R["hcnp"], NP, {"spec.healthCheckNodePort": 30100}, False, "not LB+Local"),
    same(R["alnp"], LB, {"spec.allocateLoadBalancerNodePorts": False}, True),
    same(R["alnp"], LB, {"spec.allocateLoadBalancerNodePorts": "false"}, False, "a string"),
    looser(R["alnp"], SVC, {"spec.allocateLoadBalancerNodePorts": True}, "on ClusterIP"),
    same(R["lbc"], LB, {"spec.loadBalancerClass": "example.com/lb"}, True),
    looser(R["lbc"], LB, {"spec.loadBalancerClass": "not valid!"}),
    same(R["td"], SVC, {"spec.trafficDistribution": "PreferClose"}, True),
    same(R["td"], SVC, {"spec.trafficDistribution": "PreferSameNode"}, True, "PreferSameNode"),
    same(R["td"], SVC, {"spec.trafficDistribution": "Bogus"}, False, "unknown"),
    same(R["sel"], SVC, {"spec.selector": {"app": "web"}}, True),
    looser(R["sel"], SVC, {"spec.selector": {"bad key!": "x"}}),
    same(R["xname"], XN, {"spec.externalName": "db.example.com."}, True),
    same(R["xname"], XN, {"spec.externalName": DELETE}, False, "missing"),
    looser(R["xname"], XN, {"spec.externalName": "Not_A_DNS_Name"}),
    same(R["ingip"], LB, {"status.loadBalancer.ingress.0.ip": "2001:db8::10"}, True),
    same(R["ingip"], LB, {"status.loadBalancer.ingress.0.ip": "not-an-ip"}, False, "not an IP"),
    stricter(R["ingip"], LB, {"status.loadBalancer.ingress.0.ip": "010.0.2.10"}, "leading zero"),
    looser(R["ingip"], SVC, {"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}}, "on ClusterIP"),
    same(R["ingmode"], LB, {"status.loadBalancer.ingress.0.ipMode": "Proxy"}, True),
    same(R["ingmode"], LB, {"status.loadBalancer.ingress.0.ipMode": "Tunnel"}, False),
    looser(R["ingmode"], LB, {"status.loadBalancer.ingress": [{"hostname": "lb.example.com", "ipMode": "VIP"}]}, "without ip"),
    same(R["inghost"], LB, {"status.loadBalancer.ingress": [{"hostname": "lb.example.com"}]}, True),
    looser(R["inghost"], LB, {"status.loadBalancer.ingress": [{"hostname": "10.1.2.3"}]}, "an IP"),
    # --- EndpointSlice
    same(R["s.name"], SLICE, {"metadata.name": "web-abc.1"}, True),
    same(R["s.name"], SLICE, {"metadata.name": "Web"}, False),
    same(R["s.ns"], SLICE, {"metadata.namespace": "team-a"}, True),
    same(R["s.ns"], SLICE, {"metadata.namespace": "Team_A"}, False),
    same(R["s.label"], SLICE, {("metadata", "labels", LABEL): "web"}, True),
    stricter(R["s.label"], SLICE, {"metadata.labels": DELETE}, "missing"),
    stricter(R["s.label"], SLICE, {("metadata", "labels", LABEL): "1web"}, "not a Service name"),
    same(R["s.at"], SLICE, {"addressType": "IPv6", "endpoints.0.addresses": ["fd00:10:244::5"]}, True),
    same(R["s.at"], SLICE, {"addressType": "IPv5"}, False),
    same(R["s.at"], SLICE, {"addressType": DELETE}, False, "missing"),
    same(R["s.eps"], SLICE, {"endpoints": n_items(1000, lambda i: {"addresses": [f"10.244.{i // 250}.{i % 250 + 1}"]})}, True, "1000"),
    same(R["s.eps"], SLICE, {"endpoints": n_items(1001, lambda i: {"addresses": [f"10.244.{i // 250}.{i % 250 + 1}"]})}, False, "1001"),
    same(R["s.naddr"], SLICE, {"endpoints.0.addresses": []}, False, "none"),
    same(R["s.naddr"], SLICE, {"endpoints.0.addresses": n_items(101, lambda i: f"10.244.1.{i + 1}")}, False, "101"),
    same(R["s.ip"], SLICE, {"endpoints.0.addresses": ["10.244.1.6"]}, True),
    same(R["s.ip"], SLICE, {"endpoints.0.addresses": ["127.0.0.1"]}, False, "loopback"),
    same(R["s.ip"], SLICE, {"endpoints.0.addresses": ["fd00::5"]}, False, "other family"),
    stricter(R["s.ip"], SLICE, {"endpoints.0.addresses": ["010.244.1.6"]}, "leading zero"),
    stricter(R["s.ip"], SLICE, {"endpoints.0.addresses": ["::ffff:10.244.1.6"]}, "IPv4-mapped"),
    same(R["s.fqdn"], SLICE, {"addressType": "FQDN", "endpoints.0.addresses": ["db.example.com"]}, True),
    looser(R["s.fqdn"], SLICE, {"addressType": "FQDN", "endpoints.0.addresses": ["not a fqdn!!"]}),
    same(R["s.cond"], SLICE, {"endpoints.0.conditions": {"ready": False, "serving": True, "terminating": True}}, True),
    same(R["s.cond"], SLICE, {"endpoints.0.conditions": {"ready": "maybe"}}, False, "a string"),
    same(R["s.host"], SLICE, {"endpoints.0.hostname": "pod-1"}, True),
    same(R["s.host"], SLICE, {"endpoints.0.hostname": "Pod_1"}, False),
    same(R["s.node"], SLICE, {"endpoints.0.nodeName": "node-a.example"}, True),
    same(R["s.node"], SLICE, {"endpoints.0.nodeName": "Node A"}, False),
    same(R["s.zone"], SLICE, {"endpoints.0.zone": "any text, even this"}, True),
    stricter(R["s.zone"], SLICE, {"endpoints.0.zone": "z" * 254}, "254 characters"),
    same(R["s.fz"], SLICE, {"endpoints.0.hints": {"forZones": [{"name": "zone-a"}]}}, True),
    same(R["s.fz"], SLICE, {"endpoints.0.hints": {"forZones": [{}]}}, False, "no name"),
    same(R["s.fz"], SLICE, {"endpoints.0.hints": {"forZones": n_items(9, lambda i: {"name": f"z{i}"})}}, False, "nine"),
    same(R["s.fz"], SLICE, {"endpoints.0.hints": {"forZones": [{"name": "zone-a"}, {"name": "zone-a"}]}}, False,
         "duplicate"),
    same(R["s.fn"], SLICE, {"endpoints.0.hints": {"forNodes": [{"name": "node-a"}]}}, True),
    same(R["s.fn"], SLICE, {"endpoints.0.hints": {"forNodes": n_items(9, lambda i: {"name": f"n{i}"})}}, False, "nine"),
    same(R["s.fn"], SLICE, {"endpoints.0.hints": {"forNodes": [{"name": "Node_A"}]}}, False, "not a DNS subdomain"),
    same(R["s.ports"], SLICE, {"ports": n_items(101, lambda i: {"name": f"p{i}", "port": 1000 + i})}, True, "101"),
    # 20001 ports are refused too: test_slice_port_limit_is_kubernetes_max_ports (a file that big takes seconds)
    same(R["s.pname"], SLICE, {"ports.0.name": ""}, True, "empty"),
    same(R["s.pname"], SLICE, {"ports": [{"port": 80}, {"name": "", "port": 81}]}, False, "empty twice"),
    same(R["s.pname"], SLICE, {"ports.0.name": "HTTP"}, False, "not a label"),
    same(R["s.port"], SLICE, {"ports.0.port": 65535}, True),
    stricter(R["s.port"], SLICE, {"ports.0.port": DELETE}, "missing"),
    stricter(R["s.port"], SLICE, {"ports.0.port": 0}, "zero"),
    same(R["s.proto"], SLICE, {"ports.0.protocol": "UDP"}, True),
    same(R["s.proto"], SLICE, {"ports.0.protocol": "ICMP"}, False),
    same(R["s.appp"], SLICE, {"ports.0.appProtocol": "http"}, True),
    looser(R["s.appp"], SLICE, {"ports.0.appProtocol": "not valid!"}),
    # --- Endpoints
    same(R["e.name"], EPS, {"metadata.name": "web-2"}, True),
    same(R["e.name"], EPS, {"metadata.name": "Web"}, False),
    stricter(R["e.name"], EPS, {"metadata.name": "web.v2"}, "a DNS subdomain"),
    same(R["e.subsets"], EPS, {"subsets.0.notReadyAddresses": [{"ip": "10.244.1.6"}]}, True),
    looser(R["e.subsets"], EPS, {"subsets": [{"ports": [{"port": 80}]}]}, "no addresses"),
    same(R["e.ip"], EPS, {"subsets.0.addresses.0.ip": "fd00::5"}, True),
    same(R["e.ip"], EPS, {"subsets.0.addresses.0.ip": "127.0.0.1"}, False, "loopback"),
    same(R["e.ip"], EPS, {"subsets.0.notReadyAddresses": [{"ip": "0.0.0.0"}]}, False, "unspecified"),
    stricter(R["e.ip"], EPS, {"subsets.0.addresses.0.ip": "010.244.1.5"}, "leading zero"),
    same(R["e.host"], EPS, {"subsets.0.addresses.0.hostname": "pod-1", "subsets.0.addresses.0.nodeName": "node-a.example"}, True),
    same(R["e.host"], EPS, {"subsets.0.addresses.0.hostname": "Pod_1"}, False, "hostname"),
    same(R["e.host"], EPS, {"subsets.0.addresses.0.nodeName": "Node A"}, False, "nodeName"),
    same(R["e.pname"], EPS, {"subsets.0.ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}, True),
    same(R["e.pname"], EPS, {"subsets.0.ports.0.name": "HTTP"}, False, "not a label"),
    stricter(R["e.pname"], EPS, {"subsets.0.ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}, "twice"),
    looser(R["e.pname"], EPS, {"subsets.0.ports": [{"name": "a", "port": 80}, {"port": 81}]}, "one unnamed of two"),
    same(R["e.port"], EPS, {"subsets.0.ports.0.protocol": "SCTP"}, True),
    same(R["e.port"], EPS, {"subsets.0.ports.0.port": 0}, False, "zero"),
    same(R["e.port"], EPS, {"subsets.0.ports.0.protocol": "ICMP"}, False, "protocol"),
    same(R["e.appp"], EPS, {"subsets.0.ports.0.appProtocol": "http"}, True),
    looser(R["e.appp"], EPS, {"subsets.0.ports.0.appProtocol": "not valid!"}),
    # --- unknown fields
    same(R["unk"], SVC, {"spec.clusterIp": "10.96.0.10"}, False, "misspelled"),
    same(R["unk"], SVC, {"spec.ports.0.targetPrt": 8080}, False, "misspelled in a port"),
    same(R["unk"], SVC, {"metadata.uid": "3b9a2d4e", "metadata.creationTimestamp": None, "metadata.generation": 2,
                         "metadata.managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                                     "fieldsV1": {"f:spec": {}}}],
                         "spec.publishNotReadyAddresses": True, "spec.loadBalancerClass": "x",
                         "status": {"loadBalancer": {}, "conditions": []}}, True, "every field of the type"),
    same(R["s.unk"], SLICE, {"endpoints.0.condition": {"ready": True}}, False, "misspelled"),
    same(R["s.unk"], SLICE, {"endpoints.0.targetRef": {"kind": "Pod", "name": "p", "uid": "u"},
                             "endpoints.0.deprecatedTopology": {"a": "b"}}, True, "every field of the type"),
    same(R["e.unk"], EPS, {"subsets.0.adresses": []}, False, "misspelled"),
    same(R["e.unk"], EPS, {"subsets.0.addresses.0.targetRef": {"kind": "Pod", "name": "p"},
                           "subsets.0.notReadyAddresses": [{"ip": "10.244.1.6", "nodeName": "n"}]}, True,
         "every field of the type"),
    same(R["c.unk"], CIDR, {"spec.cidr": ["10.100.0.0/16"]}, False, "misspelled"),
    same(R["c.unk"], CIDR, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True, "every field of the type"),
    # --- ServiceCIDR
    same(R["c.name"], CIDR, {"metadata.name": "extra.cidrs"}, True),
    same(R["c.name"], CIDR, {"metadata.name": "Extra"}, False),
    same(R["c.cidrs"], CIDR, {"spec.cidrs": ["10.100.0.0/16", "fd00:100::/108"]}, True),
    same(R["c.cidrs"], CIDR, {"spec.cidrs": ["10.100.0.1/16"]}, False, "not canonical"),
    same(R["c.cidrs"], CIDR, {"spec.cidrs": []}, False, "none"),
    same(R["c.cidrs"], CIDR, {"spec.cidrs": ["10.100.0.0/16", "10.101.0.0/16"]}, False, "one family twice"),
    same(R["c.cidrs"], CIDR, {"spec.cidrs": ["10.100.0.0/16", "fd00::/108", "10.101.0.0/16"]}, False, "three"),
    # --- YAML reading
    yaml_case(R["y.bool"], "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, labels: {kubernetes.io/service-name: a}}\n"
              "addressType: IPv4\nendpoints:\n- addresses: [10.244.1.5]\n  conditions: {ready: yes, serving: Off, terminating: N}\n",
              True, True, "plain"),
    yaml_case(R["y.bool"], "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, labels: {kubernetes.io/service-name: a}}\n"
              "addressType: IPv4\nendpoints:\n- addresses: [10.244.1.5]\n  conditions: {ready: \"yes\"}\n",
              False, False, "quoted"),
    yaml_case(R["y.boolstr"], "apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: {enabled: yes}}\n"
              "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n", True, False, "label value"),
    yaml_case(R["y.boolstr"], "apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: {enabled: \"yes\"}}\n"
              "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n", True, True, "quoted"),
    yaml_case(R["y.flow"], "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n"
              "spec: {clusterIP: 10.96.0.10, externalIPs: [fd00:10:180::1], ports: [{port: 80}]}\n", True, True, "plain"),
    yaml_case(R["y.flow"], "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n"
              "spec: {clusterIP: 10.96.0.10, externalIPs: [::1], ports: [{port: 80}]}\n", False, False, "leading colon"),
    yaml_case(R["y.zero"], "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
              True, True, "plain"),
    yaml_case(R["y.zero"], "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 010}]}\n",
              False, True, "stricter"),
]


def _parts(path) -> tuple:
    if isinstance(path, tuple):
        return path
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


def build(base: dict, patch: dict) -> dict:
    data = copy.deepcopy(base)
    for path, value in patch.items():
        *parents, last = _parts(path)
        node = data
        for p in parents:
            node = node.setdefault(p, {}) if isinstance(node, dict) else node[p]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return data


def nftrec_accepts(tmp_path: Path, case: Case) -> tuple[bool, list]:
    text = case.text if case.text is not None else json.dumps(build(case.base, case.patch))
    (tmp_path / "m.yaml").write_text(text)
    checked = check(load_manifests(tmp_path))
    return checked.ok, [p for p in checked.problems if p.is_error]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_row(tmp_path, case):
    ok, errors = nftrec_accepts(tmp_path, case)
    assert ok == case.nftrec, errors or "accepted"


def test_slice_port_limit_is_kubernetes_max_ports():
    from reconciler.intake.schemas import load_schema
    assert load_schema("EndpointSlice")["properties"]["ports"]["maxItems"] == 20000  # validatePorts' maxPorts


def test_the_bases_are_valid(tmp_path):
    for base in (SVC, LB, NP, XN, SLICE, EPS, CIDR):
        ok, errors = nftrec_accepts(tmp_path, Case(("", ""), True, True, base))
        assert ok, errors


# --- the doc's table against the cases ------------------------------------------------------

_ROW = re.compile(r"^\|\s*(Service|EndpointSlice|Endpoints|ServiceCIDR|YAML)\s*\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def doc_rows() -> dict[tuple[str, str], str]:
    """(Kind, field) -> the verdict cell (the last-but-one column; the last names tests)."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            cells = [c.strip() for c in m.group(3).split("|")]
            rows[(m.group(1), m.group(2))] = cells[-2].lower()
    return rows


def test_every_doc_row_has_cases_and_every_case_a_row():
    rows = doc_rows()
    assert len(rows) > 50
    covered = {c.row for c in CASES}
    assert not set(rows) - covered, f"rows without a case: {sorted(set(rows) - covered)}"
    assert not covered - set(rows), f"cases without a row: {sorted(covered - set(rows))}"


@pytest.mark.parametrize("row", sorted({c.row for c in CASES}), ids=lambda r: f"{r[0]}:{r[1]}")
def test_doc_verdicts_match_the_cases(row):
    verdict = doc_rows().get(row, "")
    words = {w for w in ("same", "stricter", "looser") if re.search(rf"\b{w}\b", verdict)}
    found = set()
    for c in CASES:
        if c.row == row:
            found.add("same" if c.nftrec == c.k8s else "stricter" if c.k8s else "looser")
    # every way the cases differ from Kubernetes is named in the doc, and the doc names
    # nothing the cases do not show
    assert found - {"same"} <= words and words - {"same"} <= found, (verdict, found)
