"""`oci://` references: the grammar, the store's names, and the `oci:` node config section."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.intake import load_node_config
from reconciler.intake.oci import Artifact, Reference, SourceError, is_oci, parse_reference, store_for

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("text, want", [
    ("oci://127.0.0.1:5000/manifests:v1", Reference("127.0.0.1:5000", "manifests", "v1", None)),
    ("oci://registry.example/team/node-manifests:main", Reference("registry.example", "team/node-manifests", "main", None)),
    (f"oci://localhost:5000/a/b@sha256:{HEX}", Reference("localhost:5000", "a/b", None, f"sha256:{HEX}")),
    (f"oci://localhost/a__b.c-d:v1.2_3@sha256:{HEX}", Reference("localhost", "a__b.c-d", "v1.2_3", f"sha256:{HEX}")),
    ("oci://[::1]:5000/x:latest", Reference("[::1]:5000", "x", "latest", None)),
])
def test_parse_reference(text, want):
    ref = parse_reference(text)
    assert ref == want
    assert str(ref) == text
    assert is_oci(text)


@pytest.mark.parametrize("text, says", [
    ("/srv/manifests", "not an OCI reference"),
    ("oci://host", "no repository"),
    ("oci://host/repo", "no tag and no digest"),
    ("oci://host/Repo:v1", "not a repository name"),
    ("oci://host/a/../b:v1", "not a repository name"),
    ("oci://host//b:v1", "not a repository name"),
    ("oci://host/a:-v1", "not a tag"),
    ("oci://host/a:v1@sha256:abc", "not a digest"),
    (f"oci://host/a@sha512:{HEX}{HEX}", "not a digest"),
    ("oci://ho_st:5000/a:v1", "not a registry host"),
    ("oci://host:99999/a:v1", "not a registry host"),
    ("oci://host/a:v1;drop", "not a tag"),
])
def test_bad_references(text, says):
    with pytest.raises(SourceError) as e:
        parse_reference(text)
    assert e.value.reason == "bad-reference"
    assert says in e.value.message


def test_is_oci_only_for_strings():
    assert not is_oci(Path("oci://x/y:z"))
    assert not is_oci(None)
    assert not is_oci("manifests/")


def test_store_names_stay_in_the_state_directory(tmp_path):
    a = store_for(tmp_path, parse_reference("oci://127.0.0.1:5000/a:v1"))
    b = store_for(tmp_path, parse_reference("oci://127.0.0.1:5000/a/current:v1"))
    assert a == tmp_path / "oci" / "127.0.0.1_5000" / "a"
    assert b == tmp_path / "oci" / "127.0.0.1_5000" / "a+current"
    assert not str(b).startswith(str(a) + "/")


def test_artifact_name():
    ref = parse_reference("oci://h/r:t")
    d = f"sha256:{HEX}"
    assert Artifact(ref, d, "main@sha1:" + "1" * 40, "", "", Path("/x")).name == f"main@sha1:{'1' * 40}@{d}"
    assert Artifact(ref, d, "", "", "", Path("/x")).name == d


def test_node_config_oci_section(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("nodeName: n\noci:\n  interval: 90s\n  insecure: true\n  caFile: /ca.pem\n  credentialsFile: /c.json\n")
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):  # the second read comes from the cache
        cfg, problems = load_node_config(str(p), discover=False, cache_dir=cache)
        assert problems == []
        assert (cfg.oci.interval, cfg.oci.insecure, cfg.oci.ca_file, cfg.oci.credentials_file) == (90.0, True, "/ca.pem", "/c.json")
    p.write_text("nodeName: n\n")
    cfg, _ = load_node_config(str(p), discover=False)
    assert (cfg.oci.interval, cfg.oci.insecure, cfg.oci.ca_file) == (60.0, False, "")
    p.write_text("nodeName: n\noci:\n  interval: 0s\n")
    _, problems = load_node_config(str(p), discover=False)
    assert [(x.field, x.line) for x in problems] == [("oci.interval", 3)]
    p.write_text("nodeName: n\noci:\n  insecure: yes please\n")
    _, problems = load_node_config(str(p), discover=False)
    assert [x.field for x in problems] == ["oci.insecure"]


def test_every_reason_raised_is_a_known_metric_label():
    import re

    from reconciler.intake import SOURCE_ERROR_REASONS

    intake = Path(__file__).resolve().parent.parent / "reconciler" / "intake"
    raised = {m for f in intake.glob("*.py") for m in re.findall(r'SourceError\(\s*"([^"]+)"', f.read_text())}
    assert raised and raised <= set(SOURCE_ERROR_REASONS), raised - set(SOURCE_ERROR_REASONS)
