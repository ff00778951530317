"""`oci://` wherever a manifest directory is accepted: `validate`, `render`, `plan`, `apply`
and `diff` against a real registry on loopback (tests/ociregistry.py) and the real kernel in
a throwaway namespace. The revision shown is the artifact's name; a source failure is a
clear exit 1 that changes nothing; one-shot commands never move the store's `current`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nsutil import EXAMPLES
from ociregistry import push_artifact, registry, tls_registry  # noqa: F401 (fixtures)
from test_cli_kernel import CONFIG, listing, nftrec, ok

pytestmark = pytest.mark.kernel

EDGE = EXAMPLES / "edge-small"
REVISION = "main@sha1:0123456789abcdef0123456789abcdef01234567"


def tree_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def without_service(files: dict[str, bytes], name: str) -> dict[str, bytes]:
    """edge-small with Service `name` (and its slices) dropped: documents split on '---'."""
    out = {}
    for path, data in files.items():
        docs = data.decode().split("\n---\n")
        kept = [d for d in docs if f"name: {name}\n" not in d and f"kubernetes.io/service-name: {name}\n" not in d]
        out[path] = "\n---\n".join(kept).encode()
    return out


def node_config(tmp_path: Path, extra: str = "oci:\n  insecure: true\n") -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(CONFIG.read_text() + extra)
    return path


def name_of(digest: str, revision: str = REVISION) -> str:
    return f"{revision}@{digest}"


@pytest.fixture
def edge(registry, tmp_path):  # noqa: F811
    """edge-small pushed as `edge:v1`, and without Service `dns` as `edge:v2`."""
    files = tree_files(EDGE)
    assert b"name: dns\n" in b"".join(files.values())
    v1 = push_artifact(registry.host, "team/edge", "v1", files)
    v2 = push_artifact(registry.host, "team/edge", "v2", without_service(files, "dns"),
                       revision="main@sha1:89abcdef0123456789abcdef0123456789abcdef")
    return registry, v1, v2


def test_apply_a_tag_then_a_digest_applies_each_and_names_it(edge, tmp_path, netns):
    reg, v1, v2 = edge
    state, cfg = tmp_path / "state", node_config(tmp_path)
    p = ok(nftrec("plan", reg.ref("team/edge", "v1"), "--detailed-exitcode", state=state, ns=netns, config=cfg), 2)
    assert "dns" in p.stdout
    ok(nftrec("apply", reg.ref("team/edge", "v1"), state=state, ns=netns, config=cfg))
    assert "dns" in listing(netns)
    st = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=netns, config=cfg)).stdout)
    assert st["lastAppliedRevision"] == name_of(v1)
    ok(nftrec("plan", reg.ref("team/edge", "v1"), "--detailed-exitcode", state=state, ns=netns, config=cfg))

    ok(nftrec("apply", reg.ref("team/edge", digest=v2), state=state, ns=netns, config=cfg))
    assert "dns" not in listing(netns)
    st = json.loads(ok(nftrec("status", "-o", "json", state=state, ns=netns, config=cfg)).stdout)
    assert st["lastAppliedRevision"] == name_of(v2, "main@sha1:89abcdef0123456789abcdef0123456789abcdef")
    # one-shot commands fetch into the namespace's store but never publish `current`
    assert not list(state.rglob("current"))
    assert sorted(p.name for p in state.rglob("sha256-*") if p.is_dir()) == sorted(
        d.replace(":", "-") for d in (v1, v2))


def test_validate_and_render_need_no_writable_state_dir(edge, tmp_path):
    reg, v1, _ = edge
    temp = tmp_path / "tmp"
    temp.mkdir()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    env = {"TMPDIR": str(temp)}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        p = ok(nftrec("validate", reg.ref("team/edge", "v1"), "-o", "json", state=blocked / "state",
                      config=node_config(tmp_path)))
        doc = json.loads(p.stdout)
        assert doc["valid"] and doc["objects"] > 0 and doc["revision"] == name_of(v1)
        p = ok(nftrec("render", reg.ref("team/edge", "v1"), state=blocked / "state", config=node_config(tmp_path)))
        assert "dns" in p.stdout
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert list(temp.iterdir()) == []  # the private copy is gone


def test_trace_reads_an_artifact(edge, tmp_path):
    reg, _, _ = edge
    p = ok(nftrec("trace", reg.ref("team/edge", "v1"), "--src", "10.244.1.5", "--dst", "10.96.0.10", "--dport", "80",
                  state=tmp_path / "state", config=node_config(tmp_path)))
    assert "DNAT to 10.244.0.11:8080" in p.stdout and "service: default/web" in p.stdout, p.stdout


def test_diff_two_artifacts_and_an_artifact_against_a_directory(edge, tmp_path):
    reg, _, _ = edge
    state, cfg = tmp_path / "state", node_config(tmp_path)
    p = ok(nftrec("diff", reg.ref("team/edge", "v1"), reg.ref("team/edge", "v2"), "--detailed-exitcode",
                  state=state, config=cfg), 2)
    assert "dns" in p.stdout
    p = ok(nftrec("diff", str(EDGE), reg.ref("team/edge", "v1"), "--detailed-exitcode", state=state, config=cfg))
    p = ok(nftrec("diff", reg.ref("team/edge", "v2"), str(EDGE), "--detailed-exitcode", state=state, config=cfg), 2)
    assert "dns" in p.stdout


def test_source_errors_are_one_clear_line_and_change_nothing(edge, tmp_path, netns):
    reg, _, _ = edge
    state, cfg = tmp_path / "state", node_config(tmp_path)
    ok(nftrec("apply", reg.ref("team/edge", "v1"), state=state, ns=netns, config=cfg))
    before = listing(netns)
    (tmp_path / "strict").mkdir()
    cases = [
        (reg.ref("team/edge", "nope"), cfg, "not-found"),
        ("oci://" + reg.host + "/Team/Edge:v1", cfg, "bad-reference"),
        (reg.ref("team/edge", "v2"), node_config(tmp_path / "strict", ""), "insecure-refused"),
    ]
    for ref, config, reason in cases:
        p = ok(nftrec("apply", ref, state=state, ns=netns, config=config), 1)
        assert f"cannot fetch {ref} ({reason})" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1, p.stderr
    reg.stop()
    p = ok(nftrec("apply", reg.ref("team/edge", "v2"), state=state, ns=netns, config=cfg), 1)
    assert "(unreachable)" in p.stderr, p.stderr
    p = ok(nftrec("validate", reg.ref("team/edge", "v2"), state=state, config=cfg), 1)
    assert "(unreachable)" in p.stderr, p.stderr
    assert listing(netns) == before


def test_tls_with_a_test_ca_and_basic_auth_and_a_wrong_password(tls_registry, tmp_path):  # noqa: F811
    reg = tls_registry
    digest = push_artifact(reg.host, "team/edge", "v1", tree_files(EDGE), **reg.http)
    good = reg.credentials_file(tmp_path / "good.json")
    bad = reg.credentials_file(tmp_path / "bad.json", "not-the-password")
    for creds, rc in ((good, 0), (bad, 1)):
        cfg = node_config(tmp_path, f"oci:\n  caFile: {reg.ca_file}\n  credentialsFile: {creds}\n")
        p = ok(nftrec("validate", reg.ref("team/edge", "v1"), "-o", "json", state=tmp_path / "state", config=cfg), rc)
        if rc == 0:
            assert json.loads(p.stdout)["revision"] == name_of(digest)
        else:
            assert f"cannot fetch {reg.ref('team/edge', 'v1')} (auth)" in p.stderr and str(bad) in p.stderr, p.stderr
            assert "not-the-password" not in p.stderr and reg.password not in p.stderr
