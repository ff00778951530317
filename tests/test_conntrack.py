"""reconciler.kernel.conntrack: which UDP frontends/endpoints count (pure), and the real
cleanup against a namespace's conntrack table (entries made with the conntrack CLI)."""

from __future__ import annotations

import pytest

from nsutil import in_ns, throwaway_netns
from reconciler.kernel.conntrack import cleanup_udp, stale_udp_targets
from reconciler.intake.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Inventory,
    LoadBalancerIngress,
    NodeConfig,
    Service,
    ServicePort,
)

NODE = "node-a"
CFG = NodeConfig(NODE, node_ips=("192.168.0.2", "2001:db8::2"))
DNS = ServicePort("dns", "UDP", 53, 53, node_port=30053)
DNS_TCP = ServicePort("dns-tcp", "TCP", 53, 53, node_port=30054)


def slice_(name, svc, *eps, family="IPv4", ports=(EndpointPort("dns", "UDP", 53),)):
    return EndpointSlice("kube-system", name, svc, family, tuple(eps), tuple(ports))


def ep(ip, **kw):
    return Endpoint((ip,), node_name=kw.pop("node", NODE), **kw)


def dns_inventory(*endpoints, **svc_kw):
    svc = Service("kube-system", "dns", svc_kw.pop("type", "LoadBalancer"), ("10.96.0.10",),
                  ports=(DNS, DNS_TCP), **svc_kw)
    ports = (EndpointPort("dns", "UDP", 53), EndpointPort("dns-tcp", "TCP", 53))
    return Inventory((svc,), (slice_("dns-1", "dns", *endpoints, ports=ports),))


# --- stale_udp_targets (pure) ----------------------------------------------------------


def test_serving_endpoints_cluster_ip_and_nodeport():
    inv = dns_inventory(
        ep("10.244.0.6"),                                            # ready
        ep("10.244.0.7", ready=False, serving=True, terminating=True),  # serving, terminating
        ep("10.244.0.8", ready=False, serving=False),                # not serving: excluded
        ep("10.244.0.9", node="other-node"),                         # remote: still counts
    )
    fe, np = stale_udp_targets(inv, CFG, "ip")
    want = {"10.244.0.6", "10.244.0.7", "10.244.0.9"}
    assert fe == {("10.96.0.10", 53): want}
    assert np == {30053: want}  # the TCP port's 30054 is not there


def test_lb_vips_external_ips_and_proxy_mode():
    inv = dns_inventory(
        ep("10.244.0.6"),
        external_ips=("192.0.2.10", "2001:db8:e::1"),
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                               LoadBalancerIngress("198.51.100.2", "VIP"),
                               LoadBalancerIngress("198.51.100.3", "Proxy"),  # not ours
                               LoadBalancerIngress("", None)),
    )
    fe, np = stale_udp_targets(inv, CFG, "ip")
    assert set(fe) == {("10.96.0.10", 53), ("198.51.100.1", 53), ("198.51.100.2", 53), ("192.0.2.10", 53)}
    assert all(v == {"10.244.0.6"} for v in fe.values())
    assert np == {30053: {"10.244.0.6"}}


def test_no_serving_endpoints_skips_the_port():
    inv = dns_inventory(ep("10.244.0.8", ready=False, serving=False))
    assert stale_udp_targets(inv, CFG, "ip") == ({}, {})
    inv = Inventory((Service("kube-system", "empty", "NodePort", ("10.96.0.12",), ports=(DNS,)),))
    assert stale_udp_targets(inv, CFG, "ip") == ({}, {})


def test_tcp_and_sctp_ignored():
    svc = Service("kube-system", "web", "NodePort", ("10.96.0.20",),
                  ports=(ServicePort("http", "TCP", 80, 80, 30080), ServicePort("s", "SCTP", 9, 9, 30081)))
    sl = slice_("web-1", "web", ep("10.244.1.1"),
                ports=(EndpointPort("http", "TCP", 80), EndpointPort("s", "SCTP", 9)))
    assert stale_udp_targets(Inventory((svc,), (sl,)), CFG, "ip") == ({}, {})


def test_port_matching_by_name_and_protocol():
    # The UDP port takes only the slice port with its name and protocol.
    svc = Service("kube-system", "two", "ClusterIP", ("10.96.0.30",),
                  ports=(ServicePort("a", "UDP", 1000, 1000), ServicePort("b", "UDP", 2000, 2000)))
    s1 = slice_("two-a", "two", ep("10.244.2.1"), ports=(EndpointPort("a", "UDP", 1000),))
    s2 = slice_("two-b", "two", ep("10.244.2.2"), ports=(EndpointPort("b", "UDP", 2000),))
    fe, np = stale_udp_targets(Inventory((svc,), (s1, s2)), CFG, "ip")
    assert fe == {("10.96.0.30", 1000): {"10.244.2.1"}, ("10.96.0.30", 2000): {"10.244.2.2"}}
    assert np == {}


