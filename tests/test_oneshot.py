"""One-shot incremental compile and diff (compile/oneshot.py `compile_oneshot`, used by
engine/apply.py `plan_desired`): a `plan`/`apply` after an apply compiles only the
Services whose input changed, patches them into the recorded ruleset and diffs only them.

- property: for random edits (endpoints moved, added, removed; Services removed, added,
  retyped; several rounds, each against the previous round's result), the incremental
  ruleset has the digest of a full compile with the same previous ranges, and the plan
  (text and transaction) is the full plan's;
- the memo is ignored when it does not fit (another config, not exact);
- real kernel: an edit applied incrementally leaves the kernel exactly as the same edit
  applied through the full compile (compiled.json removed) in a twin namespace.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest

from reconciler.compile import allocation_of, compile_oneshot, compile_ruleset, digest, digest_bytes, \
    ruleset_from_json, ruleset_to_json
from reconciler.compile.oneshot import _memo_allocation
from reconciler.engine import recorded as recorded_mod
from reconciler.engine.plan import format_text, make_plan
from reconciler.intake import config_digest, load_node_config
from reconciler.kernel import canonical
from test_recorded import lazy_ruleset  # the recorded ruleset, read lazily

from benchmix import bench_mix, mix
from test_cli_kernel import netns2  # noqa: E402,F401  (a second throwaway namespace)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    inventory, cfg = bench_mix(tmp_path_factory.mktemp("oneshot"), 240, 4)
    return inventory, cfg, config_digest(cfg, strict=False)


def _norm(op) -> str:
    """An nft operation with the elements of a batched map declaration sorted (their order
    follows dict order, which a patch and a full assembly build differently)."""
    op = str(op)
    m = re.search(r"elements = \{ (.*) \} ; \}$", op)  # the declaration's own `} ; }` is not an element
    return op if m is None else op[:m.start(1)] + " , ".join(sorted(m.group(1).split(" , "))) + op[m.end(1):]


def _edit(inv, rnd: random.Random, serial: int):
    slices, svcs = list(inv.endpoint_slices), list(inv.services)
    for _ in range(rnd.randrange(1, 6)):
        i = rnd.randrange(len(slices))
        s = slices[i]
        eps = list(s.endpoints)
        r = rnd.random()
        fresh = lambda: (f"10.250.{rnd.randrange(250)}.{rnd.randrange(1, 250)}",)  # noqa: E731
        if r < 0.35 and eps:
            eps[rnd.randrange(len(eps))] = dataclasses.replace(eps[0], addresses=fresh())
        elif r < 0.65 and eps:
            eps += [dataclasses.replace(eps[0], addresses=fresh()) for _ in range(rnd.randrange(1, 12))]
        elif r < 0.85:
            eps = eps[:rnd.randrange(0, len(eps) + 1)]
        elif eps:
            eps[0] = dataclasses.replace(eps[0], ready=not eps[0].ready)
        slices[i] = dataclasses.replace(s, endpoints=tuple(dict.fromkeys(eps)))
    for _ in range(rnd.randrange(0, 3)):
        del svcs[rnd.randrange(len(svcs))]
    if rnd.random() < 0.5:  # a new Service taking over an existing one's slices under a new name
        j = rnd.randrange(len(svcs))
        old = svcs[j]
        svcs[j] = dataclasses.replace(old, name=f"{old.name}-v{serial}")
        slices = [dataclasses.replace(s, service_name=f"{old.name}-v{serial}") if s.service_key == old.key else s
                  for s in slices]
    if rnd.random() < 0.4:  # affinity and policy flips
        j = rnd.randrange(len(svcs))
        s = svcs[j]
        svcs[j] = dataclasses.replace(s, session_affinity="None" if s.session_affinity == "ClientIP" else "ClientIP",
                                      external_traffic_policy=rnd.choice(["Cluster", "Local"]))
    return dataclasses.replace(inv, endpoint_slices=tuple(slices), services=tuple(svcs))


@pytest.mark.parametrize("seed,lazy_elements", [(seed, None) for seed in range(12)] + [(seed, 0) for seed in range(4)])
def test_incremental_equals_full_compile_and_plan(world, seed, lazy_elements, monkeypatch):
    """lazy_elements=0: every recorded set's elements read lazily (at this size none
    reaches recorded.LAZY_ELEMENTS_BYTES; at 10,000 Services the big static sets do)."""
    if lazy_elements is not None:
        monkeypatch.setattr(recorded_mod, "LAZY_ELEMENTS_BYTES", lazy_elements)
    inv, cfg, cd = world
    rnd = random.Random(seed)
    first = compile_oneshot(inv, cfg, cd)
    assert first.changed is None and first.memo["exact"] is True
    assert digest(first.ruleset) == digest(compile_ruleset(inv, cfg))
    assert _memo_allocation(first.memo) == allocation_of(first.ruleset)
    applied, memo = first.ruleset, json.loads(json.dumps(first.memo))
    for round_ in range(3):  # each round against the previous round's result, as applies chain
        inv = _edit(inv, rnd, seed * 10 + round_)
        recorded = ruleset_from_json(ruleset_to_json(applied))  # what the state store gives back
        full = compile_ruleset(inv, cfg, previous=recorded)
        full_plan = make_plan(full, canonical(recorded))
        # as apply reads it: the history entry's bytes, decoded lazily (engine/recorded.py)
        lazy = lazy_ruleset(applied)
        assert lazy is not None
        one = compile_oneshot(inv, cfg, cd, lazy, memo)
        assert one.changed is not None, "the memo fits: only changed Services are compiled"
        assert one.recompiled <= len(one.changed) < len(inv.services)
        objects = sum(len(t.chains) + len(t.sets) for t in one.ruleset.tables.values())
        assert sum(t.chains.decoded + t.sets.decoded for t in lazy.tables.values()) < objects / 2
        # the digest re-uses the bytes of what was not decoded; a full decode agrees
        assert digest(one.ruleset) == digest(full)
        assert digest(ruleset_from_json(ruleset_to_json(one.ruleset))) == digest(full)
        assert _memo_allocation(one.memo) == allocation_of(full)
        plan = make_plan(one.desired_part, canonical(one.applied_part))
        assert format_text(plan, verbose=False) == format_text(full_plan, verbose=False)
        assert sorted(map(_norm, plan.transaction)) == sorted(map(_norm, full_plan.transaction))
        assert one.memo["exact"] is True
        applied, memo = one.ruleset, json.loads(json.dumps(one.memo))  # as compiled.json gives it back


def test_no_change_compiles_nothing_and_plans_nothing(world):
    inv, cfg, cd = world
    first = compile_oneshot(inv, cfg, cd)
    one = compile_oneshot(inv, cfg, cd, ruleset_from_json(ruleset_to_json(first.ruleset)), first.memo)
    assert one.changed == set() and one.recompiled == 0
    assert digest(one.ruleset) == digest(first.ruleset)
    assert make_plan(one.desired_part, canonical(one.applied_part)).empty


def test_memo_that_does_not_fit_compiles_everything(world):
    inv, cfg, cd = world
    first = compile_oneshot(inv, cfg, cd)
    recorded = lambda: ruleset_from_json(ruleset_to_json(first.ruleset))  # noqa: E731
    for memo, config_dig in (({**first.memo, "key": "another config"}, cd),
                             ({**first.memo, "exact": False}, cd),
                             (first.memo, "another config digest"),
                             (None, cd)):
        one = compile_oneshot(inv, cfg, config_dig, recorded(), memo)
        assert one.changed is None and one.recompiled == len(inv.services)
        assert digest(one.ruleset) == digest(first.ruleset)


def test_service_input_digest_ignores_file_positions_only(world):
    from reconciler.compile.oneshot import service_input_digest
    from reconciler.intake import Source

    inv = world[0]
    svc = inv.services[0]
    moved = dataclasses.replace(svc, source=Source("elsewhere.yaml", 99, 1))
    assert service_input_digest(moved, ()) == service_input_digest(svc, ())
    assert service_input_digest(dataclasses.replace(svc, name="other"), ()) != service_input_digest(svc, ())


# --- per-file: input digests from the memo for unchanged files (Inventory.origins) ------------


def _file_edit(root: Path, n: int, rnd: random.Random, serial: int) -> None:
    """Random edits of a bench/mix tree on disk: endpoints moved in a slice file, a
    Service document dropped from its file, a Service flipped to ClientIP affinity."""
    for _ in range(rnd.randrange(1, 3)):
        k = rnd.randrange(n)
        ips = mix.ep_ips(k, 4)
        ips[rnd.randrange(4)] = mix.fresh_ip(n, 4, serial * 10 + rnd.randrange(10))
        mix.write_slice_file(root, k, n, 4, {k: ips})
    f = rnd.choice(sorted((root / "services").iterdir()))
    docs = f.read_text().split("---\n")
    if rnd.random() < 0.5 and len(docs) > 1:
        del docs[rnd.randrange(len(docs))]
    if rnd.random() < 0.5:
        i = rnd.randrange(len(docs))
        if "sessionAffinity" not in docs[i]:
            docs[i] = docs[i].replace("  ports:\n", "  sessionAffinity: ClientIP\n  ports:\n", 1)
    f.write_text("---\n".join(docs))


@pytest.mark.parametrize("seed", range(4))
def test_unchanged_files_keep_their_memo_digests_and_the_result_is_the_full_compile(tmp_path, monkeypatch, seed):
    """Read through the intake cache, Services of unchanged files take their input digest
    from the memo (not hashed again); the memo's digests, the ruleset and the plan are
    still those of a full compile, round after round."""
    from reconciler.compile import oneshot
    from reconciler.intake import read_inventory

    n = 240
    root, cache = tmp_path / "m", tmp_path / "cache"
    mix.generate(root, n, 4)
    (tmp_path / "cfg.yaml").write_text(mix.NODE_CONFIG)
    cfg, _ = load_node_config(str(tmp_path / "cfg.yaml"), discover=False)
    cd = config_digest(cfg, strict=False)
    real = oneshot.service_input_digest
    hashed: list[str] = []
    monkeypatch.setattr(oneshot, "service_input_digest", lambda svc, sl: hashed.append(svc.key) or real(svc, sl))
    first = compile_oneshot(read_inventory(root, cache_dir=cache).inventory, cfg, cd)
    assert len(first.memo["tokens"]) == n  # every Service came through the cache
    applied, memo = first.ruleset, json.loads(json.dumps(first.memo))
    rnd = random.Random(seed)
    for round_ in range(3):
        _file_edit(root, n, rnd, seed * 10 + round_)
        res = read_inventory(root, cache_dir=cache)
        assert not [p for p in res.problems if p.is_error]
        inv = res.inventory
        recorded = ruleset_from_json(ruleset_to_json(applied))
        full = compile_ruleset(inv, cfg, previous=recorded)
        hashed.clear()
        one = compile_oneshot(inv, cfg, cd, lazy_ruleset(applied), memo)
        assert one.changed is not None
        # only Services with a document in an edited file were hashed (at most 3 files of 100)
        assert 0 < len(hashed) <= 300 and len(hashed) < len(inv.services)
        by_svc = oneshot.slices_by_service(inv.endpoint_slices)
        assert one.memo["services"] == {s.key: real(s, by_svc.get(s.key, ())) for s in inv.services}
        assert digest(one.ruleset) == digest(full)
        plan, full_plan = make_plan(one.desired_part, canonical(one.applied_part)), make_plan(full, canonical(recorded))
        assert format_text(plan, verbose=False) == format_text(full_plan, verbose=False)
        applied, memo = one.ruleset, json.loads(json.dumps(one.memo))


def test_a_replaced_model_object_is_hashed_again(tmp_path):
    """An object that is not the one the intake read (probe results, a test's replace)
    has no origin: its Service's digest is computed, so the change is seen."""
    from reconciler.intake import read_inventory

    mix.generate(tmp_path / "m", 120, 3)
    (tmp_path / "cfg.yaml").write_text(mix.NODE_CONFIG)
    cfg, _ = load_node_config(str(tmp_path / "cfg.yaml"), discover=False)
    cd = config_digest(cfg, strict=False)
    inv = read_inventory(tmp_path / "m", cache_dir=tmp_path / "cache").inventory
    first = compile_oneshot(inv, cfg, cd)
    s = inv.endpoint_slices[7]
    edited = dataclasses.replace(s, endpoints=s.endpoints[:1])
    inv2 = dataclasses.replace(inv, endpoint_slices=tuple(edited if x is s else x for x in inv.endpoint_slices))
    assert inv2.origins is inv.origins  # carried over by replace: identity is what guards it
    one = compile_oneshot(inv2, cfg, cd, lazy_ruleset(first.ruleset), json.loads(json.dumps(first.memo)))
    assert one.changed == {s.service_key}
    assert s.service_key not in one.memo["tokens"]


# --- real kernel ---------------------------------------------------------------------------


@pytest.mark.kernel
def test_incremental_apply_leaves_the_kernel_as_a_full_apply(netns, netns2, tmp_path, monkeypatch):
    from test_cli_kernel import _add_endpoint, _remove_endpoint, assert_clean, copy_edge, listing, nftrec, ok

    monkeypatch.setenv("NFTREC_LOG_LEVEL", "debug")
    ran = {}
    for ns, tag in ((netns, "incremental"), (netns2, "full")):
        state = tmp_path / f"state-{tag}"
        d = copy_edge(tmp_path / tag)
        ok(nftrec("apply", str(d), state=state, ns=ns))
        compiled = next(state.rglob("compiled.json"))
        assert json.loads(compiled.read_text())["exact"] is True
        for edit in (_add_endpoint, _remove_endpoint):
            edit(d)
            if tag == "full":
                compiled.unlink()  # no memo: everything is compiled and diffed
            p = nftrec("apply", str(d), state=state, ns=ns)
            p = ok(p)
            m = re.search(r"incremental plan: (\d+) of (\d+) Services compiled", p.stderr)
            if tag == "incremental":
                assert m and int(m.group(1)) == 1 < int(m.group(2)), p.stderr
            else:
                assert m is None, p.stderr
        assert_clean(d, state, ns)
        # the newest history entry (joined from the recorded bytes of what the edit did not
        # touch, engine/recorded.py) decodes whole to a ruleset of exactly its digest
        from reconciler.engine.state import StateStore

        store = StateStore(state, ns, "nftrec")
        entry = store.history()[-1]
        assert digest(store.load_ruleset(entry)) == entry.digest == store.status().desired_digest
        ran[tag] = (listing(ns, "ip"), listing(ns, "ip6"), p.stdout)
    strip = lambda text: re.sub(r" # handle \d+", "", text)  # noqa: E731
    for i in (0, 1):
        assert strip(ran["incremental"][i]) == strip(ran["full"][i])
    assert ran["incremental"][2].split("revision")[0] == ran["full"][2].split("revision")[0]


def test_digest_bytes_is_the_digest_form(world):
    """The state store's streamed encoding is byte for byte the digest form."""
    import hashlib

    from reconciler.compile import digest_bytes, digest_form

    inv, cfg, cd = world
    rs = compile_oneshot(inv, cfg, cd).ruleset
    body = digest_bytes(rs)
    assert body == digest_form(ruleset_to_json(rs))
    assert hashlib.sha256(body).hexdigest() == digest(rs)
    assert ruleset_from_json(json.loads(body)) == rs


@pytest.mark.parametrize("row", [
    ["ip", "c", "m", 0], ["ip", "c", "m", 0, 1, 2], ("ip", "c", "m", 0, 1), ["ip", "c", 3, 0, 1],
    ["ip", None, "m", 0, 1], ["ip", "c", "m", "0", 1], ["ip", "c", "m", 0, True], ["ip", "c", "m", 0.0, 1], "row",
])
def test_a_malformed_memo_allocation_row_is_not_used(row):
    """A compiled.json allocation row of the wrong shape: the caller reads the ruleset's
    chains instead (None), never a half-read allocation."""
    good = ["ip", "svc-x/tcp/80", "endpoint-dnat-tcp-01", 8, 2]
    assert _memo_allocation({"allocation": [good]}) == {("ip", "svc-x/tcp/80"): ("endpoint-dnat-tcp-01", 8, 2)}
    assert _memo_allocation({"allocation": [good, row]}) is None
    assert _memo_allocation({"allocation": "x"}) is None and _memo_allocation({}) is None
