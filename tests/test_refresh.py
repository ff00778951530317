"""`plan --refresh` (engine/refresh.py): the listing and the inputs, with a compile memo.

- property: for random edits of the inputs and random damage to the kernel (chains and
  elements deleted, endpoint index ranges moved, stray objects), the desired ruleset and
  the plan with the memo (the last applied ruleset + its compiled.json) are those without
  it (every Service compiled against the listing); a Service whose input changed is
  compiled, never served from the memo;
- a memo that does not belong (another config, a damaged history entry) is not used;
- real kernel: `plan --refresh` with and without compiled.json prints the same plan (its
  transaction in another order: the memo's objects come in the recorded order) for
  an edit plus hand-made drift, and nothing for a no-op; the early listing parses to
  read_live's Ruleset.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.compile import compile_oneshot, digest, ruleset_from_json, ruleset_to_json
from reconciler.compile.layout import chain_range, pick_rule
from reconciler.compile.ruleset import Chain, Element, Rule, Ruleset
from reconciler.engine.plan import format_text, make_plan
from reconciler.engine.refresh import compile_memoized
from reconciler.kernel import canonical

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from test_oneshot import _edit, world  # noqa: E402,F401  (random input edits, the 240-Service world)


def _recorded(rs: Ruleset) -> Ruleset:
    return ruleset_from_json(ruleset_to_json(rs))  # what the state store gives back


def _damage(live: Ruleset, rnd: random.Random) -> Ruleset:
    """`live` (a copy) as someone's hand left it: chains and elements gone, an endpoint
    range moved to another offset of its map, a stray chain and element."""
    rs = ruleset_from_json(ruleset_to_json(live))
    t = rs.tables["ip"]
    for _ in range(rnd.randrange(0, 3)):
        del t.chains[rnd.choice(sorted(n for n in t.chains if "/" in n))]
    for _ in range(rnd.randrange(0, 3)):
        s = t.sets[rnd.choice(sorted(n for n, s in t.sets.items() if s.elements))]
        s.elements.pop(rnd.choice(sorted(s.elements)))
    if rnd.random() < 0.6:  # move one pick chain's range to the end of its map
        name = rnd.choice(sorted(n for n, c in t.chains.items() if "/" in n and chain_range(c)))
        c = t.chains[name]
        m, k, n = chain_range(c)
        elems = t.sets[m].elements
        top = 1 + max(int(key[0]) for key in elems)
        for i in range(n):
            e = elems.pop((str(k + i),), None)
            if e is not None:
                elems[(str(top + i),)] = Element((str(top + i),), e.value)
        body = c.rules[-1].body
        head = body[: body.index("numgen random mod ")]
        from reconciler.compile.layout import Pick
        p = Pick("ip", name, m, head, ("x",) * n)
        t.chains[name] = Chain(c.name, c.rules[:-1] + (pick_rule(p, top),), c.base, c.comment)
    if rnd.random() < 0.3:
        t.chains["stray"] = Chain("stray", (Rule("drop"),))
    return canonical(rs)


def _norm(op) -> str:
    """An nft operation with the elements of a map declaration sorted (their order is dict
    order, which a patched and a fresh assembly build differently; the same map)."""
    op = str(op)
    m = re.search(r"elements = \{ (.*?) \}", op)
    return op if m is None else op[:m.start(1)] + " , ".join(sorted(m.group(1).split(" , "))) + op[m.end(1):]


def _plans(desired: Ruleset, live: Ruleset):
    plan = make_plan(desired, live)
    return format_text(plan, verbose=False), sorted(map(_norm, plan.transaction))


@pytest.mark.parametrize("seed", range(10))
def test_refresh_with_the_memo_equals_refresh_without_it(world, seed):
    inv, cfg, cd = world
    rnd = random.Random(seed)
    first = compile_oneshot(inv, cfg, cd)
    applied, memo = first.ruleset, json.loads(json.dumps(first.memo))
    kernel = canonical(applied)
    for round_ in range(3):
        new_inv = _edit(inv, rnd, seed * 10 + round_)
        live = _damage(kernel, rnd) if rnd.random() < 0.7 else kernel
        live_before = digest(live)
        plain = compile_memoized(new_inv, cfg, cd, live, None)
        memoized = compile_memoized(new_inv, cfg, cd, live, (_recorded(applied), memo))
        assert digest(live) == live_before, "the listing is only read"
        assert memoized.recompiled < len(new_inv.services), "the memo served the unchanged Services"
        assert plain.recompiled == len(new_inv.services)
        assert digest(memoized.ruleset) == digest(plain.ruleset)
        assert memoized.ruleset.owners == plain.ruleset.owners
        assert _plans(memoized.ruleset, live) == _plans(plain.ruleset, live)
        # as apply leaves it: the kernel made equal to this round's desired, its memo recorded
        inv = new_inv
        again = compile_oneshot(inv, cfg, cd, _recorded(applied), memo)
        applied, memo = again.ruleset, json.loads(json.dumps(again.memo))
        kernel = canonical(applied) if rnd.random() < 0.5 else canonical(plain.ruleset)


def test_a_changed_input_is_compiled_not_served(world):
    """An endpoint moved and nothing else: that Service is compiled (the only one), and
    the desired ruleset has its new address, as a compile of everything has."""
    inv, cfg, cd = world
    first = compile_oneshot(inv, cfg, cd)
    slices = list(inv.endpoint_slices)
    i = next(i for i, s in enumerate(slices) if s.endpoints)
    moved = dataclasses.replace(slices[i].endpoints[0], addresses=("10.251.7.7",))
    slices[i] = dataclasses.replace(slices[i], endpoints=(moved,) + slices[i].endpoints[1:])
    new_inv = dataclasses.replace(inv, endpoint_slices=tuple(slices))
    live = canonical(first.ruleset)
    one = compile_memoized(new_inv, cfg, cd, live, (_recorded(first.ruleset), first.memo))
    assert one.recompiled == 1
    assert "10.251.7.7" in json.dumps(ruleset_to_json(one.ruleset))
    assert digest(one.ruleset) == digest(compile_memoized(new_inv, cfg, cd, live, None).ruleset)


def test_a_memo_of_another_config_compiles_everything(world):
    inv, cfg, cd = world
    first = compile_oneshot(inv, cfg, cd)
    live = canonical(first.ruleset)
    one = compile_memoized(inv, cfg, "another config digest", live, (_recorded(first.ruleset), first.memo))
    assert one.recompiled == len(inv.services)
    assert digest(one.ruleset) == digest(first.ruleset)
    assert make_plan(one.ruleset, live).empty


def test_the_memo_is_read_from_the_state_and_a_damaged_entry_is_not_used(world, tmp_path, caplog):
    from reconciler import logs
    from reconciler.engine.refresh import _memo
    from reconciler.engine.target import Target

    inv, cfg, cd = world
    first = compile_oneshot(inv, cfg, cd)
    target = Target("ns-x", "nftrec", tmp_path)
    target.store().record_applied("r1", first.ruleset, None, None, input_digest="i", config_digest=cd,
                                  compiled=first.memo)
    rec = _memo(target)
    assert rec is not None and digest(rec[0]) == digest(first.ruleset) and rec[1]["services"] == first.memo["services"]
    entry = target.store().history()[-1]
    raw = entry.path.read_bytes()
    at = raw.index(b"10.128.")
    entry.path.write_bytes(raw[:at] + b"10.129." + raw[at + 7:])  # same length, another address
    level = logs.log.level
    logs.log.setLevel("DEBUG")
    try:
        with caplog.at_level("DEBUG"):
            assert _memo(target) is None
    finally:
        logs.log.setLevel(level)
    assert "no compile memo" in caplog.text


# --- real kernel ---------------------------------------------------------------------------


@pytest.mark.kernel
def test_refresh_plans_the_same_with_and_without_compiled_json(netns, tmp_path, monkeypatch):
    from test_cli_kernel import _add_endpoint, copy_edge, nftrec, ok

    monkeypatch.setenv("NFTREC_LOG_LEVEL", "debug")
    state = tmp_path / "state"
    d = copy_edge(tmp_path / "m")
    ok(nftrec("apply", str(d), state=state, ns=netns))
    p = ok(nftrec("plan", str(d), "--refresh", "--detailed-exitcode", state=state, ns=netns))
    assert "No changes" in p.stdout
    assert re.search(r"plan --refresh: 0 of \d+ Services compiled, the rest from the compile memo", p.stderr), p.stderr
    # drift by hand (a Service chain and a cluster-ips element gone) and an edit of the inputs
    listed = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "nftrec"],
                            capture_output=True, text=True, check=True).stdout
    chain = re.search(r"chain (external-[A-Z2-7]{8}-\S+) \{", listed) or re.search(r"chain (service-\S+) \{", listed)
    subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "chain", "ip", "nftrec", chain.group(1)], check=True)
    _add_endpoint(d)
    compiled = next(state.rglob("compiled.json"))
    with_memo = ok(nftrec("plan", str(d), "--refresh", "-v", "--detailed-exitcode", state=state, ns=netns), 2)
    assert re.search(r"plan --refresh: 1 of \d+ Services compiled", with_memo.stderr), with_memo.stderr
    assert chain.group(1) in with_memo.stdout
    compiled.unlink()
    without = ok(nftrec("plan", str(d), "--refresh", "-v", "--detailed-exitcode", state=state, ns=netns), 2)
    assert "compile memo" not in without.stderr
    # the same plan; the transaction's lines in another order (objects follow the desired
    # ruleset's order: the memo's is the recorded one's, by name), as the fast path's
    summary, tx = with_memo.stdout.split("Transaction:")
    assert summary == without.stdout.split("Transaction:")[0]
    assert sorted(tx.splitlines()) == sorted(without.stdout.split("Transaction:")[1].splitlines())


@pytest.mark.kernel
def test_the_early_listing_is_what_read_live_lists(netns, tmp_path):
    """begin_listing's listing (started on its own Libnftables) parses to read_live's
    Ruleset, is taken once, and without it read_listing lists through the handle given."""
    from reconciler.engine import refresh
    from reconciler.engine.target import Target
    from reconciler.kernel import Libnftables, read_live

    script = ('add table ip nftrec { comment "x" ; }\n'
              "add chain ip nftrec c\nadd rule ip nftrec c ip daddr 10.0.0.1 tcp dport 80 dnat to 10.1.0.1:8080\n"
              "add set ip nftrec s { type ipv4_addr ; elements = { 10.2.0.1, 10.2.0.2 } ; }\n")
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, text=True, check=True)
    target = Target(netns, "nftrec", tmp_path)
    nft = Libnftables(netns)
    try:
        want = read_live(nft, "nftrec")
        assert want.tables["ip"].chains["c"].rules and want.tables["ip"].sets["s"].elements
        refresh.begin_listing(target)
        assert (netns, "nftrec") in refresh._started
        assert refresh.read_listing(None, target) == want  # None: the early listing, not this handle
        assert (netns, "nftrec") not in refresh._started
        assert refresh.read_listing(nft, target) == want
    finally:
        nft.close()
