"""The kind of a source comes from the command line and the node config, never from what
lies in the tree: a checkout that holds a copied OCI store entry (a `sha256-<hex>` tree and
its metadata carrying a real cosign signature of a digest the organisation signed) is a git
checkout, verified by its commit; and `watch` with `verify` waits for git-sync's first clone.

Real git and SSH keys (ssh-keygen), a real cosign key pair (cryptography, as cosign signs),
nftrec as a subprocess in a throwaway namespace.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from cosignsign import new_key, payload, sign, write_public
from test_cli_kernel import nftrec, ok
from test_verify_signed import SERVICE, config, live_ips, needs_ssh, ssh_setup, status

pytestmark = [pytest.mark.kernel, needs_ssh]


def copy_store_entry(root: Path, key, ip: str) -> Path:
    """What an attacker commits: a tree named after a digest the organisation signed, with
    the store's metadata for it in both layouts (beside the tree, inside it), carrying
    that digest's real cosign signature; its Service is the attacker's."""
    digest = "sha256:" + hashlib.sha256(b"an artifact the organisation signed").hexdigest()
    data = payload(digest, "registry.example/fleet/manifests")
    meta = json.dumps({"kind": "nftrec.oci-artifact/v1", "reference": f"oci://registry.example/fleet/manifests@{digest}",
                       "digest": digest, "annotations": {"org.opencontainers.image.created": "2030-01-01T00:00:00Z"},
                       "signatures": [{"payload": base64.b64encode(data).decode(), "signature": sign(key, data),
                                       "annotations": {}}],
                       "signaturesFetched": True, "pulled": "2030-01-01T00:00:00Z"})
    tree = root / digest.replace(":", "-")
    tree.mkdir()
    (tree / "web.yaml").write_text(SERVICE.format(ip=ip))
    (tree / ".nftrec-artifact.json").write_text(meta)
    (root / f"{tree.name}.json").write_text(meta)
    return tree


def test_a_commit_holding_a_copied_oci_store_entry_is_verified_as_a_commit(tmp_path, netns):
    from reconciler.intake import input_digest

    ops, repo, _ = ssh_setup(tmp_path)
    cosign = new_key()
    ssh_pub, pem = Path(f"{ops}.pub"), write_public(cosign, tmp_path / "cosign.pub")
    entry = copy_store_entry(repo.src, cosign, "10.96.0.66").name
    unsigned = repo.commit("10.96.0.10", sign=False)  # commits the entry too
    repo.publish(unsigned)
    root = repo.current / entry
    state = tmp_path / "state"
    # verify.keys holds the cosign key too: a PEM key for a git checkout is a configuration error
    both = config(tmp_path, ssh_pub, pem)
    p = nftrec("apply", str(root), state=state, ns=netns, config=both)
    assert p.returncode == 1 and "configuration error" in p.stderr and str(pem) in p.stderr, p.stdout + p.stderr
    assert "10.96.0.66" not in live_ips(netns)
    # with the SSH key alone: git's verifier, and the commit is unsigned
    cfg = config(tmp_path, ssh_pub)
    p = nftrec("apply", str(root), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unsigned)" in p.stderr, p.stdout + p.stderr
    assert "10.96.0.66" not in live_ips(netns)
    # a signed commit holding the same entry: applied, and named by its commit, not the artifact
    signed = repo.commit("10.96.0.11")
    repo.publish(signed)
    ok(nftrec("apply", str(root), state=state, ns=netns, config=cfg))
    assert "10.96.0.66" in live_ips(netns)
    assert status(state, netns, cfg)["lastAppliedRevision"] == signed
    assert input_digest(root).revision == signed  # without verify too: never named after the copied entry


def test_watch_with_verify_waits_for_the_first_checkout(tmp_path, netns):
    from watchproc import Watch

    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    assert not repo.current.exists()  # git-sync has not cloned yet
    w = Watch(netns, repo.current, cfg, state)
    try:
        w.wait(lambda: w.find("start"), what="watch to start")
        assert w.proc.poll() is None
        signed = repo.commit("10.96.0.10")
        repo.publish(signed)
        w.wait_sync(0)
        assert "10.96.0.10" in live_ips(netns)
        w.status(lambda st: st["lastAppliedRevision"] == signed)
        mark = len(w.lines)
        unsigned = repo.commit("10.96.0.11", sign=False)
        repo.publish(unsigned)
        line = w.wait_event("unverified", mark)
        assert line["revision"] == unsigned and line["reason"] == "unsigned"
        assert "10.96.0.11" not in live_ips(netns) and "10.96.0.10" in live_ips(netns)
    finally:
        assert w.stop() == 0
