"""engine/verify.py: a cold `apply` (the transaction created the table) and `--verify full`
compare one listing with the desired ruleset by fingerprint, and still fail on any
difference.

Against the Fake (which has kernel tokens and counts its listings); the real kernel's
cold apply is every first `nftrec apply` in tests/test_cli_kernel.py and the data-plane
tests.
"""

from __future__ import annotations

import copy

import pytest

from reconciler.engine import CommandError, Target, commit, forgotten_affinity_ids, make_plan, touched_objects
from reconciler.engine.verify import expected, slim_created, verify_listed
from reconciler.kernel import Fake, fingerprint, kernel_token, read_live
from test_sync import TABLE, ruleset


@pytest.fixture
def cold(tmp_path):
    """A Fake after a cold apply of edge-small: (nft, target, desired, plan)."""
    nft = Fake()
    target = Target(None, TABLE, tmp_path / "state")
    desired = ruleset(tmp_path, edit=False)
    plan = make_plan(desired, read_live(nft, TABLE))
    plan, _ = commit(nft, TABLE, desired, plan, {}, from_memory=None)
    return nft, target, desired, plan


def test_a_created_table_is_verified_by_one_listing(cold):
    nft, target, desired, _ = cold
    nft.full_listings = 0
    live, token, fp = verify_listed(nft, target, desired)
    assert nft.full_listings == 2  # ip and ip6, once: the fingerprints agreed
    assert token == kernel_token(nft) and fp == fingerprint(live) == fingerprint(read_live(nft, TABLE))
    assert fp == expected(desired)[0]


def test_a_rule_that_differs_fails_verification(cold):
    """What nft stored is not what we meant (simulated: a rule changed after the commit)."""
    nft, target, desired, _ = cold
    nft.tables[("ip", TABLE)].chains["services"].rules.append("meta mark set 0x1")
    with pytest.raises(CommandError, match="does not match the desired ruleset .*services"):
        verify_listed(nft, target, desired)


def test_a_missing_element_fails_verification(cold):
    nft, target, desired, _ = cold
    elements = nft.tables[("ip", TABLE)].sets["cluster-ips"].elements
    elements.pop(next(iter(elements)))
    with pytest.raises(CommandError, match="does not match the desired ruleset .*cluster-ips"):
        verify_listed(nft, target, desired)


def test_typeof_is_compared_although_the_fingerprint_leaves_it_out(cold):
    nft, target, desired, _ = cold
    other = copy.deepcopy(desired)
    name, s = next((n, s) for n, s in other.tables["ip"].sets.items() if s.typeof)
    s.typeof = False
    assert expected(other)[0] == expected(desired)[0]  # the fingerprint cannot tell them apart
    with pytest.raises(CommandError, match=f"does not match the desired ruleset .*{name}"):
        verify_listed(nft, target, other)


def test_slim_created_keeps_what_is_read_after_the_commit(tmp_path):
    """A plan that creates its tables, slimmed before the commit, answers every question
    apply and watch ask after it as the whole plan does; any other plan is kept whole."""
    nft = Fake()
    desired = ruleset(tmp_path, edit=False)
    plan = make_plan(desired, read_live(nft, TABLE))
    slim = slim_created(plan)
    assert slim is not plan and len(plan.changes) > len(plan.changes.families) == len(slim.changes)
    assert touched_objects(slim) is touched_objects(plan) is None
    assert forgotten_affinity_ids(slim) == forgotten_affinity_ids(plan) == {}
    assert [(s.action, s.service, s.summary) for s in slim.services] == \
        [(s.action, s.service, s.summary) for s in plan.services] != []
    assert slim.transaction is plan.transaction and slim.desired is plan.desired and not slim.empty
    commit(nft, TABLE, desired, slim, {}, from_memory=None)
    edited = ruleset(tmp_path, edit=True)
    partial = make_plan(edited, read_live(nft, TABLE))
    assert not partial.empty and touched_objects(partial) is not None
    assert slim_created(partial) is partial
