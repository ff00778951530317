"""Rule bodies as nft lists them pass nftrec's safety check and apply again. A history
entry adopted from the kernel (a watch that stopped before recording its commit) holds
the listing's spellings (`meta mark set meta mark | 0x00004000`), and `apply --rollback`
sends them back to nft. Hypothesis builds rulesets of both layouts and families, loads
each in a namespace, lists it with libnftables and re-applies the listing from nothing;
the captured listings of other nft versions are checked without a kernel."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from nsutil import EXAMPLES, in_ns
from reconciler.compile import Ruleset
from reconciler.compile.render import render_script
from reconciler.compile.ruleset import NftSyntaxError, check_rule_body
from reconciler.compile.services import compile_ruleset
from reconciler.kernel import Libnftables, fingerprint, parse_live, read_live
from test_kernel_accepts import configs, inventories, spellings

LISTINGS = Path(__file__).resolve().parent / "data" / "listings"
# CI-friendly default; a deeper local run: NFTREC_LISTED_EXAMPLES=200
MAX_EXAMPLES = int(os.environ.get("NFTREC_LISTED_EXAMPLES", "25"))


def _bodies(rs: Ruleset) -> list[str]:
    return [r.body for t in rs.tables.values() for c in t.chains.values() for r in c.rules]


@pytest.mark.kernel
@settings(max_examples=MAX_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(inventories(), configs(), spellings())
def test_listed_rules_pass_the_check_and_apply_again(netns, inventory, config, spelling):
    from reconciler.engine.plan import make_plan

    config = replace(config, spelling=spelling)
    nft = Libnftables(netns)
    try:
        nft.run_script("flush ruleset\n" + render_script(compile_ruleset(inventory, config)))
        listed = read_live(nft, config.table_name)
        for body in _bodies(listed):
            check_rule_body(body)
        # as `apply --rollback` to an adopted entry does it, on an empty namespace
        nft.run_script("flush ruleset\n")
        nft.run(make_plan(listed, Ruleset()).transaction)
        assert fingerprint(read_live(nft, config.table_name)) == fingerprint(listed)
    finally:
        nft.close()


@pytest.mark.parametrize("path", sorted(LISTINGS.glob("*/*.ip.nft")), ids=lambda p: f"{p.parent.name}-{p.name}")
def test_captured_listings_of_every_nft_pass_the_check(path):
    listed = parse_live({f: path.with_name(path.name.replace(".ip.", f".{f}.")).read_text() for f in ("ip", "ip6")},
                        "nftrec")
    bodies = _bodies(listed)
    assert any("|" in b for b in bodies)  # what this test is about: nft's spelling of `or`
    for body in bodies:
        check_rule_body(body)


@pytest.mark.parametrize("body", [
    'meta mark set meta mark | 0x4000 ; flush ruleset', "meta mark | 0x4000\nflush ruleset",
    'meta mark set meta mark | 0x4000 comment "x"', "ip daddr $evil accept", "accept # comment",
    "ip daddr & 0.0.0.63 vmap @x \\", "ip saddr 1.2.3.4  accept", "ip daddr 'x' accept",
])
def test_injected_syntax_is_still_refused(body):
    with pytest.raises(NftSyntaxError):
        check_rule_body(body)


@pytest.mark.kernel
def test_rollback_to_a_revision_adopted_from_the_kernel(netns, tmp_path):
    """A watch committed revision f…f and stopped before recording it; the next apply
    adopts the kernel's listing as its history entry; after the kernel lost the table,
    `apply --rollback` to that entry writes every listed rule again."""
    from reconciler.engine import Target, append_commit
    from reconciler.kernel import kernel_token
    from test_cli_kernel import copy_edge, listing, nftrec, ok

    state = tmp_path / "state"
    ok(nftrec("apply", str(EXAMPLES / "edge-small"), state=state, ns=netns))
    target = Target(netns, "nftrec", state)
    nft = target.nft()
    try:
        append_commit(target.store(), revision="f" * 40, writer="watch", kind="sync", token=kernel_token(nft),
                      operations=1, services=[], fingerprint=fingerprint(read_live(nft, "nftrec")))
    finally:
        nft.close()
    d = copy_edge(tmp_path)
    (d / "endpointslices.yaml").write_text((d / "endpointslices.yaml").read_text().replace("10.244.1.21", "10.244.9.9"))
    p = ok(nftrec("apply", str(d), state=state, ns=netns))
    assert "is in the history now" in p.stderr, p.stderr
    in_ns(netns, "nft", "delete", "table", "ip", "nftrec")
    p = ok(nftrec("apply", "--rollback", state=state, ns=netns))
    assert "ffffffffffff" in p.stdout, p.stdout
    assert "meta mark set meta mark | 0x00004000" in listing(netns)
    ok(nftrec("status", state=state, ns=netns))
