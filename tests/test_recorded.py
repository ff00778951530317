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
    text = digest_bytes(rs)
    lazy, plain = lazy_ruleset(text), ruleset_from_json(json.loads(text))
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
        assert bytes(have.encoded()) == b",".join(json.dumps(
            {"key": list(e.key), "value": e.value, "comment": e.comment}, sort_keys=True, separators=(",", ":")
        ).encode() for e in sorted(want.values(), key=lambda e: e.key))
    body = digest_bytes(lazy)
    assert body == digest_bytes(plain) and hashlib.sha256(body).hexdigest() == digest(plain)
    for name in names:  # iterated: the dict the eager reader plus the same changes gives
        assert list(lazy.tables["ip"].sets[name].elements.items()) == list(plain.tables["ip"].sets[name].elements.items())
    assert lazy == plain
