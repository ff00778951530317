"""serialize.py: lossless round trip, stable digest, clear errors on damaged documents."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.compile.ruleset import BaseHook, Chain, Element, NamedSet, Rule, Ruleset, Table
from reconciler.compile.serialize import (
    FORMAT_VERSION,
    SerializeError,
    canonical_json,
    digest,
    ruleset_from_json,
    ruleset_to_json,
)


def sample() -> Ruleset:
    t = Table(family="ip", name="nftrec", comment="rules for Kubernetes services")
    t.chains["nat-prerouting"] = Chain(
        "nat-prerouting", rules=(Rule("jump services"),), base=BaseHook("nat", "prerouting", -100)
    )
    t.chains["services"] = Chain(
        "services",
        rules=(
            Rule("ip daddr . meta l4proto . th dport vmap @service-ips"),
            Rule("fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports", comment="nodeports"),
        ),
    )
    t.chains["svc-x"] = Chain("svc-x", comment="default/web:http")
    s = NamedSet("service-ips", "ipv4_addr . inet_proto . inet_service", value_type="verdict", comment="svc")
    s.add(Element(("172.30.0.41", "tcp", "80"), value="goto svc-x", comment="default/web:http"))
    s.add(Element(("172.30.0.10", "udp", "53"), value="goto svc-y"))
    t.sets["service-ips"] = s
    t.sets["affinity"] = NamedSet("affinity", "ipv4_addr", flags=("dynamic", "timeout"), timeout=10800)
    t6 = Table(family="ip6", name="nftrec")
    return Ruleset(tables={"ip6": t6, "ip": t}, owners={"ip chain svc-x": "default/web"})


def test_round_trip_is_lossless_and_keeps_chain_order():
    rs = sample()
    doc = ruleset_to_json(rs)
    back = ruleset_from_json(json.loads(json.dumps(doc)))
    assert back == rs
    assert list(back.tables["ip"].chains) == ["nat-prerouting", "services", "svc-x"]
    assert list(back.tables["ip"].sets) == ["service-ips", "affinity"]
    assert back.tables["ip"].chains["nat-prerouting"].base == BaseHook("nat", "prerouting", -100)
    assert back.tables["ip"].sets["affinity"].flags == ("dynamic", "timeout")
    assert back.owners == {"ip chain svc-x": "default/web"}


def test_documented_shape():
    doc = ruleset_to_json(sample())
    assert doc["formatVersion"] == FORMAT_VERSION
    assert [t["family"] for t in doc["tables"]] == ["ip", "ip6"]  # sorted by family
    s = doc["tables"][0]["sets"][0]
    assert s["valueType"] == "verdict" and s["timeout"] is None and s["flags"] == []
    # elements are sorted by key, whatever order they were added in
    assert [e["key"] for e in s["elements"]] == [["172.30.0.10", "udp", "53"], ["172.30.0.41", "tcp", "80"]]
    assert s["elements"][1] == {"key": ["172.30.0.41", "tcp", "80"], "value": "goto svc-x", "comment": "default/web:http"}
    chain = doc["tables"][0]["chains"][0]
    assert chain["base"] == {"type": "nat", "hook": "prerouting", "priority": -100}
    assert doc["tables"][0]["chains"][2]["base"] is None


def test_digest_is_sha256_hex_and_ignores_insertion_order():
    a = sample()
    b = sample()
    t = b.tables["ip"]
    t.chains = dict(reversed(list(t.chains.items())))
    t.sets = dict(reversed(list(t.sets.items())))
    els = t.sets["service-ips"].elements
    t.sets["service-ips"].elements = dict(reversed(list(els.items())))
    assert a == b
    assert digest(a) == digest(b)
    assert len(digest(a)) == 64 and int(digest(a), 16) >= 0


def test_digest_changes_with_any_field():
    base = digest(sample())
    rs = sample()
    rs.owners["ip chain svc-x"] = "default/other"
    assert digest(rs) != base
    rs = sample()
    c = rs.tables["ip"].chains["services"]
    rs.tables["ip"].chains["services"] = Chain(c.name, rules=tuple(reversed(c.rules)))  # rule order matters
    assert digest(rs) != base
    rs = sample()
    rs.tables["ip"].sets["affinity"].timeout = 10
    assert digest(rs) != base
    rs = sample()
    rs.tables["ip"].comment = None
    assert digest(rs) != base


def test_canonical_json_is_compact_sorted_ascii():
    assert canonical_json({"b": 1, "a": "é"}) == b'{"a":"\\u00e9","b":1}'


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d.update(formatVersion=2), "formatVersion 2"),
        (lambda d: d.pop("owners"), "missing field 'owners'"),
        (lambda d: d["tables"][0].update(chains={}), "ruleset.tables[0].chains: expected list"),
        (lambda d: d["tables"][0]["chains"][0]["base"].update(priority="-100"), "ruleset.tables[0].chains[0].base.priority"),
        (lambda d: d["tables"][0]["chains"][0]["base"].update(priority=True), "priority: expected int"),
        (lambda d: d["tables"][0]["sets"][0]["elements"][0].update(key=["a", 1]), "elements[0].key[1]"),
        (lambda d: d["tables"][0]["sets"][0]["elements"].append(copy.deepcopy(d["tables"][0]["sets"][0]["elements"][0])), "duplicate key"),
        (lambda d: d["tables"].append(copy.deepcopy(d["tables"][0])), "a second table for family 'ip'"),
        (lambda d: d["tables"][0]["chains"].append(copy.deepcopy(d["tables"][0]["chains"][0])), "duplicate chain"),
        (lambda d: d["owners"].update(x=3), "ruleset.owners['x']"),
    ],
)
def test_damaged_documents_name_the_bad_field(mutate, where):
    doc = ruleset_to_json(sample())
    mutate(doc)
    with pytest.raises(SerializeError) as e:
        ruleset_from_json(doc)
    assert where in str(e.value)


def test_not_an_object():
    with pytest.raises(SerializeError, match="expected an object"):
        ruleset_from_json([1, 2])


# --- property-based ----------------------------------------------------------------------

text = st.text(max_size=12)  # any Unicode: the serializer must not care about nft syntax
opt_text = st.none() | text


@st.composite
def named_sets(draw, name):
    s = NamedSet(
        name=name,
        type=draw(text),
        value_type=draw(opt_text),
        flags=tuple(draw(st.lists(text, max_size=3))),
        timeout=draw(st.none() | st.integers(min_value=-(2**40), max_value=2**40)),
        comment=draw(opt_text),
    )
    for key in draw(st.lists(st.lists(text, min_size=1, max_size=3).map(tuple), max_size=6, unique=True)):
        s.add(Element(key=key, value=draw(opt_text), comment=draw(opt_text)))
    return s


@st.composite
def tables(draw, family):
    t = Table(family=family, name=draw(text), comment=draw(opt_text))
    for name in draw(st.lists(text, max_size=4, unique=True)):
        base = draw(st.none() | st.builds(BaseHook, text, text, st.integers(-1000, 1000)))
        rules = tuple(draw(st.lists(st.builds(Rule, text, opt_text), max_size=4)))
        t.chains[name] = Chain(name, rules=rules, base=base, comment=draw(opt_text))
    for name in draw(st.lists(text, max_size=3, unique=True)):
        t.sets[name] = draw(named_sets(name))
    return t


@st.composite
def rulesets(draw):
    rs = Ruleset()
    for family in draw(st.lists(st.sampled_from(["ip", "ip6"]), unique=True)):
        rs.tables[family] = draw(tables(family))
    rs.owners = draw(st.dictionaries(text, text, max_size=4))
    return rs


@settings(max_examples=200, deadline=None)
@given(rulesets())
def test_property_round_trip(rs):
    doc = ruleset_to_json(rs)
    # through real JSON text, as the state store and plan files do
    back = ruleset_from_json(json.loads(json.dumps(doc)))
    assert back == rs
    for fam, t in rs.tables.items():
        assert list(back.tables[fam].chains) == list(t.chains)
        assert list(back.tables[fam].sets) == list(t.sets)
    assert digest(back) == digest(rs)
    assert ruleset_to_json(back) == doc  # the form is a fixed point


@settings(max_examples=100, deadline=None)
@given(rulesets(), st.randoms(use_true_random=False))
def test_property_digest_ignores_dict_order(rs, rnd):
    shuffled = ruleset_from_json(ruleset_to_json(rs))
    for t in shuffled.tables.values():
        items = list(t.chains.items())
        rnd.shuffle(items)
        t.chains = dict(items)
        sets = list(t.sets.items())
        rnd.shuffle(sets)
        t.sets = dict(sets)
        for s in t.sets.values():
            els = list(s.elements.items())
            rnd.shuffle(els)
            s.elements = dict(els)
    assert shuffled == rs
    assert digest(shuffled) == digest(rs)
