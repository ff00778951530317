"""reconciler/kernel/live.py and ruletext.py: the rule normal form, listing parser, and round trips through a
real kernel (inside test namespaces): what we load reads back equal."""

from __future__ import annotations

import pytest

from _nft_samples import CONFIG, rich_inventory
from nsutil import for_this_nft, in_ns, nft_spelling
from reconciler.compile.services import compile_ruleset
from reconciler.engine.changes import diff
from reconciler.kernel.live import fingerprint, parse_duration, parse_table, read_live
from reconciler.kernel.ruletext import canonical_rule
from reconciler.kernel import Libnftables, Transaction
from reconciler.compile.render import render_script
from reconciler.compile.ruleset import BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table

# (what nftrec writes, what nft 1.0.6 lists) — found empirically on kernel 6.18.
REWRITES = [
    ("mark set mark or 0x00004000", "meta mark set meta mark | 0x00004000"),
    ("mark set mark or 0x4000", "meta mark set meta mark | 0x00004000"),
    (
        "mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random",
        "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random",
    ),
    ("ip daddr { 172.30.0.0/16 } drop", "ip daddr 172.30.0.0/16 drop"),
    ("ip daddr { 172.30.0.0/16,10.96.0.0/12 } drop", "ip daddr { 10.96.0.0/12, 172.30.0.0/16 } drop"),
    ("ip saddr != { 203.0.113.0/25 } drop", "ip saddr != 203.0.113.0/25 drop"),
    (
        "ip saddr != { 203.0.113.0/25 , 192.168.0.0/24 , 5.6.7.8 } drop",
        "ip saddr != { 5.6.7.8, 192.168.0.0/24, 203.0.113.0/25 } drop",
    ),
    (  # overlapping and adjacent intervals are merged
        "ip saddr != { 192.168.0.0/24 , 192.168.0.5 , 10.0.0.0/25 , 10.0.0.128/25 , 1.2.3.4/32 } drop",
        "ip saddr != { 1.2.3.4, 10.0.0.0/24, 192.168.0.0/24 } drop",
    ),
    ("ip saddr 10.1.2.3/32 drop", "ip saddr 10.1.2.3 drop"),
    (
        "ip6 saddr != { 2001:db8::/64 , fd00::/8 , 2001:db8:1::5 } drop",
        "ip6 saddr != { 2001:db8::/64, 2001:db8:1::5, fd00::/8 } drop",
    ),
    (
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.1.6 . 8080 }",
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.1.6 . 8080 }",
    ),
    (  # nft's listing drops `addr . port`; nft 0.9.8 cannot read that back, so the normal form keeps it
        "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.1.6 . 8080 }",
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.1.6 . 8080 }",
    ),
    (
        "meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:180::1 . 8080 , 1 : fd00:10:180::2 . 8080 }",
        "meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:180::1 . 8080, 1 : fd00:10:180::2 . 8080 }",
    ),
    (
        "numgen random mod 2 vmap { 0 : goto endpoint-A , 1 : goto endpoint-B }",
        "numgen random mod 2 vmap { 0 : goto endpoint-A, 1 : goto endpoint-B }",
    ),
    ("th dport { 80, 443 , 53} drop", "th dport { 53, 80, 443 } drop"),
    ("meta l4proto tcp tcp dport 80 drop", "tcp dport 80 drop"),
    ("meta mark 0x4000 drop", "meta mark 0x00004000 drop"),
]

UNCHANGED = [
    "ip daddr . meta l4proto . th dport vmap @service-ips",
    "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
    "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
    "update @affinity-X { ip saddr }",
    "update @affinity-X { ip6 saddr }",
    "ip saddr @affinity-X goto endpoint-Y",
    "ct state new jump firewall-check",
    "meta l4proto tcp dnat to 10.244.1.5:8080",
    "meta l4proto tcp dnat to [fd00:10:180::1]:80",
    "ip daddr @cluster-ips reject",
    "fib saddr type local goto service-X",
    "ip6 daddr != ::1 ip6 daddr . meta l4proto . th dport vmap @service-ips",
    "numgen random mod 1 vmap { 0 : goto endpoint-A }",
    "ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 meta mark set meta mark | 0x00004000",
    "jump services",
    "reject",
]


