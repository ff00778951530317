"""plan.py: the diff grouped by Service, its one-line reasons and its JSON form.

Pure: desired and live are both compiled rulesets (live in canonical form, as
live.read_live returns it), so no kernel is needed here; the CLI/kernel tests cover the
same paths against a real namespace.
"""

from __future__ import annotations

import re

from dataclasses import replace

from reconciler.compile.services import compile_ruleset
from reconciler.kernel.live import canonical
from reconciler.engine.plan import format_text, make_plan, to_json
from reconciler.compile.ruleset import Ruleset
from _nft_samples import CONFIG, HAIRPIN_A, HAIRPIN_B, add_service, ep, epp, rich_inventory, sl, sp, svc


def _live(inv) -> Ruleset:
    return canonical(compile_ruleset(inv, CONFIG))


def test_nothing_to_do():
    inv = rich_inventory()
    plan = make_plan(compile_ruleset(inv, CONFIG), _live(inv))
    assert plan.empty and plan.services == [] and plan.shared == []
    assert "No changes" in format_text(plan)
    assert to_json(plan)["changed"] is False


def test_cold_start_lists_every_service_as_new_and_the_tables_as_shared():
    inv = rich_inventory()
    plan = make_plan(compile_ruleset(inv, CONFIG), Ruleset(), {s.key: s for s in inv.services})
    assert {s.action for s in plan.services} == {"+"}
    assert {s.service for s in plan.services} == {s.key for s in inv.services}
    text = format_text(plan)
    assert "+ ns1/one ClusterIP 172.30.0.41:80/TCP -> 1 endpoint" in text
    assert "+ ns4/empty NodePort 172.30.0.45:81/TCP -> no endpoints (reject)" in text
    assert "+ table ip (shared objects" in text and "+ table ip6 (shared objects" in text
    assert f"{len(plan.transaction)} nft operations" in text


def test_endpoint_edit_names_only_that_service_with_the_endpoint_delta():
    inv = rich_inventory()
    slices = [s for s in inv.endpoint_slices if s.service_key != "ns1/multi"]
    multi = next(s for s in inv.endpoint_slices if s.service_key == "ns1/multi")
    edited = replace(multi, endpoints=multi.endpoints[:1] + (ep("10.180.0.9"),) + multi.endpoints[2:])
    new_inv = replace(inv, endpoint_slices=tuple(slices + [edited]))
    plan = make_plan(compile_ruleset(new_inv, CONFIG), _live(inv))
    assert [s.service for s in plan.services] == ["ns1/multi"] and plan.shared == []
    (sc,) = plan.services
    assert sc.action == "~"
    assert "+10.180.0.9:5353" in sc.summary and "-10.180.0.2:5353" in sc.summary
    # layout sharded: the changed endpoint's index in the port's shared map is rewritten
    # (`delete element … endpoint-dnat-udp-0c { 1 }` names no address)
    assert all("ns1/multi" in op or "10.180.0" in op or " endpoint-dnat-" in op for op in plan.transaction.ops)


def test_removed_service_is_minus_and_json_lists_its_objects():
    inv = rich_inventory()
    gone = replace(inv, services=tuple(s for s in inv.services if s.key != "ns2/np"),
                   endpoint_slices=tuple(s for s in inv.endpoint_slices if s.service_key != "ns2/np"))
    plan = make_plan(compile_ruleset(gone, CONFIG), _live(inv))
    assert [(s.action, s.service) for s in plan.services] == [("-", "ns2/np")]
    doc = to_json(plan, netns="x", table="nftrec", revision="r1")
    assert doc["summary"] == {"add": 0, "change": 0, "remove": 1, "operations": len(plan.transaction)}
    assert doc["services"][0]["objects"] and all(o["action"] == "remove" for o in doc["services"][0]["objects"])
    assert doc["transaction"] == list(plan.transaction.ops) and doc["revision"] == "r1"
    assert "- ns2/np" in format_text(plan)


def test_new_service_among_existing_ones_is_plus_not_tilde():
    inv = rich_inventory()
    added = replace(inv, services=inv.services + (svc("ns9", "new", cips=("172.30.0.99",), ports=[sp(80)]),),
                    endpoint_slices=inv.endpoint_slices + (sl("ns9", "new", [ep("10.180.9.1")], [epp(80)]),))
    plan = make_plan(compile_ruleset(added, CONFIG), _live(inv), {s.key: s for s in added.services})
    assert [(s.action, s.service) for s in plan.services] == [("+", "ns9/new")]
    assert "-v" not in format_text(plan)
    verbose = format_text(plan, verbose=True)
    # the element is added through the set's declaration (changes.transaction_for)
    assert "Transaction:" in verbose and re.search(
        r"add set ip nftrec cluster-ips \{ type ipv4_addr ; comment \"[^\"]*\" ; elements = \{ 172\.30\.0\.99 \} ; \}", verbose)


def test_recreated_table_says_so_once_instead_of_listing_every_object():
    inv = rich_inventory()
    live = _live(inv)
    live.tables["ip"].comment = "someone else's"  # comments cannot change in place: re-create
    plan = make_plan(compile_ruleset(inv, CONFIG), live, {s.key: s for s in inv.services})
    text = format_text(plan)
    assert "~ table ip table comment \"someone else's\" is not nftrec's: re-created;" in text
    ip_only = [s for s in plan.services if all(c.family == "ip" for c in s.changes)]
    assert ip_only and all(s.summary == "rewritten with table ip" for s in ip_only), ip_only[0].summary
    assert plan.transaction.ops[0] == "delete table ip nftrec"


def test_hairpin_shard_is_listed_under_its_one_service_else_shared():
    """A hairpin shard created (or removed) with one Service's elements is that Service's
    in the text and the JSON; with two Services' it is a shared object (layout sharded)."""
    inv = rich_inventory()
    a, b = HAIRPIN_A, HAIRPIN_B
    shard = {("set", "hairpin-connections-28", None), ("chain", "hairpin-28", None), ("element", "hairpin-shards", ("0.0.0.40",))}

    def objects(changes):
        return {(o["kind"], o["name"], tuple(o["key"]) if o["key"] else None) for o in changes}

    for new, old in ((add_service(inv, *a), inv), (inv, add_service(inv, *a))):  # created, removed
        plan = make_plan(compile_ruleset(new, CONFIG), _live(old))
        doc = to_json(plan)
        assert [s["service"] for s in doc["services"]] == ["ns9/a"] and doc["shared"] == [], doc["shared"]
        assert shard <= objects(doc["services"][0]["objects"])
        assert "shared objects" not in format_text(plan)
    # two Services' elements: created (and removed) as shared objects, each element its Service's
    for new, old in ((add_service(add_service(inv, *a), *b), inv), (inv, add_service(add_service(inv, *a), *b))):
        plan = make_plan(compile_ruleset(new, CONFIG), _live(old))
        doc = to_json(plan)
        assert [s["service"] for s in doc["services"]] == ["ns9/a", "ns9/b"]
        assert objects(doc["shared"]) == shard
        assert not shard & objects(o for s in doc["services"] for o in s["objects"])
        sign = "+" if new is not inv else "-"
        assert f"~ table ip (shared objects {sign}3: hairpin-28, hairpin-connections-28, hairpin-shards)" in format_text(plan)