def test_dual_stack():
    svc = Service("kube-system", "ds", "NodePort", ("10.96.0.40", "fd00:96::40"), ("IPv4", "IPv6"),
                  ports=(DNS,), external_ips=("192.0.2.40", "2001:db8:e::40"))
    v4 = slice_("ds-4", "ds", ep("10.244.3.1"))
    v6 = slice_("ds-6", "ds", ep("fd00:244::31"), ep("fd00:244::32", serving=False, ready=False),
                family="IPv6")
    inv = Inventory((svc,), (v4, v6))
    fe4, np4 = stale_udp_targets(inv, CFG, "ip")
    fe6, np6 = stale_udp_targets(inv, CFG, "ip6")
    assert fe4 == {("10.96.0.40", 53): {"10.244.3.1"}, ("192.0.2.40", 53): {"10.244.3.1"}}
    assert np4 == {30053: {"10.244.3.1"}}
    assert fe6 == {("fd00:96::40", 53): {"fd00:244::31"}, ("2001:db8:e::40", 53): {"fd00:244::31"}}
    assert np6 == {30053: {"fd00:244::31"}}
    # single-stack IPv4 Service: nothing in ip6
    single = Inventory((Service("kube-system", "v4", "ClusterIP", ("10.96.0.41",), ports=(DNS,)),),
                       (slice_("v4-1", "v4", ep("10.244.3.9")),))
    assert stale_udp_targets(single, CFG, "ip6") == ({}, {})


def test_headless_and_external_name_ignored():
    inv = Inventory(
        (Service("kube-system", "hl", "ClusterIP", (), ports=(DNS,)),
         Service("kube-system", "xn", "ExternalName", (), ports=(DNS,))),
        (slice_("hl-1", "hl", ep("10.244.4.1")), slice_("xn-1", "xn", ep("10.244.4.2"))))
    assert stale_udp_targets(inv, CFG, "ip") == ({}, {})


def test_shared_frontend_keeps_union():
    a = Service("kube-system", "a", "ClusterIP", ("10.96.0.50",), ports=(DNS,))
    b = Service("kube-system", "b", "ClusterIP", ("10.96.0.51",), ports=(DNS,), external_ips=("10.96.0.50",))
    inv = Inventory((a, b), (slice_("a-1", "a", ep("10.244.5.1")), slice_("b-1", "b", ep("10.244.5.2"))))
    fe, _ = stale_udp_targets(inv, CFG, "ip")
    assert fe[("10.96.0.50", 53)] == {"10.244.5.1", "10.244.5.2"}


def test_bad_family():
    with pytest.raises(ValueError, match="family"):
        stale_udp_targets(Inventory(), CFG, "inet")


# --- cleanup_udp against a real conntrack table -------------------------------------------


def ct_insert(ns, proto, src, dst, dport, reply_src, sport=1234, zone=None):
    args = ["conntrack", "-I", "-p", proto, "-s", src, "-d", dst, "--sport", str(sport),
            "--dport", str(dport), "-r", reply_src, "-q", src, "--reply-port-src", str(dport),
            "--reply-port-dst", str(sport), "--timeout", "300"]
    if proto == "tcp":
        args += ["--state", "ESTABLISHED"]
    if zone is not None:
        args += ["-w", str(zone)]
    in_ns(ns, *args)


def ct_list(ns) -> set[tuple]:
    """(proto, orig src, orig dst, orig dport, reply src, zone) of every entry, all families."""
    out = set()
    # family by family: conntrack before 1.4.7 lists IPv4 only when none is named
    lines = [line for f in ("ipv4", "ipv6") for line in in_ns(ns, "conntrack", "-L", "-f", f).stdout.splitlines()]
    for line in lines:
        words = line.split()
        kv: dict[str, list[str]] = {}
        for w in words:
            if "=" in w:
                k, v = w.split("=", 1)
                kv.setdefault(k, []).append(v)
        out.add((words[0], kv["src"][0], kv["dst"][0], int(kv["dport"][0]), kv["src"][1],
                 int(kv.get("zone", ["0"])[0])))
    return out