@pytest.mark.parametrize("ours,listed", REWRITES)
def test_canonical_rule_maps_ours_to_nfts_listing(ours, listed):
    assert canonical_rule(ours) == listed
    assert canonical_rule(listed) == listed  # idempotent on nft's output


@pytest.mark.parametrize("body", UNCHANGED)
def test_canonical_rule_keeps_what_nft_keeps(body):
    assert canonical_rule(body) == body


def test_canonical_rule_tells_different_rules_apart():
    assert canonical_rule("ip saddr != { 10.0.0.0/8 } drop") != canonical_rule("ip saddr != { 10.0.0.0/9 } drop")
    assert canonical_rule("numgen random mod 2 vmap { 0 : goto a , 1 : goto b }") != canonical_rule(
        "numgen random mod 2 vmap { 0 : goto b , 1 : goto a }"
    )
    assert canonical_rule("meta l4proto tcp dnat to 10.0.0.1:80") != canonical_rule("meta l4proto udp dnat to 10.0.0.1:80")


def test_parse_duration():
    assert parse_duration("10800s") == 10800
    assert parse_duration("3h") == 10800
    assert parse_duration("1d2h3m4s") == 93784
    with pytest.raises(ValueError):
        parse_duration("3x")


LISTING = """table ip nftrec {
\tcomment "rules for nftrec"
\tset affinity-AAAAAAAA-ns/s/tcp/__10.0.0.1/80 {
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 10800s
\t\telements = { 192.0.2.1 timeout 10800s expires 2h59m58s }
\t}

\tmap no-endpoint-services {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment "vmap to drop or reject packets to services with no endpoints"
\t\telements = { 172.30.0.46 . udp . 53 comment "ns/x:dns, more" : goto reject-chain,
\t\t\t     172.30.0.47 . sctp . 53 comment "ns/y" : drop }
\t}

\tchain filter-prerouting-pre-dnat {
\t\ttype filter hook prerouting priority -110; policy accept;
\t\tct state new jump firewall-check
\t}

\tchain reject-chain {
\t\tcomment "helper for @no-endpoint-services / @no-endpoint-nodeports"
\t\treject
\t}

\tchain firewall-check {
\t\tip saddr != { 5.6.7.8, 192.168.0.0/24 } drop comment "x y"
\t}
}
"""


def test_parse_table():
    t = parse_table(LISTING, "ip")
    assert (t.name, t.comment) == ("nftrec", "rules for nftrec")
    aff = t.sets["affinity-AAAAAAAA-ns/s/tcp/__10.0.0.1/80"]
    assert (aff.type, aff.flags, aff.timeout, aff.elements) == ("ipv4_addr", ("dynamic", "timeout"), 10800, {})
    m = t.sets["no-endpoint-services"]
    assert m.value_type == "verdict" and m.type == "ipv4_addr . inet_proto . inet_service"
    assert m.elements[("172.30.0.46", "udp", "53")] == Element(("172.30.0.46", "udp", "53"), "goto reject-chain", "ns/x:dns, more")
    assert m.elements[("172.30.0.47", "sctp", "53")].value == "drop"
    c = t.chains["filter-prerouting-pre-dnat"]
    assert c.base == BaseHook("filter", "prerouting", -110)
    assert c.rules == (Rule("ct state new jump firewall-check"),)
    assert t.chains["reject-chain"].comment == "helper for @no-endpoint-services / @no-endpoint-nodeports"
    assert t.chains["firewall-check"].rules == (Rule("ip saddr != { 5.6.7.8, 192.168.0.0/24 } drop", "x y"),)


# --- real kernel ---------------------------------------------------------------------------


