"""intake/yamldocs: an edited file re-parsed document by document gives exactly what the
whole-file parser gives (data, positions, errors), and re-parses only what changed."""

from __future__ import annotations

import random

import pytest

from reconciler.intake import parse, yamldocs

PIECES = [
    "apiVersion: v1\nkind: Service\nmetadata:\n  name: a{n}\n  namespace: ns\nspec:\n  ports:\n  - port: {n}\n",
    "kind: EndpointSlice\nmetadata: {{name: s{n}}}\nendpoints:\n- addresses: [10.0.0.{n}]\n- addresses: [\"10.1.0.{n}\"]\n",
    "kind: List\nitems:\n- kind: A\n  n: {n}\n- kind: B\n  n: {n}\n",
    "# only a comment {n}\n",
    "kind: C\ntext: |\n  line {n}\n  --- not a marker (indented)\nother: x\n",
    "kind: D\nbase: &b {{x: {n}}}\nuse: *b\n",
    "kind: E\nflag: yes\nv6: [fd00::{n}]\n",  # YAML 1.1 bool; libyaml's ':' in a flow scalar (pure parser)
    "kind: F\nquoted: \"a\n  b {n}\"\nplain: c\n  d\n",
    "",  # an explicit empty document
    "~\n",  # a null document
    "- not a mapping {n}\n",
    "kind: G\nbad: [unclosed {n}\n",  # a syntax error
    "kind: H\nalias: *nowhere\n",  # an undefined alias
    "kind: I\nk: 1\nk: 2\n",  # a duplicate key
]
RARE = ["...\n", "%YAML 1.1\n---\n", "kind: J\r\nx: 1\r\n", "--- {kind: K, n: 1}\n"]


def _text(rng: random.Random, docs: list[str]) -> str:
    head = rng.choice(["", "# header\n", "---\n"])
    return head + "".join(("" if i == 0 and head != "---\n" and rng.random() < 0.5 else "---\n") + d
                          for i, d in enumerate(docs))


def _doc(rng: random.Random, bad: bool) -> str:
    pool = PIECES if bad else PIECES[:11]
    if rng.random() < 0.03:
        return rng.choice(RARE)
    return rng.choice(pool).format(n=rng.randrange(1, 250))


def _outcome(fn, text):
    try:
        return "ok", fn(text)
    except Exception as e:  # noqa: BLE001 - the same exception, same message, is the point
        return type(e).__name__, str(e)


@pytest.mark.parametrize("seed", range(40))
def test_edits_parse_exactly_as_the_whole_file(seed):
    rng = random.Random(seed)
    docs = [_doc(rng, False) for _ in range(rng.randrange(1, 12))]
    text = _text(rng, docs)
    first = _outcome(lambda t: yamldocs.parse(t, None, parse.parse_yaml), text)
    assert first[0] == _outcome(parse.parse_yaml, text)[0]
    known = first[1][1] if first[0] == "ok" else None
    for _ in range(15):
        docs = list(docs)
        for _ in range(rng.randrange(1, 3)):
            what = rng.random()
            i = rng.randrange(len(docs) + 1)
            if what < 0.5 and docs:
                docs[min(i, len(docs) - 1)] = _doc(rng, bad=seed % 3 == 0)
            elif what < 0.75:
                docs.insert(i, _doc(rng, bad=seed % 3 == 0))
            elif len(docs) > 1:
                del docs[min(i, len(docs) - 1)]
        new = _text(rng, docs)
        calls = []

        def counting(t):
            calls.append(t)
            return parse.parse_yaml(t)

        got = _outcome(lambda t: yamldocs.parse(t, known, counting), new)
        want = _outcome(parse.parse_yaml, new)
        assert (got[0], got[1][0] if got[0] == "ok" else got[1]) == want, new
        if got[0] == "ok":
            known = got[1][1]
            text = new


def test_one_changed_document_is_the_only_one_parsed():
    docs = [PIECES[1].format(n=i) for i in range(1, 101)]
    text = "".join("---\n" + d for d in docs)
    _, known = yamldocs.parse(text, None, parse.parse_yaml)
    assert len(known) == 100
    docs[57] = docs[57].replace("10.0.0.58", "10.9.9.9")
    docs.insert(80, "kind: New\nmetadata: {name: n}\nlines: [1,\n  2]\n")  # shifts the documents after it
    new = "".join("---\n" + d for d in docs)
    calls = []
    parsed, known2 = yamldocs.parse(new, known, lambda t: calls.append(t) or parse.parse_yaml(t))
    assert parsed == parse.parse_yaml(new)
    assert len(calls) == 2 and "10.9.9.9" in calls[0] and "kind: New" in calls[1]
    # unchanged documents are the same objects (validation and models are reused by identity)
    assert parsed[3][0] is yamldocs.parse(text, known, parse.parse_yaml)[0][3][0]


def test_unusual_texts_parse_whole():
    for text in ["%YAML 1.1\n---\na: 1\n", "a: 1\n...\n---\nb: 2\n", "a: 1\r\n---\r\nb: 2\r\n"]:
        assert yamldocs.split(text) is None
        parsed, known = yamldocs.parse(text, {b"x": None}, parse.parse_yaml)
        assert parsed == parse.parse_yaml(text) and known == {}
