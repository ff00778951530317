"""set_elements_cmd checks all atoms of a declaration in one match (ruleset._atoms_safe);
it must refuse exactly what check_atom refuses, with check_atom's message, and write
what the per-element spelling writes."""

from __future__ import annotations

import random

import pytest

from reconciler.compile.ruleset import Element, NamedSet, NftSyntaxError, check_atom, set_elements_cmd

BAD = ['x"; add table ip pwn; #', "x; y", "x\ny", "x\ry", "x } ; y", "x # y", "x$y", "x\\", "x\x00y",
       "ünïcode", "a" * 301, "", "a  b", "x'y"]
OK = ["10.0.0.1", "fd00::1", "tcp", "80", "goto service-ABCDEFGH-ns/svc/tcp/p", "a" * 300, " x", "x ", "[::1]"]


def _map() -> NamedSet:
    return NamedSet("m", "ipv4_addr . inet_service", "verdict")


def _per_element(s: NamedSet, elements) -> str:
    """The spelling before _atoms_safe: check_atom per key part and value."""
    items = [e.key_text + (f" : {check_atom(e.value)}" if s.is_map else "") for e in elements]
    head = set_elements_cmd("ip", "t", s, [Element(("1.1.1.1", "1"), "drop" if s.is_map else None)])
    return head[:head.index("elements = { ")] + "elements = { " + " , ".join(items) + " } ; }"


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("bad", BAD)
def test_a_bad_atom_is_refused_with_check_atoms_message(bad, where):
    good = [Element((f"10.0.0.{i}", "80"), "drop") for i in range(50)]
    hostile = Element((bad, "80"), "drop") if where == "key" else Element(("10.0.1.1", "80"), bad)
    with pytest.raises(NftSyntaxError) as want:
        check_atom(bad)
    with pytest.raises(NftSyntaxError) as got:
        set_elements_cmd("ip", "t", _map(), good[:20] + [hostile] + good[20:])
    assert str(got.value) == str(want.value)


def test_same_text_as_per_element_checks():
    rnd = random.Random(8)
    for _ in range(200):
        s = _map() if rnd.random() < 0.5 else NamedSet("s", "ipv4_addr . inet_service")
        elements = [Element((rnd.choice(OK), rnd.choice(OK)), rnd.choice(OK) if s.is_map else None)
                    for _ in range(rnd.randint(1, 30))]
        assert set_elements_cmd("ip", "t", s, elements) == _per_element(s, elements)


def test_a_map_element_without_value_is_still_not_writable():
    with pytest.raises(NftSyntaxError, match="not writable in a declaration"):
        set_elements_cmd("ip", "t", _map(), [Element(("10.0.0.1", "80"), "drop"), Element(("10.0.0.2", "80"))])
