"""kube-proxy's naming (reference §5): every worked example of the reference table."""

import pytest

from reconciler.compile import naming

NS63 = "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx"
SVC63 = "very-long-service-name-why-would-you-even-do-this-i-mean-really"
PORT63 = "port-443-providing-the-hypertext-transmission-protocol-with-tls"
LONG = f"{NS63}/{SVC63}/sctp/{PORT63}"


def test_long_inputs_are_63_chars():
    assert len(NS63) == len(SVC63) == len(PORT63) == 63


@pytest.mark.parametrize("ns,svc,port,proto,expected", [
    ("ns1", "svc1", "p80", "tcp", "ULMVA6XW-ns1/svc1/tcp/p80"),
    ("ns2", "svc2", "p80", "tcp", "42NFTM6N-ns2/svc2/tcp/p80"),
    ("ns3", "svc3", "p80", "tcp", "4AT6LBPK-ns3/svc3/tcp/p80"),
    ("ns4", "svc4", "p80", "tcp", "LAUZTJTB-ns4/svc4/tcp/p80"),
    ("ns5", "svc5", "p80", "tcp", "HVFWP5L3-ns5/svc5/tcp/p80"),
    ("ns2", "svc2", "p8080", "tcp", "MHHHYRWA-ns2/svc2/tcp/p8080"),
    ("testing", "service", "http", "tcp", "P4ZYZVCF-testing/service/tcp/http"),
    ("testing", "service", "https", "TCP", "LZBRENCP-testing/service/tcp/https"),
    (NS63, SVC63, PORT63, "SCTP", "KR6NACJP-" + LONG),
])
def test_service_port_chain_base(ns, svc, port, proto, expected):
    assert naming.service_port_chain_base(ns, svc, port, proto) == expected


def test_long_service_base_is_205_chars_not_truncated():
    assert len(naming.service_port_chain_base(NS63, SVC63, PORT63, "sctp")) == 205


@pytest.mark.parametrize("ns,svc,port,endpoint,expected", [
    ("ns1", "svc1", "p80", "10.180.0.1:80", "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"),
    ("ns2", "svc2", "p80", "10.180.0.2:80", "SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80"),
    ("ns3", "svc3", "p80", "10.180.0.3:80", "UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80"),
    ("ns4", "svc4", "p80", "10.180.0.4:80", "UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80"),
    ("ns4", "svc4", "p80", "10.180.0.5:80", "5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80"),
    ("ns5", "svc5", "p80", "10.180.0.3:80", "GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"),
    ("testing", "service", "http", "10.180.0.1:80", "JO2XBXZR-testing/service/tcp/http__10.180.0.1/80"),
    ("testing", "service", "http", "10.180.0.2:80", "5S6H3H22-testing/service/tcp/http__10.180.0.2/80"),
    ("testing", "service", "http", "[fd80:abcd:12::a1b2:c3d4:e5f6:9999]:80",
     "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"),
    ("ns1", "svc1", "p80", "[fd00:10:180::1]:80", "ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80"),
    ("ns1", "svc1", "p80", "[fd00:10:180::2:1]:80", "2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80"),
])
def test_endpoint_chain_base(ns, svc, port, endpoint, expected):
    assert naming.endpoint_chain_base(ns, svc, port, "tcp", endpoint) == expected


def test_long_endpoint_exactly_240_not_truncated():
    got = naming.endpoint_chain_base(NS63, SVC63, PORT63, "sctp", "[1234:5678:9abc:def0::abc:1234]:443")
    assert got == "5YS7AFEA-" + LONG + "__1234.5678.9abc.def0..abc.1234/443"
    assert len(got) == 240


@pytest.mark.parametrize("ip,prefix", [
    ("1234:5678:9abc:def0::abcd:1234:5678", "CI6C53Q3"),
    ("1234:5678:9abc:def0::abcd:1234:8765", "2FLXFK6X"),
])
def test_long_endpoint_truncated(ip, prefix):
    got = naming.endpoint_chain_base(NS63, SVC63, PORT63, "sctp", f"[{ip}]:443")
    assert got == prefix + "-" + LONG + "__1234.5678.9abc.def0..abcd.1234..."
    assert len(got) == 240
    assert got.endswith("with-tls__1234.5678.9abc.def0..abcd.1234...")


def test_hash_is_over_untruncated_name():
    a = naming.endpoint_chain_base(NS63, SVC63, PORT63, "sctp", "[1234:5678:9abc:def0::abcd:1234:5678]:443")
    b = naming.endpoint_chain_base(NS63, SVC63, PORT63, "sctp", "[1234:5678:9abc:def0::abcd:1234:8765]:443")
    assert a[9:] == b[9:] and a[:8] != b[:8]


def test_prefixes_and_full_names():
    base = naming.service_port_chain_base("ns5", "svc5", "p80", "tcp")
    ep = naming.endpoint_chain_base("ns5", "svc5", "p80", "tcp", "10.180.0.3:80")
    assert naming.service_chain(base) == "service-HVFWP5L3-ns5/svc5/tcp/p80"
    assert naming.local_chain(base) == "local-HVFWP5L3-ns5/svc5/tcp/p80"
    assert naming.external_chain(base) == "external-HVFWP5L3-ns5/svc5/tcp/p80"
    assert naming.firewall_chain(base) == "firewall-HVFWP5L3-ns5/svc5/tcp/p80"
    assert naming.endpoint_chain(ep) == "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
    assert naming.affinity_set(ep) == "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"


def test_unnamed_port_has_trailing_slash():
    assert naming.service_port_chain_base("ns", "svc", "", "udp").endswith("-ns/svc/udp/")


def test_service_port_name():
    assert naming.service_port_name("ns2", "svc2", "p80") == "ns2/svc2:p80"
    assert naming.service_port_name("ns2", "svc2", "") == "ns2/svc2"


@pytest.mark.parametrize("given,want", [
    ("kube-system/kube-dns:dns", "kube-system/kube-dns:dns"),
    ("a" * 128, "a" * 128),
    ("a" * 129, "a" * 128),
    ("loft-acme-platform-services-team-dev-v-shared-workloads-ns-001/my-api-svc-x-my-api-namespace-x-acme-shared-vcluster--a1b2c3d4e:http",
     "loft-acme-platform-services-team-dev-v-shared-workloads-ns-001/my-api-svc-x-my-api-namespace-x-acme-shared-vcluster--a1b2c3d4e:h"),
])
def test_truncate_comment(given, want):
    assert naming.truncate_comment(given) == want
    assert len(naming.truncate_comment(given).encode()) <= 128


@pytest.mark.parametrize("ep,host,port", [
    ("10.0.0.1:80", "10.0.0.1", "80"), ("[fd00::1]:8080", "fd00::1", "8080")])
def test_split_join_host_port(ep, host, port):
    assert naming.split_host_port(ep) == (host, port)
    assert naming.join_host_port(host, port) == ep
