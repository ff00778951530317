"""render_script: structure, order and determinism of the `nft -f` script."""

from reconciler.compile.services import compile_ruleset
from reconciler.intake.model import Inventory, NodeConfig
from reconciler.compile.render import render_script
from reconciler.compile.ruleset import Chain, Element, NamedSet, Rule, Ruleset, Table

from test_compile import CFG, OVERALL_SERVICES, OVERALL_SLICES


def _script():
    return render_script(compile_ruleset(Inventory(OVERALL_SERVICES, OVERALL_SLICES), CFG))


def test_preamble_add_delete_add_per_table():
    text = _script()
    blocks = text.strip().split("\n\n")
    assert len(blocks) == 2
    for block, fam in zip(blocks, ("ip", "ip6")):
        head = block.splitlines()[:3]
        assert head == [f'add table {fam} nftrec {{ comment "rules for nftrec" ; }}',
                        f"delete table {fam} nftrec",
                        f'add table {fam} nftrec {{ comment "rules for nftrec" ; }}']
        assert all(f" {fam} nftrec" in l for l in block.splitlines())


def test_declarations_before_uses():
    for block in _script().strip().split("\n\n"):
        kinds = [l.split()[1] for l in block.splitlines()[3:]]
        order = {"set": 0, "map": 0, "chain": 1, "rule": 2, "element": 3}
        seq = [order[k] for k in kinds]
        assert seq == sorted(seq)


def test_deterministic_and_ends_with_newline():
    a, b = _script(), _script()
    assert a == b and a.endswith("\n") and "\n\n\n" not in a


def test_elements_sorted_numerically():
    t = Table("ip", "nftrec", "rules for nftrec")
    s = NamedSet("service-nodeports", "inet_proto . inet_service", "verdict")
    t.chains["c"] = Chain("c")
    for port in ("30080", "3001", "443"):
        s.add(Element(("tcp", port), "goto c"))
    ips = NamedSet("cluster-ips", "ipv4_addr")
    for ip in ("10.0.0.10", "10.0.0.9", "9.0.0.1"):
        ips.add(Element((ip,)))
    t.sets = {"service-nodeports": s, "cluster-ips": ips}
    text = render_script(Ruleset({"ip": t}))
    els = [l for l in text.splitlines() if l.startswith("add element")]
    assert els == [
        "add element ip nftrec service-nodeports { tcp . 443 : goto c }",
        "add element ip nftrec service-nodeports { tcp . 3001 : goto c }",
        "add element ip nftrec service-nodeports { tcp . 30080 : goto c }",
        "add element ip nftrec cluster-ips { 9.0.0.1 }",
        "add element ip nftrec cluster-ips { 10.0.0.9 }",
        "add element ip nftrec cluster-ips { 10.0.0.10 }",
    ]


def test_rule_comment_and_base_chain_text():
    text = _script()
    assert "add chain ip nftrec nat-postrouting { type nat hook postrouting priority 100 ; }" in text
    assert 'add rule ip nftrec cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"' in text


def test_empty_ruleset_renders_nothing():
    assert render_script(Ruleset()) == ""


def test_custom_table_name():
    text = render_script(compile_ruleset(Inventory(), NodeConfig("n", table_name="edge_proxy")))
    assert "add table ip edge_proxy" in text and "add table ip6 edge_proxy" in text
    assert " nftrec " not in text


def test_unsafe_rule_body_refused():
    import pytest
    from reconciler.compile.ruleset import NftSyntaxError
    t = Table("ip", "nftrec")
    t.chains["c"] = Chain("c", (Rule("accept; flush ruleset"),))
    with pytest.raises(NftSyntaxError):
        render_script(Ruleset({"ip": t}))


def test_unsafe_set_type_flags_and_base_hook_refused():
    """Set types, set flags and base-chain type/hook are written unquoted into the script,
    so they are checked like every other string (not only trusted compiler constants)."""
    import pytest
    from reconciler.compile.ruleset import BaseHook, NftSyntaxError

    def render_with(sets=(), chains=()):
        t = Table("ip", "nftrec")
        t.sets = {s.name: s for s in sets}
        t.chains = {c.name: c for c in chains}
        return render_script(Ruleset({"ip": t}))

    for bad in ("ipv4_addr ; } ; add table ip pwn ; add set ip nftrec x { type ipv4_addr",
                "ipv4_addr\nadd table ip pwn", "", "ipv4_addr .", "ipv4_addr  . inet_proto"):
        with pytest.raises(NftSyntaxError):
            render_with(sets=[NamedSet("s", bad)])
    with pytest.raises(NftSyntaxError):
        render_with(sets=[NamedSet("s", "ipv4_addr", "verdict ; flush ruleset")])
    with pytest.raises(NftSyntaxError):
        render_with(sets=[NamedSet("s", "ipv4_addr", flags=("dynamic ; flush ruleset",))])
    with pytest.raises(NftSyntaxError):
        render_with(chains=[Chain("c", base=BaseHook("filter", "input ; flush ruleset", 0))])
    with pytest.raises(NftSyntaxError):
        render_with(chains=[Chain("c", base=BaseHook("filter ; flush ruleset", "input", 0))])
    # what the compiler writes passes
    ok = render_with(sets=[NamedSet("s", "ipv6_addr . ipv6_addr . inet_proto . inet_service"),
                           NamedSet("m", "inet_proto . inet_service", "verdict"),
                           NamedSet("a", "ipv4_addr", flags=("dynamic", "timeout"), timeout=5)],
                     chains=[Chain("c", base=BaseHook("nat", "postrouting", 100))])
    assert "add set ip nftrec a { type ipv4_addr ; flags dynamic,timeout ; timeout 5s ; }" in ok


def test_rule_cmd_checks_the_body_too():
    """Transactions (diff → nft.Transaction.add_rule) use rule_cmd directly, not render:
    the body guard must hold there as well (e.g. a tampered plan file)."""
    import pytest
    from reconciler.compile.ruleset import NftSyntaxError, rule_cmd
    for bad in ("accept; flush ruleset", "accept\nflush ruleset", 'accept comment "x"', "accept # x"):
        with pytest.raises(NftSyntaxError):
            rule_cmd("ip", "nftrec", "c", Rule(bad))
    assert rule_cmd("ip", "nftrec", "c", Rule("reject", "why")) == 'add rule ip nftrec c reject comment "why"'