STALE = [  # (proto, orig src, orig dst, orig dport, reply src[, zone])
    ("udp", "10.0.0.1", "10.96.0.10", 53, "10.244.0.5"),        # ClusterIP, endpoint gone
    ("udp", "10.0.0.4", "10.96.0.10", 53, "10.244.0.8"),        # endpoint no longer serving
    ("udp", "10.0.0.5", "10.96.0.10", 53, "10.96.0.10"),        # never DNATed
    ("udp", "10.0.0.1", "192.0.2.10", 53, "10.244.0.5"),        # externalIP
    ("udp", "10.0.0.1", "198.51.100.1", 53, "10.244.0.5"),      # LB VIP
    ("udp", "10.0.0.1", "192.168.0.2", 30053, "10.244.0.5"),    # NodePort
    ("udp", "10.0.0.6", "10.96.0.10", 53, "10.244.0.5", 5),     # in a conntrack zone
    ("udp", "fd00:1::1", "fd00:96::10", 53, "fd00:244::5"),     # IPv6 ClusterIP
    ("udp", "fd00:1::1", "2001:db8::2", 30053, "fd00:244::5"),  # IPv6 NodePort
]
KEPT = [
    ("udp", "10.0.0.2", "10.96.0.10", 53, "10.244.0.6"),        # ready endpoint
    ("udp", "10.0.0.3", "10.96.0.10", 53, "10.244.0.7"),        # serving + terminating
    ("udp", "10.0.0.2", "192.168.0.2", 30053, "10.244.0.6"),    # NodePort, ready endpoint
    ("tcp", "10.0.0.1", "10.96.0.10", 53, "10.244.0.5"),        # TCP is never touched
    ("udp", "10.0.0.1", "10.96.0.11", 53, "10.244.0.9"),        # Service without endpoints
    ("udp", "10.0.0.1", "10.96.0.10", 5353, "10.244.0.5"),      # not a Service port
    ("udp", "10.0.0.1", "198.51.100.3", 53, "10.244.0.5"),      # LB ipMode Proxy
    ("udp", "fd00:1::2", "fd00:96::10", 53, "fd00:244::6"),     # IPv6 ready endpoint
]


def cleanup_inventory() -> Inventory:
    dns = Service("kube-system", "dns", "LoadBalancer", ("10.96.0.10", "fd00:96::10"), ("IPv4", "IPv6"),
                  ports=(DNS,), external_ips=("192.0.2.10",),
                  load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                                         LoadBalancerIngress("198.51.100.3", "Proxy")))
    gone = Service("kube-system", "gone", "ClusterIP", ("10.96.0.11",), ports=(DNS,))
    return Inventory((dns, gone), (
        # 10.244.0.5 / fd00:244::5 have disappeared from the slices
        slice_("dns-4", "dns", ep("10.244.0.6"), ep("10.244.0.7", ready=False, terminating=True),
               ep("10.244.0.8", ready=False, serving=False)),
        slice_("dns-6", "dns", ep("fd00:244::6"), family="IPv6"),
    ))


def populate(ns):
    # A distinct source port each: entries must not clash on their reply tuples.
    for i, e in enumerate(STALE + KEPT):
        proto, src, dst, dport, rsrc, *zone = e
        ct_insert(ns, proto, src, dst, dport, rsrc, sport=20000 + i, zone=zone[0] if zone else None)


def key(e):
    return (*e[:5], e[5] if len(e) > 5 else 0)


@pytest.mark.kernel
def test_cleanup_deletes_exactly_the_stale_entries(netns):
    with throwaway_netns() as other:  # a second namespace with the same entries
        populate(netns)
        populate(other)
        everything = {key(e) for e in STALE + KEPT}
        assert ct_list(netns) == everything

        assert cleanup_udp(netns, cleanup_inventory(), CFG) == len(STALE)

        assert ct_list(netns) == {key(e) for e in KEPT}
        assert ct_list(other) == everything  # only the given namespace was touched
        assert cleanup_udp(netns, cleanup_inventory(), CFG) == 0  # idempotent


@pytest.mark.kernel
def test_cleanup_nothing_to_do_opens_nothing(netns):
    populate(netns)
    assert cleanup_udp(netns, Inventory(), CFG) == 0
    assert len(ct_list(netns)) == len(STALE + KEPT)


@pytest.mark.kernel
def test_cleanup_missing_namespace_is_an_error():
    from reconciler.kernel import NftError
    with pytest.raises(NftError, match="does not exist"):
        cleanup_udp("nftrec-no-such-ns", cleanup_inventory(), CFG)
