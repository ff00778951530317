"""Hostile strings built straight into model objects (bypassing schema validation) must
end as a clean NftSyntaxError or as a script that the real nft parser reads without any
injected statement: loading it in a throwaway namespace creates nftrec's tables only."""

from __future__ import annotations


import pytest

from nsutil import for_this_nft, nft_scratch
from reconciler.compile.services import compile_ruleset
from reconciler.intake.model import (
    Endpoint, EndpointPort, EndpointSlice, Inventory, LoadBalancerIngress, NodeConfig, Service,
    ServiceCIDR, ServicePort,
)
from reconciler.compile.render import render_script
from reconciler.compile.ruleset import NftSyntaxError

pytestmark = pytest.mark.kernel

PAYLOADS = [
    'x"; add table ip pwn; #',
    "x; add table ip pwn",
    "x\nadd table ip pwn",
    "x\radd table ip pwn",
    "x } ; add table ip pwn ; {",
    "x # add table ip pwn",
    "x' add table ip pwn",
    "x$pwn",
    "x\\",
    "x\x00y",
    "ünïcode",
    "a" * 300,
    "",
    "-leading-dash",
    "x.y",
]
IP_PAYLOADS = [
    "1.2.3.4; add table ip pwn",
    "1.2.3.4\nadd table ip pwn",
    "fe80::1%eth0;add",
    "1.2.3.4 }",
    "{ 1.2.3.4 }",
    "1.2.3.4/32",
    " 1.2.3.4",
    "01.2.3.4",
]


def _nft_load(script: str) -> str:
    """Load `script` for real inside a fresh user+net namespace; return the ruleset."""
    return nft_scratch(script, check_only=False)


def _assert_safe(inventory: Inventory, config: NodeConfig) -> None:
    try:
        script = render_script(compile_ruleset(inventory, for_this_nft(config)))
    except NftSyntaxError:
        return  # refused cleanly
    for line in script.splitlines():
        assert line == "" or line.split(" ", 1)[0] in ("add", "delete"), line
        assert "pwn" not in line.split(' comment "')[0], line
    listing = _nft_load(script)
    tables = [l for l in listing.splitlines() if l.startswith("table ")]
    assert sorted(tables) == [f"table ip {config.table_name} {{", f"table ip6 {config.table_name} {{"], listing


CFG = NodeConfig("node", node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8",))


def _svc(ns="ns", name="svc", port_name="p", **kw):
    base = dict(type="LoadBalancer", cluster_ips=("172.30.0.1",),
                ports=(ServicePort(port_name, "TCP", 80, 80, 30080),),
                load_balancer_ingress=(LoadBalancerIngress("5.6.7.8"),),
                load_balancer_source_ranges=("203.0.113.0/25",), session_affinity="ClientIP")
    base.update(kw)
    return Service(ns, name, **base)


def _slice(ns="ns", name="svc", port_name="p", ip="10.1.0.1", node="node"):
    return EndpointSlice(ns, "s", name, "IPv4", (Endpoint((ip,), node_name=node),),
                         (EndpointPort(port_name, "TCP", 8080),))


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", ["namespace", "name", "port_name", "node"])
def test_hostile_names(field, payload):
    names = dict(ns="ns", name="svc", port_name="p")
    node = "node"
    if field == "node":
        node = payload
    else:
        names[field if field != "namespace" else "ns"] = payload
    inv = Inventory((_svc(**names),), (_slice(**names, node=node),))
    _assert_safe(inv, CFG)


@pytest.mark.parametrize("payload", IP_PAYLOADS)
@pytest.mark.parametrize("field", ["cluster_ip", "external_ip", "lb_ip", "source_range", "endpoint", "service_cidr"])
def test_hostile_ips(field, payload):
    svc_kw: dict = {}
    ep_ip = "10.1.0.1"
    cidrs = ()
    if field == "cluster_ip":
        svc_kw["cluster_ips"] = (payload,)
    elif field == "external_ip":
        svc_kw["external_ips"] = (payload,)
    elif field == "lb_ip":
        svc_kw["load_balancer_ingress"] = (LoadBalancerIngress(payload),)
    elif field == "source_range":
        svc_kw["load_balancer_source_ranges"] = (payload,)
    elif field == "endpoint":
        ep_ip = payload
    else:
        cidrs = (ServiceCIDR("x", (payload,)),)
    inv = Inventory((_svc(**svc_kw),), (_slice(ip=ep_ip),), cidrs)
    _assert_safe(inv, CFG)


@pytest.mark.parametrize("payload", PAYLOADS[:8] + ["nftrec-long-" + "x" * 300])
def test_hostile_table_name(payload):
    _assert_safe(Inventory((_svc(),), (_slice(),)), NodeConfig("node", table_name=payload))


@pytest.mark.parametrize("field,value", [
    ("cluster_cidrs", ("10.0.0.0/8; add table ip pwn",)),
    ("service_cidrs", ("172.30.0.0/16 } drop ; add table ip pwn ; {",)),
    ("node_ips", ("192.168.0.2\nadd table ip pwn",)),
    ("node_port_addresses", ("primary; add table ip pwn",)),
    ("masquerade_bit", 40),
    ("zone", 'z"; add table ip pwn'),
])
def test_hostile_config(field, value):
    cfg = NodeConfig("node", **{field: value})
    _assert_safe(Inventory((_svc(),), (_slice(),)), cfg)


def test_very_long_valid_names_load():
    ns, name, port = "n" * 63, "s" * 63, "p" * 15
    inv = Inventory((_svc(ns, name, port),), (_slice(ns, name, port),))
    script = render_script(compile_ruleset(inv, CFG))
    assert max(len(w) for w in script.split()) <= 256 + 2
    _assert_safe(inv, CFG)


def test_comment_with_quote_is_refused():
    inv = Inventory((Service('n"s', "svc", "ClusterIP", ("172.30.0.1",), ports=(ServicePort("p", "TCP", 80, 80),)),))
    with pytest.raises(NftSyntaxError):
        compile_ruleset(inv, CFG)
