"""The recorded ruleset read lazily (engine/recorded.py, StateStore.load_ruleset(lazy=True)):
- it equals the ruleset decoded whole, for a realistic mix, and decodes nothing until read;
- digest_bytes of it (untouched, or changed the way compile_oneshot changes it, or changed
  in place after a read) is the digest form of what it holds;
- a text not laid out as digest_bytes writes it, or a history file of an older layout,
  is read whole (None / the eager reader), never guessed at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from reconciler.compile import Element, compile_ruleset, digest, digest_bytes, ruleset_from_json, ruleset_to_json
from reconciler.engine.recorded import LazyObjects, lazy_ruleset
from reconciler.engine.state import StateStore

from benchmix import bench_mix


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return compile_ruleset(*bench_mix(tmp_path_factory.mktemp("recorded"), 150, 3))


def _decoded(lazy) -> int:
    return sum(t.chains.decoded + t.sets.decoded for t in lazy.tables.values())


def test_lazy_equals_whole_and_decodes_on_read(rs):
    text = digest_bytes(rs)
    lazy = lazy_ruleset(b"  " + text + b"\n", 2, len(text) + 2)  # offsets into a bigger buffer
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
    lazy = lazy_ruleset(digest_bytes(rs))
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


@pytest.mark.parametrize("damage", [
    lambda text: text.replace(b'"formatVersion":1', b'"formatVersion":1 ', 1),  # another layout
    lambda text: json.dumps(json.loads(text), indent=1).encode(),
    lambda text: text.replace(b'{"base":', b'{"base" :', 1),
    lambda text: text.replace(b'"family":"ip"', b'"family":"inet"', 1),
    lambda text: text[:-2],
])
def test_text_not_laid_out_as_written_is_not_indexed(rs, damage):
    assert lazy_ruleset(damage(digest_bytes(rs))) is None


def test_store_reads_lazily_only_the_digest_form(rs, tmp_path):
    store = StateStore(tmp_path, None, "nftrec")
    store.record_applied("r1", rs, None, 1)
    entry = store.history()[-1]
    lazy = store.load_ruleset(entry, lazy=True)
    assert isinstance(lazy.tables["ip"].chains, LazyObjects) and lazy == rs
    assert isinstance(store.load_ruleset(entry).tables["ip"].chains, dict)
    # an entry of an older nftrec (indented, no rulesetSha256) is read whole
    doc = {"formatVersion": 1, "sequence": 2, "revision": "r0", "appliedAt": "2026-01-01T00:00:00Z",
           "digest": digest(rs), "planId": None, "ruleset": ruleset_to_json(rs)}
    old = entry.path.with_name(f"000002-{digest(rs)[:12]}.json")
    old.write_text(json.dumps(doc, indent=2))
    got = store.load_ruleset(store.history()[-1], lazy=True)
    assert isinstance(got.tables["ip"].chains, dict) and got == rs
