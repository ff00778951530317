"""planfile.py: save/load round trip, 0600, clear errors, staleness and already-applied rules."""

from __future__ import annotations

import json

import pytest

from reconciler.engine import planfile
from reconciler.engine.planfile import PlanFileError, SavedPlan, already_applied, is_stale, load, save
from reconciler.compile.ruleset import Chain, Element, NamedSet, Rule, Ruleset, Table
from reconciler.compile.serialize import digest
from reconciler.engine.state import StateStore


def desired() -> Ruleset:
    t = Table("ip", "nftrec")
    t.chains["services"] = Chain("services", rules=(Rule("ip daddr . meta l4proto . th dport vmap @service-ips"),))
    s = NamedSet("service-ips", "ipv4_addr . inet_proto . inet_service", value_type="verdict")
    s.add(Element(("172.30.0.41", "tcp", "80"), value="goto svc-x"))
    t.sets["service-ips"] = s
    return Ruleset(tables={"ip": t}, owners={"ip element service-ips 172.30.0.41 . tcp . 80": "default/web"})


def make_plan(**kw) -> SavedPlan:
    args = dict(
        netns="host",
        table="nftrec",
        revision="9f1c2e",
        desired=desired(),
        live_fingerprint="fp-before",
        kernel_generation=12,
        transaction=["add element ip nftrec service-ips { 172.30.0.41 . tcp . 80 : goto svc-x }"],
        summary={"services": {"default/web": "+"}, "operations": 1},
    )
    args.update(kw)
    return SavedPlan.create(**args)


def test_round_trip(tmp_path):
    plan = make_plan()
    path = tmp_path / "web.plan"
    save(plan, path)
    back = load(path)
    assert back == plan
    assert back.desired_ruleset() == desired()
    assert back.desired_digest == digest(desired())
    assert len(back.plan_id) == 32 and back.created_at.endswith("Z")
    assert back.format_version == planfile.FORMAT_VERSION


def test_plan_ids_are_unique():
    assert make_plan().plan_id != make_plan().plan_id


def test_saved_mode_0600_and_atomic(tmp_path):
    path = tmp_path / "p.plan"
    path.write_text("old")
    path.chmod(0o644)
    save(make_plan(), path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["p.plan"]  # no temp file left
    doc = json.loads(path.read_text())
    assert doc["kind"] == "nftrec-plan" and doc["planId"] and len(doc["checksum"]) == 64


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(PlanFileError, match="does not exist; create it or choose another --out path"):
        save(make_plan(), tmp_path / "nope" / "p.plan")


def test_missing_file(tmp_path):
    path = tmp_path / "absent.plan"
    with pytest.raises(PlanFileError) as e:
        load(path)
    assert str(e.value) == f"no plan file at {path}: make a new plan with `nftrec plan --out {path}` first"
    assert e.value.path == path


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(PlanFileError, match="cannot read plan file .*check the path and permissions"):
        load(tmp_path)


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"", "not JSON"),
        (b'{"kind": "nftrec-plan", "formatVersion": 1', "not JSON"),
        (b"\x00\xff junk", "not JSON"),
        (b'{"formatVersion": 1}', "is not an nftrec plan file"),
        (b'["nftrec-plan"]', "is not an nftrec plan file"),
        (b'{"kind": "nftrec-plan", "formatVersion": 7}', "format version 7"),
    ],
)
def test_corrupt_or_foreign_files(tmp_path, content, expect):
    path = tmp_path / "bad.plan"
    path.write_bytes(content)
    with pytest.raises(PlanFileError) as e:
        load(path)
    assert expect in str(e.value)
    assert str(path) in str(e.value)


def test_truncated_file(tmp_path):
    path = tmp_path / "p.plan"
    save(make_plan(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PlanFileError, match="not JSON.*make a new plan"):
        load(path)


def test_hand_edited_transaction_is_refused(tmp_path):
    path = tmp_path / "p.plan"
    save(make_plan(), path)
    doc = json.loads(path.read_text())
    doc["transaction"].append("flush ruleset")
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError, match="changed or damaged after nftrec wrote it"):
        load(path)


def _rewrite_with_valid_checksum(path, mutate):
    doc = json.loads(path.read_text())
    mutate(doc)
    doc["checksum"] = planfile._checksum(doc)
    path.write_text(json.dumps(doc))


def test_desired_not_matching_digest_is_refused(tmp_path):
    path = tmp_path / "p.plan"
    save(make_plan(), path)
    _rewrite_with_valid_checksum(path, lambda d: d["desired"]["owners"].clear())
    with pytest.raises(PlanFileError, match="does not match its desiredDigest"):
        load(path)


def test_wrong_field_types_are_refused(tmp_path):
    path = tmp_path / "p.plan"
    save(make_plan(), path)
    _rewrite_with_valid_checksum(path, lambda d: d.update(kernelGeneration="12"))
    with pytest.raises(PlanFileError, match="field 'kernelGeneration' is missing or has the wrong type"):
        load(path)
    save(make_plan(), path)
    _rewrite_with_valid_checksum(path, lambda d: d.update(transaction=["ok", 3]))
    with pytest.raises(PlanFileError, match="list of nft command strings"):
        load(path)
    save(make_plan(), path)
    _rewrite_with_valid_checksum(path, lambda d: d["desired"].update(formatVersion=9))
    with pytest.raises(PlanFileError, match="desired ruleset in it is damaged"):
        load(path)


def test_is_stale():
    plan = make_plan(live_fingerprint="abc")
    assert not is_stale(plan, "abc")
    assert is_stale(plan, "abd")


def test_already_applied_via_state(tmp_path):
    store = StateStore(tmp_path)
    plan = make_plan()
    assert not already_applied(plan, store.status())  # fresh state
    store.record_applied(plan.revision, plan.desired_ruleset(), "fp-after", 13, plan_id=plan.plan_id)
    assert already_applied(plan, store.status())
    assert not already_applied(make_plan(), store.status())  # another plan of the same content
    store.record_applied("rev2", desired(), "fp-after", 14)  # a plain apply afterwards
    assert not already_applied(plan, store.status())


def test_verification_round_trips_and_plans_of_older_nftrecs_read_without_it(tmp_path):
    path = tmp_path / "p.plan"
    made = {"source": "/srv/git/current", "revision": "9f1c2e", "signer": "ops@example", "key": "SHA256:x",
            "time": 1778311900}
    save(make_plan(verification=made), path)
    assert load(path).verification == made
    save(make_plan(), path)
    _rewrite_with_valid_checksum(path, lambda d: d.pop("verification"))  # as an older nftrec wrote it
    assert load(path).verification is None
    for bad in ({**made, "time": "1778311900"}, {k: v for k, v in made.items() if k != "source"}, {**made, "key": None}):
        save(make_plan(verification=bad), path)
        with pytest.raises(PlanFileError, match="field 'verification'"):
            load(path)
