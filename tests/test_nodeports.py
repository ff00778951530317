"""nodePortAddresses as kube-proxy reads it (compile/nodeports.py): a pure function over
the node's (ifname, address) pairs; then compile and the incremental step on top of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.compile.nodeports import NodePortAddressesError, select_nodeport_ips
from reconciler.compile.ruleset import element_id
from reconciler.compile.services import compile_ruleset
from reconciler.compile.skeleton import family_context
from reconciler.intake.model import Inventory, LoadBalancerIngress, NodeConfig, Service, ServicePort

# a node with a WAN link, a LAN with a secondary address, loopback, link-local, a
# point-to-point tunnel, and an address on lo that is not loopback (an anycast VIP)
ADDRS = (
    ("lo", "127.0.0.1"), ("lo", "::1"), ("lo", "192.0.2.250"),
    ("wan0", "203.0.113.7"), ("wan0", "2001:db8:1::7"), ("wan0", "fe80::1"),
    ("lan0", "192.168.10.1"), ("lan0", "192.168.10.2"), ("lan0", "fd00:10::1"),
    ("wg0", "10.99.0.1"),
    ("lan1", "192.168.10.2"),  # the same address twice: one element
)


def sel(entries, family="ip", primary=("203.0.113.7", "2001:db8:1::7"), addrs=ADDRS):
    return select_nodeport_ips(entries, primary, addrs, family)


def test_cidrs_select_every_interface_address_inside_them_deduplicated():
    s = sel(["192.168.0.0/16", "10.0.0.0/8"])
    assert not s.match_all
    assert s.ips == ("10.99.0.1", "192.168.10.1", "192.168.10.2")


def test_address_on_lo_is_selected_when_not_loopback():
    assert sel(["192.0.2.0/24"]).ips == ("192.0.2.250",)


def test_loopback_is_skipped_and_reported():
    s = sel(["127.0.0.0/8", "192.168.10.1/32"])
    assert s.ips == ("192.168.10.1",) and s.loopback == ("127.0.0.1",)
    s6 = sel(["::1/128", "fd00:10::/64"], family="ip6")
    assert s6.ips == ("fd00:10::1",) and s6.loopback == ("::1",)


def test_family_split_no_cidr_of_a_family_matches_all_of_it():
    # IPv4 CIDRs only: the IPv6 side falls back to ::/0 (kube-proxy's NewNodePortAddresses)
    assert sel(["192.168.0.0/16"], family="ip6").match_all
    assert not sel(["192.168.0.0/16"], family="ip").match_all
    s6 = sel(["fe80::/10", "192.168.0.0/16"], family="ip6")
    assert not s6.match_all and s6.ips == ("fe80::1",)  # link-local counts, as in GetNodeIPs


def test_zero_cidr_matches_all_and_ignores_the_rest():
    assert sel(["192.168.0.0/16", "0.0.0.0/0"]).match_all
    assert sel(["::/0"], family="ip6").match_all
    assert sel(["::/0"], family="ip").match_all  # no IPv4 CIDR: match all too


def test_primary_is_the_node_ip_as_a_host_cidr_and_must_be_on_an_interface():
    s = sel(["primary"])
    assert not s.match_all and s.ips == ("203.0.113.7",) and s.cidrs == ("203.0.113.7/32",)
    assert sel(["primary"], family="ip6").ips == ("2001:db8:1::7",)
    # the primary IP changed (DHCP) but the old one is still in nodeIPs: nothing matches
    gone = tuple(a for a in ADDRS if a[1] != "203.0.113.7")
    assert sel(["primary"], addrs=gone).ips == ()
    # unset / empty means primary (kube-proxy's nftables default)
    assert sel([]) == sel(["primary"])


def test_primary_without_a_node_ip_of_the_family_is_an_empty_set():
    # nftrec's documented deviation: kube-proxy would match all on that family
    s = sel(["primary"], family="ip6", primary=("203.0.113.7",))
    assert not s.match_all and s.ips == ()
    # a loopback node IP is not a primary (kube-proxy: !nodeIP.IsLoopback())
    assert sel(["primary"], primary=("127.0.0.1",)).ips == ()


def test_primary_mixed_with_cidrs_is_refused():
    with pytest.raises(NodePortAddressesError, match="can't use both 'primary' and CIDRs"):
        sel(["primary", "10.0.0.0/8"])


def test_addresses_in_interface_forms_are_parsed_and_junk_ignored():
    addrs = (("eth0", "192.168.10.5/24"), ("eth0", "fe80::5%eth0"), ("x", "not-an-ip"), ("x", ""))
    assert select_nodeport_ips(["192.168.0.0/16"], (), addrs, "ip").ips == ("192.168.10.5",)
    assert select_nodeport_ips(["fe80::/10"], (), addrs, "ip6").ips == ("fe80::5",)


# --- compile on top of it -------------------------------------------------------------------


def cfg(**kw) -> NodeConfig:
    base = dict(node_name="n", node_ips=("203.0.113.7",), node_port_addresses=("192.168.0.0/16",))
    base.update(kw)
    return NodeConfig(**base)


def nodeport_ips(rs, family="ip"):
    s = rs.tables[family].sets.get("nodeport-ips")
    return None if s is None else sorted(k[0] for k in s.elements)


def test_compile_uses_interface_addresses_when_listed_else_node_ips():
    assert nodeport_ips(compile_ruleset(Inventory(), cfg(host_addresses=ADDRS))) == ["192.168.10.1", "192.168.10.2"]
    # render: no interfaces looked at, nodeIPs stand in (none inside the CIDR here)
    assert nodeport_ips(compile_ruleset(Inventory(), cfg())) == []
    assert nodeport_ips(compile_ruleset(Inventory(), cfg(node_ips=("192.168.10.9",)))) == ["192.168.10.9"]
    # the firewall's node IP stays nodeIPs' primary either way
    assert family_context(cfg(host_addresses=ADDRS), "ip").node_ip == "203.0.113.7"


def _lb(name, ranges=()):
    return Service(namespace="default", name=name, type="LoadBalancer", cluster_ips=("10.96.0.1" if name == "a"
                   else "10.96.0.2",), ip_families=("IPv4",),
                   ports=(ServicePort("p", "TCP", 80, 80, 30080 if name == "a" else 30081),),
                   load_balancer_ingress=(LoadBalancerIngress("198.51.100.10" if name == "a" else "198.51.100.11"),),
                   load_balancer_source_ranges=ranges)


def test_address_change_recompiles_only_what_depends_on_node_addresses():
    from reconciler.compile import changed_services, compile_incremental, project
    from reconciler.compile import compile_static
    from reconciler.engine.changes import diff
    from reconciler.kernel.live import canonical

    inv = Inventory(services=(_lb("a", ("203.0.113.0/24",)), _lb("b")))
    c1 = compile_incremental(inv, cfg(host_addresses=ADDRS), None)
    # a secondary address leaves, another one appears: only nodeport-ips changes
    moved = tuple(a for a in ADDRS if a[1] != "192.168.10.1") + (("lan0", "192.168.10.3"),)
    c2 = compile_incremental(inv, replace(c1.config, host_addresses=moved), c1)
    assert c2.recompiled == 0 and changed_services(c1, c2) == set()
    assert c2.ruleset == compile_ruleset(inv, c2.config)
    static = compile_static(c2.config, inv)
    # the partial sync's projection sees the removed element as well as the added one
    changes = diff(project(c2.ruleset, static, []), canonical(project(c1.ruleset, static, [])))
    full = diff(c2.ruleset, canonical(c1.ruleset))
    assert len(changes) == len(full) == 2, (list(changes), list(full))
    assert {(c.action, c.name, c.key) for c in changes} == {(c.action, c.name, c.key) for c in full} == {
        ("remove", "nodeport-ips", ("192.168.10.1",)), ("add", "nodeport-ips", ("192.168.10.3",))}
    # the primary changes (DHCP): the Service whose firewall checks the node IP is recompiled
    c3 = compile_incremental(inv, replace(c2.config, node_ips=("203.0.113.9",)), c2)
    assert c3.recompiled == 1 and changed_services(c2, c3) == {"default/a"}
    assert c3.ruleset == compile_ruleset(inv, c3.config)
    assert element_id("ip", "nodeport-ips", ("192.168.10.3",)) not in c3.ruleset.owners


# --- the watch daemon's side -------------------------------------------------------------------


def test_node_address_view_changes_only_with_what_the_ruleset_uses():
    from reconciler.compile.nodeports import describe_view_change, node_address_view

    base = cfg(host_addresses=ADDRS)
    view = node_address_view(base)
    outside = replace(base, host_addresses=ADDRS + (("lan0", "172.16.0.1"), ("lan0", "fd00:99::1")))
    assert node_address_view(outside) == view  # outside the CIDRs (IPv6 is match-all): no sync
    inside = replace(base, host_addresses=ADDRS + (("lan2", "192.168.77.1"),))
    assert node_address_view(inside) != view
    assert describe_view_change(view, node_address_view(inside)) == \
        "node addresses changed: nodeport-ips ip +192.168.77.1"
    moved = replace(base, node_ips=("203.0.113.9",))  # DHCP gave the WAN link another address
    assert describe_view_change(view, node_address_view(moved)) == \
        "node addresses changed: primary ip 203.0.113.7 -> 203.0.113.9"
    prim = cfg(node_port_addresses=("primary",), host_addresses=ADDRS)
    dhcp = replace(prim, node_ips=("203.0.113.9",), host_addresses=ADDRS + (("wan0", "203.0.113.9"),))
    assert describe_view_change(node_address_view(prim), node_address_view(dhcp)) == \
        "node addresses changed: nodeport-ips ip +203.0.113.9 -203.0.113.7; primary ip 203.0.113.7 -> 203.0.113.9"


def _nlmsg(kind: int, body: bytes) -> bytes:
    import struct

    raw = struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body
    return raw + b"\0" * (-len(raw) % 4)


def test_netlink_messages_that_matter():
    from reconciler.daemon.addresses import relevant_messages

    newaddr = _nlmsg(20, bytes([2, 24, 0, 0, 5, 0, 0, 0]))  # ifaddrmsg
    deladdr = _nlmsg(21, bytes([10, 64, 0, 0, 5, 0, 0, 0]))
    default_route = _nlmsg(24, bytes([2, 0] + [0] * 10))  # rtmsg: family, dst_len 0
    subnet_route = _nlmsg(24, bytes([2, 24] + [0] * 10))
    newlink = _nlmsg(16, bytes(16))
    assert relevant_messages(newaddr) == 1 and relevant_messages(deladdr) == 1
    assert relevant_messages(default_route) == 1 and relevant_messages(_nlmsg(25, bytes([10, 0] + [0] * 10))) == 1
    assert relevant_messages(subnet_route) == 0 and relevant_messages(newlink) == 0
    assert relevant_messages(newlink + newaddr + subnet_route + deladdr + default_route) == 3
    assert relevant_messages(b"") == 0 and relevant_messages(b"\x03\x00") == 0
    assert relevant_messages(_nlmsg(20, b"")[:12]) == 0  # truncated header


def test_loopback_inside_node_port_addresses_is_logged(caplog):
    from reconciler.engine.desired import _warn_loopback

    with caplog.at_level("WARNING"):
        _warn_loopback(cfg(node_port_addresses=("127.0.0.0/8", "192.168.0.0/16"), host_addresses=ADDRS))
    assert "includes localhost (127.0.0.1) but localhost NodePorts are not supported" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        _warn_loopback(cfg(host_addresses=ADDRS))
    assert "localhost" not in caplog.text
