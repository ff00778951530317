"""The recorded ruleset's JSON Lines (engine/recorded.py, StateStore.load_ruleset):
- read lazily, it equals the ruleset decoded whole, and decodes nothing until read;
- digest_bytes of it (untouched, or changed the way compile_oneshot changes it, or changed
  in place after a read) is the digest form of what it holds;
- lines edited, reordered, dropped or added are refused, never guessed at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from reconciler.compile import Element, SerializeError, compile_ruleset, digest, digest_bytes, digest_pieces, \
    ruleset_from_json, ruleset_to_json
from reconciler.engine.recorded import LazyObjects, read_ruleset, ruleset_lines
from reconciler.engine.state import StateStore

from benchmix import bench_mix


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return compile_ruleset(*bench_mix(tmp_path_factory.mktemp("recorded"), 150, 3))


def _lines(rs) -> bytes:
    """A header line and the ruleset's lines, as a history file holds them."""
    return b"{}\n" + b"".join(ruleset_lines(*digest_pieces(rs)))


def lazy_ruleset(rs, text: bytes | None = None):
    return read_ruleset(_lines(rs) if text is None else text, 3, digest(rs), lazy=True)


def _decoded(lazy) -> int:
    return sum(t.chains.decoded + t.sets.decoded for t in lazy.tables.values())


def test_lazy_equals_whole_and_decodes_on_read(rs):
    text = digest_bytes(rs)
    lazy = lazy_ruleset(rs)
    assert isinstance(lazy.tables["ip"].chains, LazyObjects)
    assert _decoded(lazy) == 0
    for fam, t in rs.tables.items():
        assert list(lazy.tables[fam].chains) == sorted(t.chains)  # the text's order: by name
        assert list(lazy.tables[fam].sets) == sorted(t.sets)
    name = next(n for n in rs.tables["ip"].chains if "/" in n)
    assert lazy.tables["ip"].chains[name] == rs.tables["ip"].chains[name]
    assert _decoded(lazy) == 1
    assert lazy == rs  # compares (and so decodes) everything
    assert digest_bytes(lazy) == text


def test_digest_of_a_changed_lazy_ruleset_is_its_digest_form(rs):
    lazy = lazy_ruleset(rs)
    t = lazy.tables["ip"]
    chain = next(n for n in t.chains if "/" in n)
    del t.chains[chain]
    lazy.owners.pop(f"ip chain {chain}", None)
    name, s = next((n, s) for n, s in rs.tables["ip"].sets.items() if s.elements)
    t.sets[name] = dataclasses.replace(t.sets[name], elements=dict(list(s.elements.items())[1:]))
    # changed in place after a read: its recorded bytes must not be re-used
    other = next(n for n, s in rs.tables["ip"].sets.items() if s.elements and n != name)
    key = next(iter(t.sets[other].elements))
    t.sets[other].elements[key] = Element(key, t.sets[other].elements[key].value, "edited")
    body = digest_bytes(lazy)
    plain = ruleset_from_json(json.loads(body))
    assert plain == lazy
    assert body == digest_bytes(ruleset_from_json(ruleset_to_json(plain)))
    assert hashlib.sha256(body).hexdigest() == digest(plain)


def _edit_chain(text: bytes) -> bytes:
    lines = text.split(b"\n")
    i = next(i for i, line in enumerate(lines) if line.startswith(b'["chain",'))
    piece = json.loads(lines[i])
    piece[3]["comment"] = "edited"
    lines[i] = json.dumps(piece, sort_keys=True, separators=(",", ":")).encode()
    return b"\n".join(lines)


def _swap_chains(text: bytes) -> bytes:
    lines = text.split(b"\n")
    i = next(i for i, line in enumerate(lines) if line.startswith(b'["chain",'))
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    return b"\n".join(lines)


@pytest.mark.parametrize("damage", [
    _edit_chain, _swap_chains,
    lambda text: text.replace(b'\n["chain",', b'\n{"x":1}\n["chain",', 1),  # a stray line
    lambda text: text.replace(b'\n["chain",', b'\n ["chain",', 1),  # not as written
    lambda text: text.replace(b'"ip",', b'"inet",', 1),
    lambda text: text[:-2] + b"\n",
    lambda text: text[:-1],
    lambda text: b"{}\n" + text[3:].split(b"\n", 1)[1],  # no owners line
])
def test_lines_not_as_written_are_refused(rs, damage):
    with pytest.raises(SerializeError):
        lazy_ruleset(rs, damage(_lines(rs)))


