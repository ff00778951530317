"""The intake cache (reconciler/intake/cache.py): the same problems and the same model as
an uncached read, cold and warm, under any path; keyed by content, not stat; damaged,
foreign and old entries ignored with a debug line and rebuilt; concurrent writers."""

from __future__ import annotations

import copy
import json
import logging
import multiprocessing
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.intake import cache as intake_cache
from reconciler.intake import input_digest, read_inventory, store
from reconciler.intake.inventory import load_manifests

from test_inventory_props import EXAMPLES, dump, manifests


def cached(root, cache_dir, *, strict: bool = False):
    return read_inventory(root, strict=strict, cache_dir=cache_dir)


def same(a, b) -> None:
    """Two InventoryResults are the same: problems, model (with sources), counts."""
    assert [p.to_json() for p in a.problems] == [p.to_json() for p in b.problems]
    assert a.inventory == b.inventory
    for x, y in ((a.inventory.services, b.inventory.services), (a.inventory.endpoint_slices, b.inventory.endpoint_slices),
                 (a.inventory.service_cidrs, b.inventory.service_cidrs)):
        assert [o.source for o in x] == [o.source for o in y]
    assert (a.documents, a.files, a.digest, a.inventory.revision) == (b.documents, b.files, b.digest, b.inventory.revision)


def entries(cache_dir: Path) -> list[Path]:
    return sorted(p for p in cache_dir.rglob("*.jsonl"))


# --- property: cached == uncached ------------------------------------------------------------

_BAD_VALUES = st.sampled_from(["x", -1, 0, 70000, [], {}, True, "10.0.0.01", "::g"])


@st.composite
def damaged(draw):
    """Generated manifests with random damage: fields removed or of the wrong value,
    duplicates, unknown kinds, Lists, unparsable and JSON files."""
    docs, _, _ = draw(manifests())
    docs = copy.deepcopy(docs)
    for _ in range(draw(st.integers(0, 4))):
        doc = docs[draw(st.integers(0, len(docs) - 1))]
        op = draw(st.sampled_from(["drop", "set", "dup", "unknown", "nodeport"]))
        node, parent, key = doc, None, None
        for _ in range(draw(st.integers(1, 3))):
            if isinstance(node, dict) and node:
                parent, key = node, draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                parent, key = node, draw(st.integers(0, len(node) - 1))
            else:
                break
            node = parent[key]
        if op == "drop" and isinstance(parent, dict):
            del parent[key]
        elif op == "set" and parent is not None:
            parent[key] = draw(_BAD_VALUES)
        elif op == "dup":
            docs.append(copy.deepcopy(doc))
        elif op == "unknown":
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
        elif op == "nodeport" and doc.get("kind") == "Service" and isinstance(doc.get("spec", {}), dict):
            # (an earlier "set" may have made spec a scalar)
            doc.setdefault("spec", {}).setdefault("ports", [{}])
    files = draw(st.integers(1, 3))
    layout = []
    for f in range(files):
        part = docs[f::files]
        how = draw(st.sampled_from(["yaml", "yaml", "json", "list"]))
        layout.append((f, part, how))
    garbage = draw(st.sampled_from([None, "a: [\n", "kind: Service\n\tx: 1\n", "- 1\n- 2\n", "\x00"]))
    strict = draw(st.booleans())
    return layout, garbage, strict


def write_tree(root: Path, layout, garbage) -> None:
    for f, part, how in layout:
        if not part:
            continue
        if how == "json":
            p = root / f"sub{f}" / f"m{f}.json"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(part[0], indent=1))
            if part[1:]:
                dump(root, f"sub{f}/rest{f}.yaml", part[1:])
        elif how == "list":
            dump(root, f"sub{f}/l{f}.yaml", [{"apiVersion": "v1", "kind": "List", "items": part}])
        else:
            dump(root, f"sub{f}/m{f}.yaml", part)
    if garbage is not None:
        (root / "zz-garbage.yaml").write_text(garbage)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_cached_reads_equal_uncached_reads_cold_warm_and_under_a_new_path(case):
    layout, garbage, strict = case
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cache_dir = d / "cache"
        one = d / "rev-1"
        write_tree(one, layout, garbage)
        expected = read_inventory(one, strict=strict)
        cold = cached(one, cache_dir, strict=strict)
        same(cold, expected)
        warm = cached(one, cache_dir, strict=strict)
        same(warm, expected)
        # git-sync: the same bytes in a new worktree, read through another path
        two = d / "rev-2"
        shutil.copytree(one, two)
        expected2 = read_inventory(two, strict=not strict)
        same(cached(two, cache_dir, strict=not strict), expected2)
        # no cache at all takes the same code path
        same(cached(one, None, strict=strict), expected)


