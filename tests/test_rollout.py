"""The rollout rule (intake/rollout.py): fleet.yaml's `rollout` checked with file:line, a
node's wave (bucket = sha256(salt + nodeName) mod 100, stable and uniform), `decide`
against an independent model written here (random times, waves, holds and records),
named cases for each branch and its reason, and a revision's time (intake/revisiontime.py)
from a real git object store and a real OCI store's metadata.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.intake import oci
from reconciler.intake.fleet import Identity, Selector, parse_fleet
from reconciler.intake.revisiontime import RevisionTimeError, revision_time
from reconciler.intake.rollout import (HALTED, HELD, LOCAL_HOLD, OPEN, OUTCOMES, PAUSED, LocalHold, Record, Rollout,
                                       Wave, bucket, decide, opens_at, wave_of)
from reconciler.intake.signatures import Verdict

FLEET = "root/fleet.yaml"
HEAD = "apiVersion: nftrec/v1alpha1\nkind: Fleet\nlayers: [{path: base}]\n"
T0 = 1796551200.0  # 2026-12-06T10:00:00Z


def rollout_of(body: str) -> Rollout:
    fleet, problems = parse_fleet(FLEET, (HEAD + body).encode())
    assert problems == [] and fleet is not None, [str(p) for p in problems]
    assert fleet.rollout is not None
    return fleet.rollout


def problems_of(body: str) -> list[str]:
    fleet, problems = parse_fleet(FLEET, (HEAD + body).encode())
    assert fleet is None and problems
    return [str(p) for p in problems]


CANARY = """rollout:
  salt: "2026-12"
  interval: 30m
  maxFailures: 0
  waves:
  - {name: canary, selector: {matchLabels: {ring: canary}}}
  - {name: early, percent: 10}
  - {name: rest, percent: 100}