def load_with_nft(netns: str, ruleset: Ruleset) -> None:
    """Load through the nft binary (an independent path from our libnftables binding)."""
    in_ns(netns, "nft", "-f", "-", input=render_script(ruleset))


def test_compiled_ruleset_round_trips(netns):
    desired = compile_ruleset(rich_inventory(), for_this_nft(CONFIG))
    load_with_nft(netns, desired)
    with Libnftables(netns=netns) as nft:
        live = read_live(nft, "nftrec")
    assert set(live.tables) == {"ip", "ip6"}
    changes = diff(desired, live)
    assert [(c.action, c.kind, c.name, c.key, c.reason) for c in changes] == []
    # the things that must round-trip did, structurally
    ip = live.tables["ip"]
    assert ip.comment == "rules for nftrec"
    nes = ip.sets["no-endpoint-services"]
    assert any(e.comment and e.value == "goto reject-chain" for e in nes.elements.values())
    assert any(e.value == "drop" for e in nes.elements.values())
    if nft_spelling().shared_affinity:
        # the sharded layout's shared affinity set: no set timeout (each `update` carries it)
        aff = ip.sets["affinity-clients"]
        assert aff.flags == ("dynamic", "timeout") and aff.timeout is None and aff.typeof
    else:  # kube-proxy's set per endpoint, with the Service's timeout
        affs = [s for name, s in ip.sets.items() if name.startswith("affinity-")]
        assert affs and all(a.flags == ("dynamic", "timeout") and a.timeout for a in affs)
    assert ip.chains["nat-prerouting"].base == BaseHook("nat", "prerouting", -100)
    assert ip.chains["reject-chain"].comment
    # a real difference is seen
    ip.sets["cluster-ips"].elements.pop(("172.30.0.41",))
    assert [(c.action, c.key, c.owner) for c in diff(desired, live)] == [("add", ("172.30.0.41",), "ns1/one")]