def test_examples_cached_equal_uncached(tmp_path):
    for root in sorted(p for p in EXAMPLES.iterdir() if p.is_dir()) + [EXAMPLES]:
        expected = read_inventory(root)
        same(cached(root, tmp_path / "c"), expected)
        same(cached(root, tmp_path / "c"), expected)


def _fill_recording(path, cache):
    """cache._fill, noting which process stored the entry (a forked worker inherits it)."""
    (Path(os.environ["NFTREC_TEST_PIDS"]) / f"{os.getpid()}-{path[1].name}").touch()
    return _real_fill(path, cache)


_real_fill = intake_cache._fill


def test_a_cold_read_shared_with_forked_workers_equals_an_uncached_read(tmp_path, monkeypatch):
    """The misses of a cold read go partly to forked workers, which store their entries;
    the result is an uncached read's, and the cache then serves a warm read."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("NFTREC_TEST_PIDS", str(pids))
    monkeypatch.setattr(intake_cache, "MIN_PARALLEL", 2)
    monkeypatch.setattr(intake_cache.os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    monkeypatch.setattr(intake_cache, "_fill", _fill_recording)
    expected = read_inventory(EXAMPLES)
    same(cached(EXAMPLES, tmp_path / "c"), expected)
    workers = {p.name.split("-")[0] for p in pids.iterdir()}
    assert workers and str(os.getpid()) not in workers
    stored, by_workers = len(entries(tmp_path / "c")), len(list(pids.iterdir()))
    assert stored > by_workers  # this process stored its share too
    same(cached(EXAMPLES, tmp_path / "c"), expected)
    assert len(list(pids.iterdir())) == by_workers  # warm: no miss, nothing handed out
    assert len(entries(tmp_path / "c")) == stored


def _fill_dying(path, cache):
    os._exit(9)  # as the OOM killer would end a worker


def test_a_worker_that_dies_costs_only_its_share(tmp_path, monkeypatch):
    """A forked worker killed mid-read: this process parses what it did not store."""
    monkeypatch.setattr(intake_cache, "MIN_PARALLEL", 2)
    monkeypatch.setattr(intake_cache.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(intake_cache, "_fill", _fill_dying)
    same(cached(EXAMPLES, tmp_path / "c"), read_inventory(EXAMPLES))


def test_input_digest_equals_the_load_digest_without_parsing(tmp_path):
    for root in [EXAMPLES, EXAMPLES / "edge-small", tmp_path / "missing", EXAMPLES / "edge-small.config.yaml"]:
        loaded = load_manifests(root)
        d = input_digest(root)
        assert (d.digest, d.revision, d.files) == (loaded.digest, loaded.revision, loaded.files)


def test_a_trees_digest_and_revision_do_not_depend_on_how_its_root_is_named(tmp_path, monkeypatch):
    """A plain directory's revision is its files (paths inside the tree and bytes), as a
    Flux artifact's: the same tree named relatively, absolutely, with a trailing slash or
    through a link, or copied elsewhere, is one revision in every read path; a renamed
    file is another. A one-file root is its bytes."""
    from reconciler.intake.incremental import Intake

    tree = tmp_path / "a" / "m"
    shutil.copytree(EXAMPLES / "edge-small", tree)
    shutil.copytree(tree, tmp_path / "copy")
    (tmp_path / "link").symlink_to(tree)
    monkeypatch.chdir(tmp_path / "a")
    names = ["m", "m/", "./m", str(tree), str(tmp_path / "link"), "../a/m", str(tmp_path / "copy")]
    digests = set()
    for name in names:
        read, loaded, inputs = read_inventory(name), load_manifests(name), input_digest(name)
        assert read.ok, read.problems
        warm, snap = cached(name, tmp_path / "c"), Intake(name).read()
        digests |= {(read.digest, read.inventory.revision), (loaded.digest, loaded.revision),
                    (inputs.digest, inputs.revision), (warm.digest, warm.inventory.revision),
                    (snap.digest, snap.revision)}
    assert len(digests) == 1, digests
    (digest, revision), = digests
    assert revision == f"sha256:{digest}"
    first = sorted(p for p in tree.rglob("*.yaml"))[0]
    first.rename(first.with_name("renamed-" + first.name))
    assert read_inventory("m").digest != digest
    one = tmp_path / "one.yaml"
    shutil.copy(first.with_name("renamed-" + first.name), one)
    shutil.copy(one, tmp_path / "other-name.yaml")
    assert read_inventory(str(one)).digest == read_inventory(str(tmp_path / "other-name.yaml")).digest


# --- keyed by content ------------------------------------------------------------------------


SVC = """apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"""


def test_an_edit_in_place_keeping_size_and_mtime_is_seen(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    f = root / "svc.yaml"
    f.write_text(SVC)
    st0 = f.stat()
    first = cached(root, tmp_path / "c")
    assert first.inventory.services[0].cluster_ips == ("10.96.0.10",)
    edited = SVC.replace("10.96.0.10", "10.96.0.20")
    assert len(edited) == len(SVC)
    with open(f, "r+") as fh:  # in place: same inode
        fh.write(edited)
    os.utime(f, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    st1 = f.stat()
    assert (st1.st_ino, st1.st_size, st1.st_mtime_ns) == (st0.st_ino, st0.st_size, st0.st_mtime_ns)
    again = cached(root, tmp_path / "c")
    assert again.inventory.services[0].cluster_ips == ("10.96.0.20",)
    same(again, read_inventory(root))


def test_same_bytes_under_a_new_path_hit_and_name_the_new_path(tmp_path, caplog):
    a = tmp_path / "rev-a"
    a.mkdir()
    (a / "svc.yaml").write_text(SVC.replace("port: 80", "port: 0"))  # an error with a position
    cached(a, tmp_path / "c")
    b = tmp_path / "rev-b"
    shutil.copytree(a, b)
    caplog.set_level(logging.DEBUG, logger="nftrec")
    res = cached(b, tmp_path / "c")
    assert "1 hit(s), 0 miss(es)" in caplog.text
    assert res.problems and all(p.file == str(b / "svc.yaml") for p in res.problems)
    same(res, read_inventory(b))


# --- damaged, foreign and old entries --------------------------------------------------------


def _one_entry(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "m"
    root.mkdir(exist_ok=True)
    (root / "svc.yaml").write_text(SVC)
    cached(root, tmp_path / "c")
    [entry] = entries(tmp_path / "c")
    return root, entry


def _flip_payload(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\n")
    return head + b"\n" + body.replace(b"10.96.0.10", b"10.96.0.11")


def _old_version(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\n")
    h = json.loads(head)
    h["nftrec"] = "0.0.0-old"
    return json.dumps(h).encode() + b"\n" + body


def _other_format(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\n")
    h = json.loads(head)
    h["format"] = 99
    return json.dumps(h).encode() + b"\n" + body


def _wrong_shape(raw: bytes) -> bytes:
    import hashlib

    body = b'null\n{"problems": [], "docs": [{"data": 1}]}'
    h = json.loads(raw.partition(b"\n")[0])
    h["sha256"] = hashlib.sha256(body).hexdigest()
    return json.dumps(h).encode() + b"\n" + body


@pytest.mark.parametrize("damage, why", [
    (lambda raw: raw[: len(raw) // 2], "checksum"),
    (lambda raw: b"", "no header"),
    (lambda raw: b"\x80\x81garbage\n\xff", "header is not JSON"),
    (_flip_payload, "checksum"),
    (_old_version, "written by nftrec '0.0.0-old'"),
    (_other_format, "format 99"),
    (_wrong_shape, "wrong shape"),
    (lambda raw: b"[1, 2]\n{}", "not a JSON object"),
], ids=["truncated", "empty", "binary", "flipped", "old-nftrec", "other-format", "wrong-shape", "list-header"])
def test_damaged_foreign_or_old_entries_are_ignored_with_a_debug_line_and_rebuilt(tmp_path, caplog, damage, why):
    root, entry = _one_entry(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(damage(good))
    caplog.set_level(logging.DEBUG, logger="nftrec")
    res = cached(root, tmp_path / "c")
    same(res, read_inventory(root))
    assert res.inventory.services[0].cluster_ips == ("10.96.0.10",)
    lines = [r for r in caplog.records if r.levelno == logging.DEBUG and "ignoring" in r.getMessage()]
    assert lines and why in lines[0].getMessage(), caplog.text
    assert entry.read_bytes() == good  # rebuilt


def test_an_entry_under_another_key_is_foreign(tmp_path, caplog):
    root, entry = _one_entry(tmp_path)
    other = tmp_path / "m2"
    other.mkdir()
    (other / "svc.yaml").write_text(SVC.replace("web", "api"))
    cached(other, tmp_path / "c")
    [e2] = [e for e in entries(tmp_path / "c") if e != entry]
    shutil.copy(entry, e2)  # web's entry under api's key
    caplog.set_level(logging.DEBUG, logger="nftrec")
    res = cached(other, tmp_path / "c")
    assert res.inventory.services[0].name == "api"
    assert "belongs to another key" in caplog.text


def test_a_read_only_cache_directory_is_not_an_error(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    (root / "svc.yaml").write_text(SVC)
    blocker = tmp_path / "c"
    blocker.write_text("a file where the cache directory should be")
    same(cached(root, blocker / "intake"), read_inventory(root))


def test_the_cache_is_pruned_to_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(intake_cache, "MAX_ENTRIES", 4)
    root = tmp_path / "m"
    root.mkdir()
    for i in range(10):
        (root / "svc.yaml").write_text(SVC.replace("web", f"web{i}"))
        cached(root, tmp_path / "c")
    assert len(entries(tmp_path / "c")) <= 4
    # the newest is still there and hits
    assert cached(root, tmp_path / "c").inventory.services[0].name == "web9"


# --- concurrency ---------------------------------------------------------------------------


def _reader(args) -> str:
    root, cache_dir = args
    res = cached(root, cache_dir)
    return json.dumps([p.to_json() for p in res.problems]) + repr(res.inventory)


def test_concurrent_processes_never_corrupt_the_cache(tmp_path):
    root = tmp_path / "m"
    for i in range(12):
        dump(root, f"f{i}.yaml", [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"s{i}-{j}"},
                                   "spec": {"clusterIP": f"10.96.{i}.{j + 1}", "ports": [{"port": 80}]}}
                                  for j in range(30)])
    cache_dir = tmp_path / "c"
    expected = read_inventory(root)
    ctx = multiprocessing.get_context("fork")
    for _ in range(2):  # cold (all write the same entries at once), then warm
        with ctx.Pool(4) as pool:
            out = pool.map(_reader, [(root, cache_dir)] * 8)
        assert len(set(out)) == 1
    for e in entries(cache_dir):
        store._check_entry(e.read_bytes(), e.stem)  # every entry is whole
    assert not [p for p in cache_dir.rglob(".*") if p.is_file()]  # no temp files left
    same(cached(root, cache_dir), expected)


def test_the_key_ignores_path_and_stat_but_not_bytes_or_parser():
    assert store.entry_key("yaml", b"a: 1\n") == store.entry_key("yaml", b"a: 1\n")
    assert store.entry_key("yaml", b"a: 1\n") != store.entry_key("yaml", b"a: 2\n")
    assert store.entry_key("yaml", b"{}") != store.entry_key("json", b"{}")


def test_the_code_digest_covers_python_and_the_parsing_libraries(monkeypatch):
    """An upgrade of Python, ruamel.yaml or jsonschema gives every cache entry a new key."""
    before = store.code_digest()
    versions = store.library_versions()
    assert {"python", "ruamel.yaml", "jsonschema"} <= set(versions) and all(versions[k] for k in ("python", "ruamel.yaml", "jsonschema"))
    for name in ("python", "ruamel.yaml", "jsonschema"):
        monkeypatch.setattr(store, "library_versions", lambda name=name: {**versions, name: versions[name] + ".1"})
        store.code_digest.cache_clear()
        assert store.code_digest() != before, name
    store.code_digest.cache_clear()


def test_decoded_model_objects_are_what_their_init_builds(tmp_path):
    """_model_in fills __dict__ directly (no frozen __init__): same fields in the same
    order, equal, same hash and repr, and still frozen."""
    import dataclasses

    from benchmix import mix

    mix.generate(tmp_path / "t", 30, 3)
    for src in (tmp_path / "t", EXAMPLES):
        cold = read_inventory(src).inventory
        cached(src, tmp_path / "c")
        warm = cached(src, tmp_path / "c").inventory
        objs = [*warm.services, *warm.endpoint_slices, *warm.service_cidrs]
        assert objs and len(warm.origins) >= len(objs)
        for a, b in zip(objs, [*cold.services, *cold.endpoint_slices, *cold.service_cidrs]):
            rebuilt = type(a)(**{f.name: getattr(a, f.name) for f in dataclasses.fields(a)})
            assert list(vars(a).items()) == list(vars(rebuilt).items())
            assert a == b == rebuilt and hash(a) == hash(rebuilt) and repr(a) == repr(b)
            with pytest.raises(dataclasses.FrozenInstanceError):
                a.name = "x"


def _docs(path: Path) -> list[str]:
    return path.read_text().split("---\n") if path.exists() else []


def _cross_file_edit(root: Path, rnd: random.Random, serial: int) -> None:
    """One random edit that other files' documents disagree with: a Service defined again
    in another file, a Service removed (its slices now point nowhere), a ClusterIP or
    nodePort claimed again from another file, a slice of a Service that does not exist,
    or a file put back as generated."""
    svc_files = sorted((root / "services").iterdir())
    a, b = rnd.sample(svc_files, 2)
    docs_a, docs_b = _docs(a), _docs(b)
    r = rnd.random()
    if r < 0.2 and docs_a:  # the same Service in another file
        docs_b.append(rnd.choice(docs_a))
    elif r < 0.4 and len(docs_a) > 1:  # a Service removed: its slices are left
        del docs_a[rnd.randrange(len(docs_a))]
    elif r < 0.6 and docs_a:  # another name, the same ClusterIP (and nodePort, if any)
        d = rnd.choice(docs_a)
        docs_b.append(re.sub(r"name: (svc-\d+)\n", rf"name: \1-again{serial}\n", d, count=1))
    elif r < 0.8:  # a slice of a Service nobody defines
        f = rnd.choice(sorted((root / "endpointslices").iterdir()))
        docs = _docs(f)
        i = rnd.randrange(len(docs))
        docs[i] = docs[i].replace("kubernetes.io/service-name: svc-", f"kubernetes.io/service-name: gone{serial}-", 1)
        f.write_text("---\n".join(docs))
    else:  # back to a file of the original tree
        shutil.copy(root.parent / "orig" / "services" / a.name, a)
        return
    a.write_text("---\n".join(docs_a))
    b.write_text("---\n".join(docs_b))


@pytest.mark.parametrize("seed", range(6))
def test_cross_file_problems_through_the_cache_equal_a_cold_read(tmp_path, seed):
    """Chained random edits that make documents of different files disagree: the cached
    read (unchanged files from the cache, edited ones parsed) reports exactly the
    problems, with file:line, and the model of a cold read without a cache."""
    from benchmix import mix

    mix.generate(tmp_path / "orig", 120, 2)
    for f in (tmp_path / "orig" / "services").iterdir():  # 4 smaller files of Services
        docs = _docs(f)
        for j in range(0, len(docs), 30):
            (tmp_path / "orig" / "services" / f"{f.stem}-{j:03d}.yaml").write_text("---\n".join(docs[j:j + 30]))
        f.unlink()
    root = tmp_path / "m"
    shutil.copytree(tmp_path / "orig", root)
    rnd = random.Random(seed)
    cached(root, tmp_path / "c")
    found = 0
    for serial in range(6):
        _cross_file_edit(root, rnd, serial)
        res = cached(root, tmp_path / "c")
        same(res, read_inventory(root))
        found += len(res.problems)
    assert found  # the edits did make documents of different files disagree


# --- summaries: an unchanged clean file's documents are not decoded --------------------------


def _clean_tree(root: Path) -> None:
    dump(root, "a.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "ns"},
         "spec": {"type": "NodePort", "clusterIP": "10.96.0.10",
                  "ports": [{"name": "http", "port": 80, "targetPort": "web", "nodePort": 30080}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "a-1", "namespace": "ns", "labels": {"kubernetes.io/service-name": "a"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
         "endpoints": [{"addresses": ["10.244.0.1"]}]}])
    dump(root, "b.yaml", [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "ns"},
         "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}}])


def test_a_clean_file_is_cached_as_its_summary_only(tmp_path):
    root = tmp_path / "m"
    _clean_tree(root)
    cached(root, tmp_path / "c")
    assert [e.read_bytes().split(b"\n")[2] for e in entries(tmp_path / "c")] == [b"null", b"null"]
    warm = cached(root, tmp_path / "c")
    same(warm, read_inventory(root))
    assert warm.problems == []
    # ... whose objects keep their origins (compile's per-Service tokens)
    assert all(id(o) in warm.inventory.origins for o in (*warm.inventory.services, *warm.inventory.endpoint_slices))


@pytest.mark.parametrize("edit, expect", [
    # a Service in the edited file claims the unchanged file's ClusterIP and port
    (lambda t: t.replace("10.96.0.11", "10.96.0.10"), "already claimed"),
    # the same NodePort
    (lambda t: t.replace("  clusterIP: 10.96.0.11\n", "  clusterIP: 10.96.0.11\n  type: NodePort\n")
     .replace("- port: 80\n", "- port: 81\n    nodePort: 30080\n"), "already used by"),  # names the other Service, no position
    # a duplicate of the unchanged file's Service
    (lambda t: t.replace("name: b\n", "name: a\n"), "defined twice"),
    # a problem in the edited file only (a slice of no Service): nothing to decode
    (lambda t: t + "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a-2, namespace: ns, "
     "labels: {kubernetes.io/service-name: gone}}\naddressType: IPv4\nports: [{name: web, port: 8080}]\nendpoints: []\n", None),
])
def test_a_problem_about_an_unchanged_summarized_file_equals_a_cold_read(tmp_path, edit, expect):
    """The cross-document checks report with positions in the unchanged file, read from
    its text: the problems are exactly a cold read's."""
    root = tmp_path / "m"
    _clean_tree(root)
    cached(root, tmp_path / "c")
    b = root / "b.yaml"
    b.write_text(edit(b.read_text()))
    res = cached(root, tmp_path / "c")
    same(res, read_inventory(root))
    if expect is not None:
        assert any(expect in p.message for p in res.problems), res.problems
    else:
        assert res.problems and all(p.file.endswith("b.yaml") for p in res.problems)


