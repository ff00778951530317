"""engine/sync.verify_touched: after a transaction, read back only what it wrote, and only
while the generation token proves that nobody else committed; else list everything.

Runs against the Fake (the logic), with a namespace cookie so kernel tokens exist; the
real-kernel path is covered by every `nftrec apply` in tests/test_cli_kernel.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.compile import compile_ruleset
from reconciler.compile.layout import hairpin_set
from reconciler.engine import CommandError, Target, commit, make_plan, touched_objects, verify_touched
from reconciler.intake import load_node_config, read_inventory
from reconciler.kernel import Fake, kernel_token, read_live

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TABLE = "nftrec"


def ruleset(tmp_path: Path, edit: bool):
    """edge-small's ruleset; with `edit`, default/web's terminating endpoint becomes ready."""
    m = tmp_path / ("edited" if edit else "orig")
    shutil.copytree(EXAMPLES / "edge-small", m)
    if edit:
        f = m / "endpointslices.yaml"
        text = f.read_text()
        old = "conditions: {ready: false, serving: true, terminating: true}"
        assert old in text
        f.write_text(text.replace(old, "conditions: {ready: true}", 1))
    config, problems = load_node_config(str(EXAMPLES / "edge-small.config.yaml"), discover=False)
    assert not [p for p in problems if p.is_error]
    inv = read_inventory(m)
    assert not [p for p in inv.problems if p.is_error]
    return compile_ruleset(inv.inventory, config)


@pytest.fixture
def applied(tmp_path):
    """A Fake holding edge-small, the edited ruleset, and a plan to it from a listing."""
    nft = Fake()
    first = ruleset(tmp_path, edit=False)
    nft.run(make_plan(first, read_live(nft, TABLE)).transaction)
    target = Target(None, TABLE, tmp_path / "state")
    second = ruleset(tmp_path, edit=True)
    token = kernel_token(nft)
    plan = make_plan(second, read_live(nft, TABLE))
    assert not plan.empty
    nft.full_listings, nft.object_listings = 0, []
    return nft, target, second, plan, token


def test_only_the_objects_the_transaction_wrote_are_read_back(applied):
    nft, target, desired, plan, token = applied
    plan, _ = commit(nft, TABLE, desired, plan, {}, from_memory=None)
    live, after = verify_touched(nft, target, desired, plan, token_before=token)
    assert live is None and after == kernel_token(nft) == token + 1
    assert nft.full_listings == 0
    touched = touched_objects(plan)
    # layout sharded: the new endpoint's element went into the port's shared map too
    # and its hairpin element into its address's shard of hairpin-connections, the
    # shard's first: the shard's set and chain are new, and the dispatch vmap got its element
    hairpin = hairpin_set("10.244.0.13")
    assert touched["ip"][0] == ["hairpin-0d", "service-SUSTUHLJ-default/web/tcp/http"]
    assert [s.name for s in touched["ip"][1]] == ["endpoint-dnat-tcp-12", hairpin, "hairpin-shards"]
    assert nft.object_listings == [("ip", ("hairpin-0d", "service-SUSTUHLJ-default/web/tcp/http"),
                                    ("endpoint-dnat-tcp-12", hairpin, "hairpin-shards"))]


def test_a_touched_object_that_differs_is_an_error(applied):
    """What nft stored is not what we meant (simulated: the chain is changed behind the
    token's back, as a misread rule would be)."""
    nft, target, desired, plan, token = applied
    plan, _ = commit(nft, TABLE, desired, plan, {}, from_memory=None)
    chain = nft.tables[("ip", TABLE)].chains["service-SUSTUHLJ-default/web/tcp/http"]
    chain.rules[:] = ["meta l4proto tcp"]
    with pytest.raises(CommandError, match="does not hold what the transaction wrote .*rules differ"):
        verify_touched(nft, target, desired, plan, token_before=token)


def test_another_commit_in_between_lists_and_compares_everything(applied):
    nft, target, desired, plan, token = applied
    plan, _ = commit(nft, TABLE, desired, plan, {}, from_memory=None)
    nft.gen += 1  # someone else committed (an empty transaction is enough)
    live, after = verify_touched(nft, target, desired, plan, token_before=token)
    assert live is not None and nft.full_listings == 2  # ip and ip6
    assert nft.object_listings == []
    # ... and what someone else changed is caught by that full comparison
    nft.tables[("ip", TABLE)].chains["services"].rules.append("meta mark set 0x1")
    with pytest.raises(CommandError, match="does not match the desired ruleset"):
        verify_touched(nft, target, desired, plan, token_before=token)


def test_a_recreated_table_is_verified_whole(tmp_path):
    nft = Fake()
    target = Target(None, TABLE, tmp_path / "state")
    desired = ruleset(tmp_path, edit=False)
    token = kernel_token(nft)
    plan = make_plan(desired, read_live(nft, TABLE))
    assert touched_objects(plan) is None
    plan, _ = commit(nft, TABLE, desired, plan, {}, from_memory=None)
    nft.full_listings = 0
    live, _ = verify_touched(nft, target, desired, plan, token_before=token)
    assert live is not None and nft.full_listings == 2