def test_store_reads_lazily_or_whole(rs, tmp_path):
    store = StateStore(tmp_path, None, "nftrec")
    store.record_applied("r1", rs, None, 1)
    entry = store.history()[-1]
    lazy = store.load_ruleset(entry, lazy=True)
    assert isinstance(lazy.tables["ip"].chains, LazyObjects) and lazy == rs
    whole = store.load_ruleset(entry)
    assert isinstance(whole.tables["ip"].chains, dict) and whole == rs
    assert all(type(s.elements) is dict for t in whole.tables.values() for s in t.sets.values())


@pytest.mark.parametrize("seed", range(8))
def test_lazy_elements_behave_as_the_decoded_dict(rs, seed, monkeypatch):
    """A set's elements read lazily (LazyElements): the same answers, the same dict (in the
    same order) once iterated, and digest_bytes the digest form of the changed ruleset,
    for random reads, additions (before, between and after the recorded keys),
    replacements and deletions; a read or a change decodes nothing else."""
    import random

    from reconciler.engine import recorded

    monkeypatch.setattr(recorded, "LAZY_ELEMENTS_BYTES", 0)
    rnd = random.Random(seed)
    lazy, plain = lazy_ruleset(rs), ruleset_from_json(json.loads(digest_bytes(rs)))
    names = [n for n, s in plain.tables["ip"].sets.items() if len(s.elements) > 3]
    for name in rnd.sample(names, min(3, len(names))):
        have, want = lazy.tables["ip"].sets[name].elements, plain.tables["ip"].sets[name].elements
        assert isinstance(have, recorded.LazyElements)
        if rnd.random() < 0.5:  # a copy to change, as compile_oneshot's _patch makes
            lazy.tables["ip"].sets[name] = lazy.tables["ip"].sets[name].with_elements(have.copy())
            have = lazy.tables["ip"].sets[name].elements
        keys = list(want)
        if seed % 2 == 0:  # past either end of the recorded keys
            for k in (("~",) * len(keys[0]), ("!",) * len(keys[0])):
                have[k] = want[k] = Element(k, None, "c")
        for _ in range(rnd.randrange(1, 12)):
            r = rnd.random()
            k = rnd.choice(keys)
            if rnd.random() < 0.4:  # a key not recorded: before, between or after the recorded ones
                k = tuple(x + rnd.choice(["", "0", "~"]) for x in k) if rnd.random() < 0.7 else (rnd.choice("!~"),) * len(k)
            if r < 0.5:
                assert (k in have) == (k in want) and have.get(k) == want.get(k)
            elif r < 0.8:
                e = Element(k, None if want.get(k) is None or rnd.random() < 0.5 else want[k].value, "c")
                have[k] = want[k] = e
            else:
                assert have.pop(k, None) == want.pop(k, None)
        assert have._d is None, "reads and changes decode no set whole"
        assert bytes(have.lines()) == b"\n".join(json.dumps(
            {"key": list(e.key), "value": e.value, "comment": e.comment}, sort_keys=True, separators=(",", ":")
        ).encode() for e in sorted(want.values(), key=lambda e: e.key))
    body = digest_bytes(lazy)
    assert body == digest_bytes(plain) and hashlib.sha256(body).hexdigest() == digest(plain)
    for name in names:  # iterated: the dict the eager reader plus the same changes gives
        assert list(lazy.tables["ip"].sets[name].elements.items()) == list(plain.tables["ip"].sets[name].elements.items())
    assert lazy == plain


def test_text_that_looks_like_structure_stays_text(tmp_path):
    """Comments holding '},{"', newlines and non-ASCII are strings, never line breaks, and
    a name spelled with escapes is read as well."""
    from reconciler.compile import Chain, NamedSet, Rule, Table
    from reconciler.compile.ruleset import Ruleset

    t = Table("ip", "nftrec")
    t.chains["c"] = Chain("c", rules=(Rule("accept", comment='x"]\n["chain","ip","d",{'),))
    t.chains["cé\\"] = Chain("cé\\")  # a name spelled with escapes
    s = NamedSet("s", "ipv4_addr", comment="},{\"")
    for i, c in enumerate(['},{"comment":', "\n{", "é", None]):
        s.add(Element((f"10.0.0.{i}",), None, c))
    t.sets["s"] = s
    rs = Ruleset(tables={"ip": t}, owners={"ip chain c": 'a\n["owners",'})
    store = StateStore(tmp_path, None, "nftrec")
    store.record_applied("r", rs, None, 1)
    entry = store.history()[-1]
    assert entry.digest == digest(rs)
    assert len(entry.path.read_bytes().splitlines()) == 1 + 1 + 1 + 2 + 1 + 4
    assert store.load_ruleset(entry) == rs == store.load_ruleset(entry, lazy=True)