def test_a_damaged_summary_is_ignored_and_rebuilt(tmp_path, caplog):
    import hashlib

    root, entry = _one_entry(tmp_path)
    good = entry.read_bytes()
    head, _, body = good.partition(b"\n")
    _, _, payload = body.partition(b"\n")
    bad = b'[["Service", 1]]\n' + payload
    h = json.loads(head)
    h["sha256"] = hashlib.sha256(bad).hexdigest()
    entry.write_bytes(json.dumps(h).encode() + b"\n" + bad)
    caplog.set_level(logging.DEBUG, logger="nftrec")
    res = cached(root, tmp_path / "c")
    same(res, read_inventory(root))
    assert "wrong shape" in caplog.text
    assert entry.read_bytes() == good


def test_the_cross_view_holds_what_the_cross_checks_read():
    """validate.cross_view keeps every field the cross checks read (and drops the rest):
    the checks over the views find exactly the problems of the whole documents."""
    from reconciler.intake.validate import cross_view

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "labels": {"x": "y"}},
           "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.1"], "selector": {"a": "b"},
                    "externalIPs": ["192.0.2.1"], "ports": [{"name": "h", "port": 80, "nodePort": 30000, "appProtocol": "x"}]},
           "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP", "ports": []}]}, "conditions": []}}
    assert cross_view("Service", svc) == {
        "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.1"], "externalIPs": ["192.0.2.1"],
                 "ports": [{"name": "h", "port": 80, "nodePort": 30000}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP"}]}}}
    svc["metadata"]["annotations"] = {"probe.nftrec.io/readiness": "tcpSocket: {port: 80}"}
    assert cross_view("Service", svc) is None  # probes.check_ports reads the annotation
    sl = {"kind": "EndpointSlice", "metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "a", "o": "p"}},
          "addressType": "IPv4", "ports": [{"name": "h", "port": 1, "protocol": "UDP"}], "endpoints": [{"addresses": ["10.0.0.1"]}]}
    assert cross_view("EndpointSlice", sl) == {"metadata": {"labels": {"kubernetes.io/service-name": "a"}},
                                               "addressType": "IPv4", "ports": [{"name": "h", "protocol": "UDP"}]}