# Every rule shape of the brief, by hand (also the ones the compiler may not emit today).
def shapes_ruleset() -> Ruleset:
    t = Table("ip", "nftrec", comment="rules for nftrec")
    t6 = Table("ip6", "nftrec", comment="rules for nftrec")
    aff = NamedSet("affinity-X", "ipv4_addr", flags=("dynamic", "timeout"), timeout=10800)
    hp = NamedSet("hairpin-connections", "ipv4_addr . ipv4_addr . inet_proto . inet_service", comment="hairpin")
    hp.add(Element(("10.244.1.5", "10.244.1.5", "tcp", "8080")))
    sips = NamedSet("service-ips", "ipv4_addr . inet_proto . inet_service", "verdict", comment="svc")
    sips.add(Element(("172.30.0.1", "tcp", "80"), "goto service-X"))
    sips.add(Element(("172.30.0.2", "udp", "53"), "drop", comment="ns/x:dns"))
    nps = NamedSet("service-nodeports", "inet_proto . inet_service", "verdict")
    nps.add(Element(("tcp", "30080"), "goto service-X", comment="ns/x"))
    cips = NamedSet("cluster-ips", "ipv4_addr")
    cips.add(Element(("172.30.0.1",)))
    for s in (aff, hp, sips, nps, cips):
        t.sets[s.name] = s
    if nft_spelling().index_maps:  # a map to a concatenation: nft 0.9.8 misreads its elements
        dmap = NamedSet("dnat-map", "ipv4_addr . inet_proto . inet_service", "ipv4_addr . inet_service")
        dmap.add(Element(("172.30.0.1", "tcp", "80"), "10.244.1.5 . 8080"))
        t.sets[dmap.name] = dmap
    chains = [
        Chain("nat-prerouting", (Rule("jump services"),), BaseHook("nat", "prerouting", -100)),
        Chain("filter-prerouting-pre-dnat", (Rule("ct state new jump firewall-check"),), BaseHook("filter", "prerouting", -110)),
        Chain("endpoint-A", (Rule("update @affinity-X { ip saddr }"), Rule("meta l4proto tcp dnat to 10.244.1.5:8080"))),
        Chain("endpoint-B", (Rule("meta l4proto udp dnat to 10.244.1.6:8080"),)),
        Chain("endpoint-Y", (Rule("meta l4proto sctp dnat to 10.244.1.7:8080"),)),
        Chain("firewall-check", (Rule("ip saddr != { 203.0.113.0/25 } drop"), Rule("ip saddr != { 203.0.113.0/25 , 192.168.0.0/24 , 5.6.7.8 } drop"))),
        Chain("service-X", (
            Rule("ip saddr @affinity-X goto endpoint-Y"),
            Rule("numgen random mod 2 vmap { 0 : goto endpoint-A , 1 : goto endpoint-B }"),
            Rule("meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.1.6 . 8080 }"),
        )),
        Chain("services", (
            Rule("ip daddr . meta l4proto . th dport vmap @service-ips"),
            Rule("mark set mark or 0x00004000", "masquerade"),
            Rule("mark set mark or 0x4000", "masquerade short"),
            Rule("fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"),
            Rule("fib saddr type local goto service-X", "short-circuit local traffic"),
        )),
        Chain("masquerading", (
            Rule("mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random"),
            Rule("ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"),
        )),
        Chain("cluster-ips-check", (
            Rule("ip daddr @cluster-ips reject", "Reject traffic to invalid ports of ClusterIPs"),
            Rule("ip daddr { 10.96.0.0/16 } drop", "Drop traffic to unallocated ClusterIPs"),
            Rule("ip daddr { 10.96.0.0/16,172.30.0.0/16 } drop", "two"),
        )),
        Chain("reject-chain", (Rule("reject"),), comment="helper for @no-endpoint-services / @no-endpoint-nodeports"),
    ]
    for c in chains:
        t.chains[c.name] = c
    s6 = NamedSet("service-ips", "ipv6_addr . inet_proto . inet_service", "verdict")
    s6.add(Element(("fd00:30::1", "tcp", "80"), "goto svc6", comment="ns/v6"))
    t6.sets[s6.name] = s6
    t6.chains["svc6"] = Chain("svc6", (
        Rule("meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10::1 . 8080 , 1 : fd00:10::2 . 8080 }"),
        Rule("meta l4proto tcp dnat to [fd00:10::3]:80"),
        Rule("ip6 saddr != { 2001:db8::/64 , fd00::/8 } drop"),
    ))
    t6.chains["services"] = Chain("services", (
        Rule("ip6 daddr != ::1 ip6 daddr . meta l4proto . th dport vmap @service-ips"),
        Rule("ip6 daddr { fd00:30::/112 } drop"),
    ))
    return Ruleset({"ip": t, "ip6": t6})


def test_every_rule_shape_round_trips(netns):
    desired = shapes_ruleset()
    load_with_nft(netns, desired)
    with Libnftables(netns=netns) as nft:
        live = read_live(nft, "nftrec")
        changes = diff(desired, live)
        assert [(c.kind, c.name, c.reason) for c in changes] == []
        # Dynamic elements the kernel adds at run time are not a difference.
        nft.run(Transaction().raw("add element ip nftrec affinity-X { 192.0.2.7 timeout 100s }"))
        assert "192.0.2.7" in nft.list_table("ip", "nftrec")
        live2 = read_live(nft, "nftrec")
        assert diff(desired, live2).empty
        assert fingerprint(live2) == fingerprint(live)
        # ... but a changed map value is.
        nft.run(Transaction().raw("delete element ip nftrec service-ips { 172.30.0.2 . udp . 53 }").raw(
            "add element ip nftrec service-ips { 172.30.0.2 . udp . 53 : accept }"))
        live3 = read_live(nft, "nftrec")
        assert fingerprint(live3) != fingerprint(live)
        ch = diff(desired, live3)
        assert [(c.action, c.key, c.reason) for c in ch] == [
            ("change", ("172.30.0.2", "udp", "53"), "value accept → drop")
        ]


