"""Which spellings the target's nft accepts (kernel/features.py): check transactions of
the compiler's exact texts, remembered per library, kernel and namespace."""

from __future__ import annotations

import json
import os
import sys

import pytest

from reconciler.engine.desired import nft_spelling
from reconciler.intake import NftSpelling
from reconciler.kernel import Fake, Libnftables, PROBE_TABLE, Spellings, probe_spelling
from reconciler.kernel import features
from reconciler.kernel import libnftables as nftmod
from nsutil import in_ns

COOKIE = "from reconciler.kernel import netns_cookie; print(netns_cookie())"


def test_the_fake_accepts_nftrecs_own_spelling():
    assert probe_spelling(Fake()) == NftSpelling()


@pytest.mark.kernel
def test_probe_is_a_dry_run_and_finds_what_this_nft_accepts(netns):
    with Libnftables(netns) as nft:
        spelling = probe_spelling(nft)
        version = nft.version()
    assert in_ns(netns, "nft", "list", "tables").stdout.strip() == ""  # nothing created
    assert PROBE_TABLE not in in_ns(netns, "nft", "list", "ruleset").stdout
    if tuple(int(x) for x in version.split(".")[:2]) >= (1, 0):
        # nft 1.0.6 and 1.1.3 take nftrec's own, on 5.10 too (nft 1.0.6 on Debian 11's kernel
        # under scripts/test-kernels: a probe that jumped to its own chain was refused there)
        assert spelling == NftSpelling(), (version, os.uname().release)
    else:
        assert spelling == NftSpelling(index_maps=False, shared_affinity=False), version  # 0.9.8


@pytest.mark.kernel
def test_remembered_per_namespace_and_library(netns, tmp_path, monkeypatch):
    monkeypatch.setattr(Spellings, "_memo", {})
    path = tmp_path / "nft-x.json"
    with Libnftables(netns) as nft:
        first = Spellings(path).get(nft)
        if nft.netns_cookie() is None:  # a kernel before 5.14: the namespace has no lasting name
            assert not path.exists() and Spellings._memo == {}
            return
        doc = json.loads(path.read_text())
        assert doc["spelling"] == {"index_maps": first.index_maps, "shared_affinity": first.shared_affinity}
        assert str(nft.netns_cookie()) in doc["key"] and features.library_identity() in doc["key"]
        # a later process (empty memo) reads the file; a forged answer proves it is not probed
        doc["spelling"] = {"index_maps": not first.index_maps, "shared_affinity": first.shared_affinity}
        path.write_text(json.dumps(doc))
        monkeypatch.setattr(Spellings, "_memo", {})
        assert Spellings(path).get(nft).index_maps is not first.index_maps
        # a damaged or foreign file is ignored: probed again, and rewritten
        monkeypatch.setattr(Spellings, "_memo", {})
        path.write_text('{"format": 1, "key": "x", "spelling": {"index_maps": "yes"}}')
        assert Spellings(path).get(nft) == first
        assert json.loads(path.read_text())["spelling"]["index_maps"] is first.index_maps


@pytest.mark.kernel
def test_a_remembered_answer_needs_no_context(netns, tmp_path, monkeypatch):
    """nft_spelling opens its own context only to probe; with an answer remembered for
    the namespace it opens none (a no-op plan pays a stat and a file read)."""
    monkeypatch.setattr(Spellings, "_memo", {})
    found = nft_spelling(netns, tmp_path, None)
    if in_ns(netns, sys.executable, "-c", COOKIE).stdout.strip() == "None":  # a kernel before 5.14
        assert not (tmp_path / f"nft-{netns}.json").exists()  # nothing to key it on: probed each time
        return
    assert (tmp_path / f"nft-{netns}.json").exists() and nftmod._contexts == 0
    monkeypatch.setattr(Spellings, "_memo", {})

    def no_context(self):
        raise AssertionError("a context was made")

    monkeypatch.setattr(nftmod.Libnftables, "_new_ctx", no_context)
    assert nft_spelling(netns, tmp_path, None) == found
