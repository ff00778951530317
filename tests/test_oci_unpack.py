"""Hostile layers, pushed to a real docker-registry and pulled: traversal, absolute paths,
links, devices, FIFOs, a gzip bomb, too many files. Each is refused with the right reason,
and nothing is written outside the store (nor left inside it)."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from ociregistry import assert_refused, gzip_bomb, listing, push_artifact, registry, tar_gz, tar_gz_members  # noqa: F401

from reconciler.intake import unpack as unpack_module
from reconciler.intake.model import OciSettings
from reconciler.intake.oci import SourceError, close_registries, parse_reference, pull, store_for

INSECURE = OciSettings(insecure=True)


@pytest.fixture(autouse=True)
def _fresh_clients():
    yield
    close_registries()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


def ok(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return member(name), b"kind: Service\n"


HOSTILE = {
    "traversal": ([ok("a.yaml"), (member("../../outside/evil.yaml"), b"x")], "'..'"),
    "nested-traversal": ([(member("sub/../../outside/evil.yaml"), b"x")], "'..'"),
    "absolute": ([(member("/tmp/evil.yaml"), b"x")], "absolute path"),
    "symlink-out": ([(member("link", tarfile.SYMTYPE, linkname="../../outside"), None),
                     (member("link/evil.yaml"), b"x")], "symbolic link"),
    "symlink-in": ([ok("a.yaml"), (member("b.yaml", tarfile.SYMTYPE, linkname="a.yaml"), None)], "symbolic link"),
    "hardlink-out": ([(member("h", tarfile.LNKTYPE, linkname="/etc/passwd"), None)], "hard link"),
    "device": ([(member("dev", tarfile.CHRTYPE), None)], "device"),
    "block": ([(member("blk", tarfile.BLKTYPE), None)], "device"),
    "fifo": ([(member("fifo", tarfile.FIFOTYPE), None)], "FIFO"),
    "twice": ([ok("a.yaml"), ok("a.yaml")], "second entry"),
    "file-then-dir": ([ok("a"), ok("a/b.yaml")], "a directory where the file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_layer_refused(registry, tmp_path, case):
    members, says = HOSTILE[case]
    (tmp_path / "outside").mkdir()
    push_artifact(registry.host, "m", case, layer=tar_gz_members(members), **registry.http)
    state = tmp_path / "deep" / "er" / "state"  # '../../outside' from the store is still inside tmp_path
    assert_refused("unsafe-archive", parse_reference(registry.ref("m", case)), INSECURE, state, tmp_path,
                   skip=registry.tmp, says=says)
    assert list((tmp_path / "outside").iterdir()) == []


def test_setuid_and_odd_modes_are_not_kept(registry, tmp_path):
    members = [(member("bin/tool.yaml", mode=0o4777), b"a: 1\n"), (member("bin", tarfile.DIRTYPE, mode=0o777), None),
               (member("./ro.yaml", mode=0o400), b"b: 2\n"), (member(".", tarfile.DIRTYPE), None)]
    push_artifact(registry.host, "m", "modes", layer=tar_gz_members(members), **registry.http)
    ref = parse_reference(registry.ref("m", "modes"))
    art = pull(ref, INSECURE, store_for(tmp_path, ref))
    modes = {str(p.relative_to(art.path)): oct(p.stat().st_mode & 0o7777) for p in art.path.rglob("*")}
    assert modes == {"bin": "0o755", "bin/tool.yaml": "0o644", "ro.yaml": "0o644", ".nftrec-artifact.json": "0o644"}


def test_gzip_bomb_stops_at_the_limit(registry, tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.tar.gz", 2 << 30)  # 2 GiB of zeros
    assert bomb.stat().st_size < 8 << 20
    push_artifact(registry.host, "m", "bomb", layer=bomb, **registry.http)
    bomb.unlink()
    e = assert_refused("too-large", parse_reference(registry.ref("m", "bomb")), INSECURE, tmp_path / "state", tmp_path,
                       skip=registry.tmp, says="bytes")
    assert str(unpack_module.MAX_BYTES) in e.message


def test_too_many_files(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(unpack_module, "MAX_ENTRIES", 2000)  # the real 100,000 costs 13 s here; same code path
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for i in range(unpack_module.MAX_ENTRIES + 1):
            tar.addfile(tarfile.TarInfo(f"d{i // 1000}/f{i}.yaml"))  # empty files
    push_artifact(registry.host, "m", "many", layer=buf.getvalue(), **registry.http)
    assert_refused("too-large", parse_reference(registry.ref("m", "many")), INSECURE, tmp_path / "state", tmp_path,
                   skip=registry.tmp, says=f"more than {unpack_module.MAX_ENTRIES} entries")


def test_not_a_tarball(registry, tmp_path):
    for tag, layer in (("text", b"just some text, not gzip"), ("truncated", tar_gz({"a.yaml": b"x" * 5000})[:-30])):
        push_artifact(registry.host, "m", tag, layer=layer, **registry.http)
        assert_refused("bad-artifact", parse_reference(registry.ref("m", tag)), INSECURE, tmp_path / "state", tmp_path,
                       skip=registry.tmp, says="not a readable tar.gz")


# --- the counting itself, on a local file (the limits made small) ------------------------------


def test_bytes_are_counted_while_writing(tmp_path):
    layer = tmp_path / "layer.tar.gz"
    layer.write_bytes(tar_gz({f"f{i}.yaml": b"x" * 1000 for i in range(10)}))
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(SourceError) as e:
        unpack_module.unpack(layer, store, "sha256-x", max_bytes=4500)
    assert e.value.reason == "too-large"
    assert listing(store) == set()
    with pytest.raises(SourceError) as e:
        unpack_module.unpack(layer, store, "sha256-x", max_entries=9)
    assert e.value.reason == "too-large" and listing(store) == set()
    tree = unpack_module.unpack(layer, store, "sha256-x", max_bytes=10_000, max_entries=10)
    want = {"sha256-x"} | {f"sha256-x/f{i}.yaml" for i in range(10)}
    assert listing(store) == want
    # unpacked again (as by a concurrent pull of the same digest): the first tree is kept, no temp left
    (tree / "f0.yaml").write_bytes(b"first")
    assert unpack_module.unpack(layer, store, "sha256-x") == tree
    assert listing(store) == want and (tree / "f0.yaml").read_bytes() == b"first"


def test_a_huge_tar_header_stops_at_its_budget(tmp_path):
    """A pax record of 64 MiB (64 kB gzipped): tarfile would read it whole into memory."""
    big = tarfile.TarInfo("web.yaml")
    big.pax_headers = {"comment": "x" * (64 << 20)}
    layer = tmp_path / "layer.tar.gz"
    layer.write_bytes(tar_gz_members([(big, b"kind: List\n")]))
    assert layer.stat().st_size < 1 << 20
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(SourceError) as e:
        unpack_module.unpack(layer, store, "sha256-x")
    assert e.value.reason == "too-large" and "tar header" in e.value.message
    assert listing(store) == set()
    # the same member with an ordinary header unpacks
    layer.write_bytes(tar_gz_members([(tarfile.TarInfo("web.yaml"), b"kind: List\n")]))
    assert (unpack_module.unpack(layer, store, "sha256-x") / "web.yaml").read_bytes() == b"kind: List\n"


def test_one_deep_path_is_refused_before_its_directories_exist(registry, tmp_path, monkeypatch):
    """An inode bomb: one member 1,500 directories deep (3 kB of name) would create all of
    them; refused at its header, no directory made."""
    made = []
    mkdir = unpack_module.os.mkdir
    monkeypatch.setattr(unpack_module.os, "mkdir", lambda p, *a, **k: (made.append(p), mkdir(p, *a, **k))[1])
    deep = [(member("a/" * 1500 + "web.yaml"), b"kind: Service\n")]
    push_artifact(registry.host, "m", "deep", layer=tar_gz_members(deep), **registry.http)
    assert_refused("unsafe-archive", parse_reference(registry.ref("m", "deep")), INSECURE, tmp_path / "state", tmp_path,
                   skip=registry.tmp, says="deeper than 64 directories")
    inside = [p for p in map(str, made) if "/.tmp-" in p]
    assert len(inside) <= 1, inside  # the store's temporary tree, nothing of the archive


def test_every_directory_created_counts_as_an_entry(tmp_path):
    """Parents made for a file count against the entry limit, as the file does."""
    layer = tmp_path / "layer.tar.gz"
    store = tmp_path / "store"
    store.mkdir()
    layer.write_bytes(tar_gz_members([(member(f"d{i}/" + "x/" * 19 + "web.yaml"), b"a: 1\n") for i in range(10)]))
    with pytest.raises(SourceError) as e:  # 10 files and 200 directories
        unpack_module.unpack(layer, store, "sha256-x", max_entries=100)
    assert e.value.reason == "too-large" and "more than 100 entries" in e.value.message
    assert listing(store) == set()
    layer.write_bytes(tar_gz_members([(member(f"d{i}/" + "x/" * 4 + "web.yaml"), b"a: 1\n") for i in range(10)]))
    unpack_module.unpack(layer, store, "sha256-x", max_entries=60)  # 10 files and 50 directories


def test_the_unpacked_size_is_100_mib_unless_oci_max_size_raises_it(registry, tmp_path):
    """256 MiB of zeros (a 256 kB layer): refused by default, nothing kept in the state
    directory; accepted with oci.maxSize: 300Mi."""
    from reconciler.intake import load_node_config

    bomb = gzip_bomb(tmp_path / "zeros.tar.gz", 256 << 20, name="zeros.yaml")
    push_artifact(registry.host, "m", "zeros", layer=bomb, **registry.http)
    bomb.unlink()
    ref = parse_reference(registry.ref("m", "zeros"))
    e = assert_refused("too-large", ref, INSECURE, tmp_path / "state", tmp_path, skip=registry.tmp,
                       says=f"more than {100 << 20} bytes")
    assert "zeros.yaml" in e.message
    cfg = tmp_path / "config.yaml"
    cfg.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n1\noci:\n  insecure: true\n  maxSize: 300Mi\n")
    settings = load_node_config(str(cfg), discover=False)[0].oci
    assert settings.max_size == 300 << 20
    art = pull(ref, settings, store_for(tmp_path / "state", ref))
    assert (art.path / "zeros.yaml").stat().st_size == 256 << 20
    cfg.write_text(cfg.read_text().replace("300Mi", "300MB"))
    problems = load_node_config(str(cfg), discover=False)[1]
    assert any(p.is_error and "maxSize" in p.field for p in problems), problems