def test_read_live_only_our_tables(netns):
    in_ns(netns, "nft", "add", "table", "ip", "someone-else")
    with Libnftables(netns=netns) as nft:
        assert read_live(nft, "nftrec").tables == {}
        load_with_nft(netns, shapes_ruleset())
        assert set(read_live(nft, "nftrec").tables) == {"ip", "ip6"}
        assert ("ip", "someone-else") in nft.list_tables()


def test_parse_table_reads_what_nftrec_never_makes():
    """Flags, a base chain policy and stateful objects: read, not refused (so plan shows
    them and apply removes them) — and the usual table stays a plain Table."""
    from reconciler.kernel.live import LiveTable, chain_policy, table_flags, table_others

    text = """table ip nftrec {
\tflags dormant
\tcomment "rules for nftrec"
\tcounter cnt {
\t\tpackets 0 bytes 0
\t}

\tct helper h {
\t\ttype "ftp" protocol tcp
\t\tl3proto ip
\t}

\tct timeout t {
\t\tprotocol tcp
\t\tl3proto ip
\t\tpolicy = { established : 100 }
\t}

\tchain filter-input {
\t\ttype filter hook input priority 0; policy drop;
\t\tct state new jump x
\t}
}
"""
    t = parse_table(text, "ip")
    assert isinstance(t, LiveTable)
    assert table_flags(t) == ("dormant",)
    assert table_others(t) == {"cnt": "counter", "h": "ct helper", "t": "ct timeout"}
    assert chain_policy(t.chains["filter-input"]) == "drop"
    assert t.chains["filter-input"].base != BaseHook("filter", "input", 0)
    plain = parse_table(LISTING, "ip")
    assert type(plain) is Table


def test_read_live_refuses_unknown_objects_with_a_clear_error():
    from reconciler.kernel import NftError

    class Lister:
        def list_table(self, family, table):
            return "table ip nftrec {\n\tfrobnicator f {\n\t}\n}\n" if family == "ip" else None

    with pytest.raises(NftError, match=r"cannot read table ip nftrec: .*frobnicator.*nftrec cleanup"):
        read_live(Lister(), "nftrec")


def test_fingerprint_sees_flags_and_objects():
    from reconciler.kernel.live import LiveTable

    plain = parse_table(LISTING, "ip")
    weird = LiveTable("ip", plain.name, plain.comment, plain.chains, plain.sets, flags=("dormant",))
    assert fingerprint(Ruleset({"ip": plain})) != fingerprint(Ruleset({"ip": weird}))


def test_element_splitting_keeps_quoted_commas_and_colons():
    """The element list's fast split (no quotes: str.split) and the quote-aware one agree
    with the character scan they replace, quoted commas and ` : ` included."""
    from reconciler.kernel.live import _parse_element, _split_top

    def scan(text):
        out, cur, quoted = [], [], False
        for ch in text:
            if ch == '"':
                quoted = not quoted
            if ch == "," and not quoted:
                out.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
        out.append("".join(cur))
        return [p.strip() for p in out if p.strip()]

    for text in ("10.0.0.1, 10.0.0.2 ,,10.0.0.3", '10.0.0.1 comment "a, b : c", 10.0.0.2',
                 '0 : 10.0.0.1 . 80 comment "x,y", 1 : 10.0.0.2 . 80', 'a "b, c', '"",x,""', " "):
        assert _split_top(text) == scan(text), text
    el = _parse_element('10.0.0.9 . tcp . 80 comment "svc a : b, c" : goto svc-x', True)
    assert (el.key, el.value, el.comment) == (("10.0.0.9", "tcp", "80"), "goto svc-x", "svc a : b, c")
    el = _parse_element("10.0.0.9 timeout 3h expires 2h59m", False)
    assert (el.key, el.value, el.comment) == (("10.0.0.9",), None, None)