"""


# --- fleet.yaml's rollout ---------------------------------------------------------------------


def test_the_spec_example_is_read_whole():
    r = rollout_of(CANARY)
    assert r == Rollout((Wave("canary", Selector((("ring", "canary"),))), Wave("early", percent=10),
                         Wave("rest", percent=100)), 1800.0, "2026-12", 0, False, False, True)
    r = rollout_of("rollout:\n  interval: 90\n  paused: true\n  immediate: true\n  haltOnUnreachable: false\n"
                   "  waves: [{name: all, selector: {}}]\n")
    assert (r.interval, r.salt, r.max_failures, r.paused, r.immediate, r.halt_on_unreachable) == (90.0, "", None, True,
                                                                                                   True, False)


def test_a_fleet_without_rollout_has_none():
    fleet, problems = parse_fleet(FLEET, HEAD.encode())
    assert problems == [] and fleet is not None and fleet.rollout is None


@pytest.mark.parametrize("body, expected", [
    ("rollout: {interval: 30m}\n", "root/fleet.yaml:4:1: Fleet: rollout.waves: waves is required but missing"),
    ("rollout: {waves: [{name: a, percent: 100}]}\n", "root/fleet.yaml:4:1: Fleet: rollout.interval: interval is required"),
    ("rollout: {interval: 0s, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:21: Fleet: rollout.interval: must be longer than 0s"),
    ("rollout: {interval: .inf, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:21: Fleet: rollout.interval: must be at most 8760h"),
    ("rollout: {interval: 99999999999999999999h, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:21: Fleet: rollout.interval: must be at most 8760h"),
    ("rollout: {interval: soon, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:21: Fleet: rollout.interval: 'soon' is not a duration such as 30s"),
    ("rollout: {interval: 1m, waves: []}\n", "root/fleet.yaml:4:25: Fleet: rollout.waves: has 0 entries"),
    ("rollout: {interval: 1m, maxFailures: -1, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:38: Fleet: rollout.maxFailures: -1 is out of range"),
    ("rollout: {interval: 1m, maxFailures: '1', waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:38: Fleet: rollout.maxFailures: must be a whole number"),
    ("rollout: {interval: 1m, paused: yes, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:33: Fleet: rollout.paused: 'yes' is a boolean only to YAML 1.1; write true"),
    ("rollout: {interval: 1m, salt: 12, waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:31: Fleet: rollout.salt: must be a string"),
    ("rollout: {interval: 1m, wave: [], waves: [{name: a, percent: 100}]}\n",
     "root/fleet.yaml:4:25: Fleet: rollout.wave: unknown key 'wave'"),
    ("rollout: {interval: 1m, waves: [{name: Canary, percent: 100}]}\n",
     "root/fleet.yaml:4:40: Fleet: rollout.waves[0].name: 'Canary' is not a wave name: a DNS label"),
    ("rollout: {interval: 1m, waves: [{percent: 100}]}\n",
     "root/fleet.yaml:4:33: Fleet: rollout.waves[0].name: name is required"),
    ("rollout: {interval: 1m, waves: [{name: a, percent: 0}]}\n",
     "root/fleet.yaml:4:52: Fleet: rollout.waves[0].percent: 0 is out of range"),
    ("rollout: {interval: 1m, waves: [{name: a, percent: 101}]}\n",
     "root/fleet.yaml:4:52: Fleet: rollout.waves[0].percent: 101 is out of range"),
    ("rollout: {interval: 1m, waves: [{name: a, percent: 50.5}]}\n",
     "root/fleet.yaml:4:52: Fleet: rollout.waves[0].percent: must be a whole number"),
    ("rollout: {interval: 1m, waves: [{name: a}]}\n",
     "root/fleet.yaml:4:33: Fleet: rollout.waves[0]: has neither selector nor percent"),
    ("rollout: {interval: 1m, waves: [{name: a, percent: 5, selector: {}}]}\n",
     "root/fleet.yaml:4:33: Fleet: rollout.waves[0]: has both selector and percent"),
    ("rollout:\n  interval: 1m\n  waves:\n  - {name: a, percent: 10}\n  - {name: a, percent: 20}\n",
     "root/fleet.yaml:8:12: Fleet: rollout.waves[1].name: a is the name of waves[0] too"),
    ("rollout:\n  interval: 1m\n  waves:\n  - {name: a, percent: 20}\n  - {name: b, selector: {}}\n"
     "  - {name: c, percent: 10}\n", "root/fleet.yaml:9:24: Fleet: rollout.waves[2].percent: 10 is less than waves[0]'s 20"),
    ("rollout:\n  interval: 1m\n  waves:\n  - name: a\n    selector: {matchLabels: {ring: 'a b'}}\n",
     "root/fleet.yaml:8:36: Fleet: rollout.waves[0].selector.matchLabels.ring: 'a b' is not a label value"),
    ("rollout:\n  interval: 1m\n  waves:\n  - name: a\n    selector: {matchExpressions: [{key: ring, operator: In}]}\n",
     "root/fleet.yaml:8:35: Fleet: rollout.waves[0].selector.matchExpressions[0]: operator In needs at least one value"),
    ("rollout:\n  interval: 1m\n  waves:\n  - name: a\n    selector: {matchLabel: {}}\n",
     "root/fleet.yaml:8:16: Fleet: rollout.waves[0].selector.matchLabel: unknown key 'matchLabel'"),
])
def test_rollout_errors_name_file_line_and_field(body, expected):
    problems = problems_of(body)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_rollout_problem_is_reported_at_once():
    problems = problems_of("rollout:\n  interval: 0s\n  bogus: 1\n  waves:\n  - {name: a, percent: 50}\n"
                           "  - {name: a}\n  - {name: c, percent: 20}\n")
    assert [p.split(": ")[2] for p in problems] == ["rollout.interval", "rollout.bogus", "rollout.waves[1]",
                                                    "rollout.waves[1].name", "rollout.waves[2].percent"]


# --- waves ------------------------------------------------------------------------------------


def test_bucket_is_sha256_of_salt_and_name_mod_100():
    assert bucket("2026-12", "edge-017") == int(hashlib.sha256(b"2026-12edge-017").hexdigest(), 16) % 100 == 28
    assert (bucket("", "edge-017"), bucket("2026-12", "edge-7"), bucket("", "edge-7")) == (24, 0, 86)


def test_a_node_takes_the_first_wave_that_takes_it():
    r = rollout_of(CANARY)
    assert wave_of(r, CANARY_NODE) == 0  # its bucket (28) would put it in rest: the selector comes first
    by_bucket = {n: bucket("2026-12", n) for n in (f"edge-{i}" for i in range(200))}
    for name, b in by_bucket.items():
        assert wave_of(r, Identity(name, (("ring", "beta"),))) == (1 if b < 10 else 2), (name, b)
    nobody = Rollout((Wave("a", Selector((("ring", "x"),))), Wave("b", percent=5)), 60.0)
    assert {wave_of(nobody, Identity(n)) for n in by_bucket} == {1}  # a node no wave takes is in the last


def test_opens_at():
    r = rollout_of(CANARY)
    assert [opens_at(r, k, T0) for k in range(3)] == [T0, T0 + 1800, T0 + 3600]
    assert [opens_at(Rollout(r.waves, r.interval, immediate=True), k, T0) for k in range(3)] == [T0] * 3


NAMES = [f"edge-{i:03d}" for i in range(1000)]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(salt=st.text(max_size=20))
def test_waves_are_stable_for_a_salt_and_within_5_points_of_their_percent(salt):
    r = Rollout((Wave("canary", percent=10), Wave("early", percent=30), Wave("rest", percent=100)), 60.0, salt)
    waves = [wave_of(r, Identity(n)) for n in NAMES]
    again = Rollout(r.waves, 3600.0, salt, max_failures=2)  # only the salt and the waves decide
    assert waves == [wave_of(again, Identity(n, (("ring", "x"),))) for n in NAMES]
    for k, share in enumerate((10, 20, 70)):
        assert abs(waves.count(k) / 10 - share) <= 5, (salt, k, waves.count(k))


def test_another_salt_reshuffles_the_waves():
    r1 = Rollout((Wave("early", percent=50), Wave("rest", percent=100)), 60.0, "a")
    r2 = Rollout(r1.waves, 60.0, "b")
    moved = sum(wave_of(r1, Identity(n)) != wave_of(r2, Identity(n)) for n in NAMES)
    assert 400 <= moved <= 600  # about half: the two salts' buckets are independent


# --- decide: named cases ----------------------------------------------------------------------

NODE = Identity("edge-017", (("ring", "beta"),))  # bucket("2026-12", "edge-017") is 28: wave rest
EARLY_NODE = Identity("edge-006")  # bucket 6: wave early
CANARY_NODE = Identity("edge-017", (("ring", "canary"),))


def rec(node: str, wave: str, outcome: str, attempted: str = "R", time: float = T0, error: str = "") -> Record:
    return Record(node, (), wave, "Q", attempted, outcome, error, time)


def test_the_test_nodes_waves():
    r = rollout_of(CANARY)
    assert [wave_of(r, n) for n in (CANARY_NODE, EARLY_NODE, NODE)] == [0, 1, 2]


def test_a_wave_is_held_until_it_opens_and_open_from_then():
    r = rollout_of(CANARY)
    d = decide(r, NODE, "R", T0, T0 + 3599, applied_revision="Q")
    assert (d.state, d.wave, d.wave_index, d.opens_at) == (HELD, "rest", 2, T0 + 3600) and not d.apply
    assert d.reason == "held: wave rest opens at 2026-12-06T11:00:00Z"
    d = decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q")
    assert (d.state, d.apply, d.reason) == (OPEN, True, "open: wave rest opened at 2026-12-06T11:00:00Z")
    assert decide(r, CANARY_NODE, "R", T0, T0, applied_revision="Q").state == OPEN


def test_a_node_that_applied_nothing_applies_at_once():
    d = decide(rollout_of(CANARY), NODE, "R", T0, T0, applied_revision=None)
    assert (d.state, d.wave) == (OPEN, "rest") and "nothing applied yet" in d.reason


def test_the_applied_revision_stays_open():
    paused = rollout_of(CANARY.replace("maxFailures: 0", "paused: true"))
    assert decide(paused, NODE, "R", T0, T0, applied_revision="R").state == OPEN


def test_paused_holds_every_node():
    r = rollout_of(CANARY.replace("maxFailures: 0", "paused: true"))
    for node in (NODE, CANARY_NODE):
        d = decide(r, node, "R", T0, T0 + 10 * 3600, applied_revision="Q")
        assert (d.state, d.reason, d.opens_at) == (PAUSED, "paused: fleet.yaml's rollout.paused", None)


def test_immediate_opens_every_wave_and_skips_the_halt():
    r = rollout_of(CANARY.replace("maxFailures: 0", "maxFailures: 0\n  immediate: true"))
    d = decide(r, NODE, "R", T0, T0, applied_revision="Q", records=[rec("edge-7", "canary", "rolled-back")],
               records_error="unreachable")
    assert (d.state, d.reason) == (OPEN, "open: immediate")


def test_no_rollout_opens_everything():
    assert decide(None, NODE, "R", T0, 0.0, applied_revision="Q") == decide(None, NODE, "R", None, 0.0,
                                                                             applied_revision="Q")
    assert decide(None, NODE, "R", T0, 0.0, applied_revision="Q").state == OPEN


def test_an_unknown_revision_time_opens_the_wave_and_keeps_the_halt():
    r = rollout_of(CANARY)
    assert decide(r, NODE, "R", None, T0, applied_revision="Q").state == OPEN
    assert decide(r, NODE, "R", None, T0, applied_revision="Q", records=[rec("a", "canary", "failed")]).state == HALTED


def test_failures_of_earlier_waves_halt():
    r = rollout_of(CANARY)
    records = [rec("edge-003", "canary", "rolled-back", error="health check tcp 10.0.0.1:80 failed"),
               rec("edge-017", "early", "invalid"), rec("edge-020", "early", "applied"),
               rec("edge-500", "rest", "failed"), rec("edge-600", "early", "failed", attempted="P")]
    d = decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=records)
    assert (d.state, d.opens_at) == (HALTED, None)
    assert d.reason == "halted: 2 nodes of waves canary, early failed R: edge-003 (health check), edge-017 (invalid)"
    d = decide(r, EARLY_NODE, "R", T0, T0 + 3600, applied_revision="Q", records=records)
    assert (d.wave, d.reason) == ("early", "halted: 1 node of wave canary failed R: edge-003 (health check)")
    assert decide(r, CANARY_NODE, "R", T0, T0, applied_revision="Q", records=records).state == OPEN  # wave 0: no halt


def test_max_failures_is_a_budget():
    r = rollout_of(CANARY.replace("maxFailures: 0", "maxFailures: 1"))
    one = [rec("edge-003", "canary", "failed")]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=one).state == OPEN
    two = one + [rec("edge-004", "canary", "failed")]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=two).state == HALTED
    no_halt = rollout_of(CANARY.replace("  maxFailures: 0\n", ""))
    assert decide(no_halt, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=two, records_error="x").state == OPEN


def test_only_each_nodes_latest_record_counts():
    r = rollout_of(CANARY)
    recovered = [rec("edge-003", "canary", "applied", time=T0 + 60), rec("edge-003", "canary", "rolled-back", time=T0)]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=recovered).state == OPEN
    relapsed = [rec("edge-003", "canary", "applied", time=T0), rec("edge-003", "canary", "rolled-back", time=T0 + 60)]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=relapsed).state == HALTED
    moved_on = [rec("edge-003", "canary", "failed", time=T0), rec("edge-003", "canary", "applied", "S", time=T0 + 60)]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=moved_on).state == OPEN
    relabelled = [rec("edge-003", "canary", "failed", time=T0), rec("edge-003", "rest", "held", time=T0 + 60)]
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=relabelled).state == OPEN
    tie = [rec("edge-003", "canary", "applied"), rec("edge-003", "canary", "failed")]  # one second: the later counts
    assert decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records=tie).state == HALTED


def test_many_failed_nodes_are_counted_not_all_named():
    records = [rec(f"edge-{i:03d}", "canary", "failed") for i in range(25)]
    d = decide(rollout_of(CANARY), NODE, "R", T0, T0 + 3600, applied_revision="Q", records=records)
    assert d.reason.startswith("halted: 25 nodes of wave canary failed R: edge-000 (apply failed), ")
    assert d.reason.endswith("edge-009 (apply failed) and 15 more")


def test_a_hostile_node_name_in_a_record_is_escaped():
    d = decide(rollout_of(CANARY), NODE, "R", T0, T0 + 3600, applied_revision="Q",
               records=[rec("x\n[ok] all good", "canary", "failed")])
    assert d.state == HALTED and "\n" not in d.reason and "'x\\n[ok] all good'" in d.reason


def test_unreadable_records_halt_unless_told_otherwise():
    r = rollout_of(CANARY)
    d = decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records_error="git fetch: connection refused")
    assert d.state == HALTED
    assert d.reason == ("halted: cannot read the status records of earlier waves: git fetch: connection refused; "
                        "set rollout.haltOnUnreachable: false to go on without them")
    lax = rollout_of(CANARY.replace("maxFailures: 0", "maxFailures: 0\n  haltOnUnreachable: false"))
    assert decide(lax, NODE, "R", T0, T0 + 3600, applied_revision="Q", records_error="refused").state == OPEN
    assert decide(lax, NODE, "R", T0, T0 + 3600, applied_revision="Q", records_error="refused",
                  records=[rec("edge-003", "canary", "failed")]).state == HALTED  # what was read still counts
    assert decide(r, CANARY_NODE, "R", T0, T0, applied_revision="Q", records_error="refused").state == OPEN
    multi = decide(r, NODE, "R", T0, T0 + 3600, applied_revision="Q", records_error="fatal: unable to access\n  x: refused")
    assert "\n" not in multi.reason and "fatal: unable to access x: refused; set" in multi.reason


def test_a_local_hold_holds_until_it_ends():
    r = rollout_of(CANARY)
    hold = LocalHold("maintenance window", since=T0, until=T0 + 600)
    d = decide(r, CANARY_NODE, "R", T0, T0 + 599, applied_revision="Q", hold=hold)
    assert (d.state, d.wave, d.reason) == (LOCAL_HOLD, "canary",
                                           "held locally: maintenance window (until 2026-12-06T10:10:00Z)")
    assert decide(r, CANARY_NODE, "R", T0, T0 + 599, applied_revision=None, hold=hold).state == LOCAL_HOLD
    assert decide(r, CANARY_NODE, "R", T0, T0 + 600, applied_revision="Q", hold=hold).state == OPEN  # expired
    forever = decide(None, NODE, "R", T0, T0 + 10 ** 6, applied_revision="Q", hold=LocalHold(since=T0))
    assert (forever.state, forever.reason) == (LOCAL_HOLD, "held locally: no reason given (until `nftrec release`)")
    odd = decide(None, NODE, "R", T0, T0, applied_revision="Q", hold=LocalHold("disk\nswap\x1b[2J", since=T0))
    assert odd.reason == "held locally: disk swap\\x1b[2J (until `nftrec release`)"


# --- decide: against an independent model ------------------------------------------------------


def model(spec: dict | None, node: str, labels: dict, revision: str, revision_time, now: float, applied,
          hold, records: list, records_error) -> tuple[str, float | None]:
    """The rule as SPEC §2.4 states it, on plain dicts: (state, opening time when held)."""
    if hold is not None and (hold[1] is None or now < hold[1]):
        return LOCAL_HOLD, None
    if applied is None or applied == revision or spec is None:
        return OPEN, None
    if spec["paused"]:
        return PAUSED, None
    b = int(hashlib.sha256((spec["salt"] + node).encode()).hexdigest(), 16) % 100
    takes = [i for i, w in enumerate(spec["waves"])
             if ("ring" in w and labels.get("ring") == w["ring"]) or ("percent" in w and b < w["percent"])]
    k = takes[0] if takes else len(spec["waves"]) - 1
    if revision_time is None:  # no time to count from: the wave opens when the node sees the revision
        opening = now
    else:
        opening = revision_time if spec["immediate"] else revision_time + k * spec["interval"]
    if now < opening:
        return HELD, opening
    if k == 0 or spec["maxFailures"] is None or spec["immediate"]:
        return OPEN, None
    if records_error and spec["haltOnUnreachable"]:
        return HALTED, None
    earlier = [w["name"] for w in spec["waves"][:k]]
    latest = {r["node"]: r for r in sorted(records, key=lambda r: r["time"])}  # stable: of equal times the later wins
    failed = [r for r in latest.values() if r["wave"] in earlier and r["attempted"] == revision
              and r["outcome"] in ("failed", "rolled-back", "invalid")]
    return (HALTED, None) if len(failed) > spec["maxFailures"] else (OPEN, None)


RINGS = ("canary", "beta", "gamma")


@st.composite
def specs(draw):
    n = draw(st.integers(1, 4))
    percents = iter(sorted(draw(st.lists(st.integers(1, 100), min_size=n, max_size=n))))
    waves = []
    for i in range(n):
        w = {"name": f"w{i}"}
        if draw(st.booleans()):
            w["ring"] = draw(st.sampled_from(RINGS))
            next(percents)
        else:
            w["percent"] = next(percents)
        waves.append(w)
    return {"salt": draw(st.sampled_from(["", "2026-12", "x"])), "interval": draw(st.integers(1, 500)),
            "maxFailures": draw(st.none() | st.integers(0, 3)), "paused": draw(st.booleans()),
            "immediate": draw(st.booleans()), "haltOnUnreachable": draw(st.booleans()), "waves": waves}


def rollout_from(spec: dict) -> Rollout:
    """The spec as fleet.yaml, through parse_fleet: the model's input and decide's are one text."""
    waves = [f"  - {{name: {w['name']}, " + (f"selector: {{matchLabels: {{ring: {w['ring']}}}}}}}" if "ring" in w
                                             else f"percent: {w['percent']}}}") for w in spec["waves"]]
    budget = [] if spec["maxFailures"] is None else [f"  maxFailures: {spec['maxFailures']}"]
    return rollout_of("\n".join(["rollout:", f"  salt: '{spec['salt']}'", f"  interval: {spec['interval']}s",
                                 f"  paused: {str(spec['paused']).lower()}", f"  immediate: {str(spec['immediate']).lower()}",
                                 f"  haltOnUnreachable: {str(spec['haltOnUnreachable']).lower()}", *budget, "  waves:",
                                 *waves]) + "\n")


records_st = st.lists(st.fixed_dictionaries({
    "node": st.sampled_from([f"n{i}" for i in range(6)]), "wave": st.sampled_from(["w0", "w1", "w2", "w3", "other"]),
    "attempted": st.sampled_from(["R", "Q"]), "outcome": st.sampled_from(OUTCOMES), "time": st.integers(0, 5)}),
    max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.none() | specs(), node=st.sampled_from([f"edge-{i}" for i in range(20)]),
       ring=st.none() | st.sampled_from(RINGS), revision_time=st.none() | st.integers(0, 1000),
       now=st.integers(0, 3000), applied=st.sampled_from([None, "Q", "R"]),
       hold=st.none() | st.tuples(st.text(max_size=5), st.none() | st.integers(0, 3000)),
       records=records_st, records_error=st.sampled_from([None, "unreachable"]))
def test_decide_matches_the_model(spec, node, ring, revision_time, now, applied, hold, records, records_error):
    check_against_model(spec, node, ring, revision_time, now, applied, hold, records, records_error)


def check_against_model(spec, node, ring, revision_time, now, applied, hold, records, records_error):
    labels = {"ring": ring} if ring else {}
    rollout = None if spec is None else rollout_from(spec)
    d = decide(rollout, Identity(node, tuple(labels.items())), "R", revision_time, float(now), applied_revision=applied,
               hold=None if hold is None else LocalHold(hold[0], 0.0, hold[1]),
               records=[Record(r["node"], (), r["wave"], "Q", r["attempted"], r["outcome"], "", r["time"]) for r in records],
               records_error=records_error)
    state, opening = model(spec, node, labels, "R", revision_time, now, applied, hold, records, records_error)
    assert d.state == state
    assert d.apply == (state == OPEN)
    if state == HELD:
        assert d.opens_at == opening and d.reason.startswith(f"held: wave {d.wave} opens at ")
    if rollout is not None:
        assert d.wave == rollout.waves[d.wave_index].name and d.wave_index == wave_of(rollout, Identity(node, tuple(labels.items())))
    prefix = {OPEN: "open", HELD: "held: ", PAUSED: "paused: ", LOCAL_HOLD: "held locally: ", HALTED: "halted: "}[state]
    assert d.reason.startswith(prefix) or (state == OPEN and d.reason == "" and rollout is None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), node=st.sampled_from([f"edge-{i}" for i in range(20)]), ring=st.none() | st.sampled_from(RINGS),
       records=st.lists(st.fixed_dictionaries({
           "node": st.sampled_from(["n0", "n1", "n2"]), "wave": st.sampled_from(["w0", "w1", "w2", "other"]),
           "attempted": st.sampled_from(["R", "R", "Q"]), "outcome": st.sampled_from(OUTCOMES),
           "time": st.integers(0, 3)}), max_size=8),
       records_error=st.sampled_from([None, "unreachable"]))
def test_the_halt_matches_the_model(spec, node, ring, records, records_error):
    """The halt alone: the wave open, nothing else holding, many records of few nodes."""
    spec = dict(spec, paused=False, immediate=False, maxFailures=spec["maxFailures"] or 0)
    check_against_model(spec, node, ring, 0, 10 ** 6, "Q", None, records, records_error)


# --- a revision's time ------------------------------------------------------------------------


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.invalid",
           "GIT_COMMITTER_NAME": "c", "GIT_COMMITTER_EMAIL": "c@example.invalid"}
    if date:
        env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = date
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_a_commits_time_is_its_committer_time_from_the_object_store(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "svc.yaml").write_text("kind: Service\n")
    git(repo, "add", "svc.yaml")
    git(repo, "commit", "-qm", "one", date="2026-12-06T10:00:00+02:00")
    commit = git(repo, "rev-parse", "HEAD")
    assert revision_time(repo, commit) == T0 - 7200
    assert revision_time(repo, f"{commit}+dirty:sha256:{'0' * 64}") == T0 - 7200
    # git-sync's layout: a linked worktree named after the commit, read through `current`
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "wt" / commit), commit)
    (tmp_path / "current").symlink_to(tmp_path / "wt" / commit)
    assert revision_time(tmp_path / "current", commit) == T0 - 7200
    # a shallow clone (git-sync's --depth 1) holds the commit
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", "shallow")
    assert revision_time(tmp_path / "shallow", commit) == T0 - 7200
    with pytest.raises(RevisionTimeError, match=f"cannot read the time of commit {'f' * 12}"):
        revision_time(repo, "f" * 40)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(RevisionTimeError, match="is not in a git checkout"):
        revision_time(plain, commit)
    assert revision_time(plain, f"sha256:{'1' * 64}") is None  # a plain directory's revision has no time


def test_a_verified_revision_takes_its_signed_time(tmp_path):
    signed = Verdict("c" * 40, True, time=int(T0))
    assert revision_time(tmp_path, "c" * 40, signed) == T0  # not read again: the verdict's is the signed one
    refused = Verdict("c" * 40, False, reason="unsigned", time=int(T0))
    with pytest.raises(RevisionTimeError):
        revision_time(tmp_path, "c" * 40, refused)


REF = oci.parse_reference("oci://127.0.0.1:5000/team/app:v1")


def stored(store: Path, digest: str, created: str) -> Path:
    """An artifact's tree in `store` with its metadata, as oci.pull leaves it."""
    tree = oci.open_store(store) / oci.tree_name(digest)
    tree.mkdir()
    (tree / "web.yaml").write_text("kind: Service\n")
    oci.write_metadata(tree, REF, digest, {oci.ANNOTATION_CREATED: created} if created else {}, ())
    return tree


def test_an_artifacts_time_is_its_created_annotation(tmp_path):
    digest = "sha256:" + "a" * 64
    tree = stored(tmp_path / "store", digest, "2026-12-06T11:00:00+01:00")
    assert revision_time(tree, f"abc@{digest}") == T0
    assert revision_time(tree, digest) == T0
    assert revision_time(tree, "sha256:" + "b" * 64) is None  # not this artifact: a plain directory's digest
    bare = stored(tmp_path / "store", "sha256:" + "c" * 64, "")
    assert revision_time(bare, "sha256:" + "c" * 64) is None
    for bad in ("2026-12-06 10:00", "yesterday", "2026-12-06T10:00:00"):
        odd = stored(tmp_path / bad.replace(" ", "_").replace(":", "_"), "sha256:" + "d" * 64, bad)
        with pytest.raises(RevisionTimeError, match="not an RFC 3339 time"):
            revision_time(odd, "sha256:" + "d" * 64)
