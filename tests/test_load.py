"""Manifest intake: directory walk, parsing, hostile input, positions, revision."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from reconciler.intake import load, parse
from reconciler.intake.inventory import load_manifests
from reconciler.intake.load import locate
from reconciler.intake.report import run_validate

SVC = """\
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  clusterIP: {ip}
  ports:
    - port: 80
"""


def write(root: Path, rel: str, text: str | bytes) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def validate(root: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    rc = run_validate(str(root), stream=out, **kw)
    return rc, out.getvalue()


def test_recursive_suffixes_hidden_and_multidoc(tmp_path):
    write(tmp_path, "a.yaml", SVC.format(name="a", ip="10.96.0.1") + "---\n" + SVC.format(name="b", ip="10.96.0.2"))
    write(tmp_path, "sub/deeper/c.yml", SVC.format(name="c", ip="10.96.0.3"))
    write(tmp_path, "d.json", '{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "d"}, '
                              '"spec": {"clusterIP": "10.96.0.4", "ports": [{"port": 80}]}}')
    write(tmp_path, "notes.txt", "kind: Service\n")  # not a manifest suffix
    write(tmp_path, ".git/x.yaml", "garbage: [")  # hidden: skipped
    write(tmp_path, ".tmp-123/e.yaml", "garbage: [")
    write(tmp_path, "sub/.hidden.yaml", "garbage: [")
    res = load_manifests(tmp_path)
    assert not res.problems
    names = sorted(d.data["metadata"]["name"] for d in res.documents)
    assert names == ["a", "b", "c", "d"]
    b = next(d for d in res.documents if d.data["metadata"]["name"] == "b")
    assert (b.source.line, b.source.col, b.index) == (10, 1, 1)


def test_list_items_expanded_with_positions(tmp_path):
    write(tmp_path, "l.yaml", "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Service\n"
                              "    metadata: {name: x}\n    spec: {clusterIP: 10.96.0.1, ports: [{port: 70000}]}\n")
    res = load_manifests(tmp_path)
    [doc] = res.documents
    assert doc.path == ("items", 0) and (doc.source.line, doc.source.col) == (4, 5)
    assert locate(doc, ("spec", "ports", 0, "port")) == (7, 49)
    rc, out = validate(tmp_path)
    assert rc == 1 and "l.yaml:7:49: Service default/x: spec.ports[0].port: 70000 is out of range" in out


def test_empty_directory_is_refused_unless_allowed(tmp_path):
    rc, out = validate(tmp_path)
    assert rc == 1 and "no Services in " in out and "--allow-empty" in out, out
    rc, out = validate(tmp_path, allow_empty=True)
    assert rc == 0
    assert "0 objects (empty directory)" in out


def test_missing_directory(tmp_path):
    rc, out = validate(tmp_path / "nope")
    assert rc == 1 and "does not exist" in out


def test_yaml_syntax_error(tmp_path):
    write(tmp_path, "bad.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "bad.yaml:4:1: YAML syntax error" in out and "fix the syntax" in out
    assert "Traceback" not in out


def test_duplicate_key(tmp_path):
    write(tmp_path, "dup.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  name: other\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "dup.yaml:5:3:" in out and "'name' appears twice" in out


def test_duplicate_key_in_json(tmp_path):
    write(tmp_path, "dup.json", '{"kind": "Service", "kind": "Service"}')
    rc, out = validate(tmp_path)
    assert rc == 1 and "dup.json" in out and "'kind' appears twice" in out


def test_list_document(tmp_path):
    write(tmp_path, "list.yaml", "- apiVersion: v1\n  kind: Service\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "list.yaml:1:1:" in out and "is a list, not a Kubernetes object" in out


def test_scalar_document(tmp_path):
    write(tmp_path, "s.yaml", SVC.format(name="a", ip="10.96.0.1") + "---\njust a string\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "s.yaml:10:1:" in out and "a single value ('just a string')" in out


def test_alias_bomb_refused_fast(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 12):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    # 9**12 nodes if expanded: refusing it at all proves nothing was expanded (no timing
    # assertion here; bench/ measures speed)
    rc, out = validate(tmp_path)
    assert rc == 1 and "bomb.yaml:1:1:" in out and "alias bomb" in out


def test_a_big_list_without_aliases_is_not_an_alias_bomb(tmp_path):
    """Plain values count as written, not as added by aliases: 1,500 Services in one
    `kind: List` (over 20,000 values) are fine."""
    items = "".join(
        f"  - apiVersion: v1\n    kind: Service\n    metadata: {{name: s{i}, labels: {{app: a{i}, tier: web}}}}\n"
        f"    spec:\n      clusterIP: 10.96.{i // 250}.{i % 250 + 1}\n"
        f"      ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]\n" for i in range(1500))
    write(tmp_path, "list.yaml", "apiVersion: v1\nkind: List\nitems:\n" + items)
    rc, out = validate(tmp_path)
    assert rc == 0 and "1500 objects, 0 errors" in out, out[-500:]
    # the same values reached through aliases still count as added by them
    write(tmp_path, "list.yaml", "apiVersion: v1\nkind: List\nx: &v [" + ",".join(["v"] * 2000) + "]\n"
          "items: []\ny: [" + ",".join(["*v"] * 6) + "]\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "alias bomb" in out


def test_small_alias_use_is_fine(tmp_path):
    write(tmp_path, "a.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  labels: &l {app: a}\n"
                              "  annotations: *l\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n")
    rc, out = validate(tmp_path)
    assert rc == 0, out


def test_recursive_alias(tmp_path):
    write(tmp_path, "r.yaml", "a: &x [*x]\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "r.yaml" in out and ("recursive" in out or "deeper" in out)


def test_file_over_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "MAX_FILE_BYTES", 1000)
    write(tmp_path, "big.yaml", SVC.format(name="a", ip="10.96.0.1") + "#" * 2000 + "\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "big.yaml:" in out and "over the 1000-byte limit" in out


def test_default_size_limit_is_8_mib():
    assert parse.MAX_FILE_BYTES == 8 * 1024 * 1024


def test_binary_junk(tmp_path):
    write(tmp_path, "junk.yaml", os.urandom(64) + b"\x00\xff")
    write(tmp_path, "latin1.yaml", "name: caf\xe9\n".encode("latin-1"))
    write(tmp_path, "ctl.yaml", b"a: b\x07c\n")
    rc, out = validate(tmp_path)
    assert rc == 1
    assert "junk.yaml: this file contains NUL bytes" in out
    assert "latin1.yaml:1:1: this file is not valid UTF-8" in out
    assert "ctl.yaml:1:5:" in out and "control character" in out


def test_deep_nesting_flow_and_block(tmp_path):
    n = 100_000  # would overflow libyaml's recursive composer if it got there
    write(tmp_path, "deep.yaml", "a: " + "[" * n + "]" * n + "\n")
    write(tmp_path, "deep.json", "[" * n + "]" * n)
    write(tmp_path, "block.yaml", "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v\n")
    write(tmp_path, "compact.yaml", "- " * 5000 + "x\n")
    rc, out = validate(tmp_path)
    assert rc == 1
    for f in ("deep.yaml:1:", "deep.json", "block.yaml", "compact.yaml:1:"):
        assert f in out
    assert out.count("nesting is deeper than") == 4


def test_symlink_outside_tree_refused(tmp_path):
    outside = write(tmp_path, "outside/secret.yaml", SVC.format(name="s", ip="10.96.0.9"))
    root = tmp_path / "manifests"
    write(root, "ok.yaml", SVC.format(name="a", ip="10.96.0.1"))
    (root / "leak.yaml").symlink_to(outside)
    (root / "leakdir").symlink_to(outside.parent)
    (root / "dangling.yaml").symlink_to(root / "missing.yaml")
    rc, out = validate(root)
    assert rc == 1
    assert f"{root}/leak.yaml: this symlink points outside the manifest tree" in out
    assert f"{root}/leakdir: this symlink points outside the manifest tree" in out
    assert f"{root}/dangling.yaml: this symlink is dangling" in out
    assert "Service default/s" not in out


def test_git_sync_layout(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    rev = tmp_path / "root" / f"rev-{sha}"
    write(rev, "svc.yaml", SVC.format(name="a", ip="10.96.0.1"))
    (rev / "zz-link.yaml").symlink_to(rev / "svc.yaml")  # inside the tree: allowed, read once
    (tmp_path / "root" / "current").symlink_to(rev.name)
    res = load_manifests(tmp_path / "root" / "current")
    assert not res.problems and res.revision == sha
    assert res.documents[0].file == f"{tmp_path}/root/current/svc.yaml"
    # the parent itself: the link and the directory are one revision, read once
    res = load_manifests(tmp_path / "root")
    assert len(res.documents) == 1 and not res.problems


def test_revision_from_git_files(tmp_path):
    sha = "89abcdef0123456789abcdef0123456789abcdef"
    repo = tmp_path / "repo"
    write(repo, ".git/HEAD", "ref: refs/heads/main\n")
    write(repo, ".git/packed-refs", f"# pack-refs\n{sha} refs/heads/main\n")
    write(repo, "k8s/svc.yaml", SVC.format(name="a", ip="10.96.0.1"))
    assert load_manifests(repo / "k8s").revision == sha
    # a linked worktree (git-sync v4): .git is a file pointing into the main repo
    wt_sha = "fedcba9876543210fedcba9876543210fedcba98"
    write(repo, f".git/worktrees/{wt_sha}/HEAD", wt_sha + "\n")
    write(repo, f".git/worktrees/{wt_sha}/commondir", "../..\n")
    wt = tmp_path / "wt"
    write(wt, ".git", f"gitdir: {repo}/.git/worktrees/{wt_sha}\n")
    write(wt, "svc.yaml", SVC.format(name="a", ip="10.96.0.1"))
    assert load_manifests(wt).revision == wt_sha


def test_revision_digest_without_git(tmp_path):
    d = tmp_path / "m"
    write(d, "a.yaml", SVC.format(name="a", ip="10.96.0.1"))
    r1 = load_manifests(d).revision
    assert r1.startswith("sha256:") and len(r1) == 7 + 64
    assert load_manifests(d).revision == r1
    write(d, "a.yaml", SVC.format(name="a", ip="10.96.0.2"))
    assert load_manifests(d).revision != r1


def test_custom_tags_refused(tmp_path):
    write(tmp_path, "t.yaml", "apiVersion: v1\nkind: Service\nmetadata: !!python/object:os.system {name: x}\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "t.yaml:3:" in out and "custom tags" in out


def test_non_string_keys(tmp_path):
    write(tmp_path, "k.yaml", "apiVersion: v1\nkind: Service\n1: x\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "k.yaml:1:1:" in out and "not a string" in out


# --- review of issue 2: odd-but-valid input and positions ---------------------------------


def test_empty_json_file_is_zero_documents(tmp_path):
    write(tmp_path, "empty.json", "")
    write(tmp_path, "blank.json", "  \n\n")
    write(tmp_path, "bom.json", b"\xef\xbb\xbf")
    rc, out = validate(tmp_path, allow_empty=True)
    assert rc == 0, out
    assert "0 objects" in out


def test_duplicate_key_in_json_has_position(tmp_path):
    write(tmp_path, "dup.json", '{"apiVersion": "v1", "kind": "Service",\n "metadata": {"name": "x"},\n'
                                ' "spec": {"ports": [{"port": 80,\n   "port": 81}]}}')
    rc, out = validate(tmp_path)
    assert rc == 1 and "dup.json:4:4: the key 'port' appears twice" in out, out


def test_control_character_column(tmp_path):
    write(tmp_path, "ctl.yaml", b"apiVersion: v1\nkind: Serv\x07ice\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "ctl.yaml:2:11: this file contains the control character" in out, out


def test_tab_indentation_says_tab(tmp_path):
    write(tmp_path, "t.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n\tname: x\n")
    rc, out = validate(tmp_path)
    assert rc == 1 and "t.yaml:4:1: YAML does not allow tabs for indentation; indent with spaces" in out, out


def test_plain_equals_sign_is_a_string(tmp_path):
    write(tmp_path, "a.yaml", SVC.format(name="a", ip="10.96.0.1").replace("metadata:\n", "metadata:\n  annotations: {op: =}\n"))
    rc, out = validate(tmp_path)
    assert rc == 0, out
    assert load_manifests(tmp_path).documents[0].data["metadata"]["annotations"] == {"op": "="}


def test_timestamps_stay_strings(tmp_path):
    # `kubectl get -o yaml` output carries unquoted timestamps; they are strings to kubectl
    write(tmp_path, "a.yaml", SVC.format(name="a", ip="10.96.0.1").replace(
        "metadata:\n", "metadata:\n  creationTimestamp: 2024-01-02T03:04:05Z\n  annotations: {day: 2024-01-02}\n"))
    rc, out = validate(tmp_path)
    assert rc == 0, out
    meta = load_manifests(tmp_path).documents[0].data["metadata"]
    assert meta["creationTimestamp"] == "2024-01-02T03:04:05Z" and meta["annotations"] == {"day": "2024-01-02"}


def test_yaml_1_1_booleans_are_read_as_kubectl_reads_them(tmp_path):
    # kubectl (go-yaml, YAML 1.1) reads plain yes/on as true: in a boolean field nftrec
    # does too, with a warning naming the canonical spelling
    slice_ = ("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: a-1\n"
              "  labels: {kubernetes.io/service-name: a}\naddressType: IPv4\nendpoints:\n"
              "  - addresses: [10.244.0.1]\n    conditions: {ready: yes, serving: on, terminating: false}\n")
    write(tmp_path, "a.yaml", slice_)
    rc, out = validate(tmp_path, allow_empty=True)  # a slice alone: no Service
    assert rc == 0, out
    assert ("a.yaml:9:25: warning: EndpointSlice default/a-1: endpoints[0].conditions.ready: 'yes' is read as true, "
            "as kubectl reads it") in out and "; write true" in out, out
    assert "endpoints[0].conditions.serving: 'on' is read as true" in out, out
    # a boolean where a string is wanted is still refused, with the advice to quote it
    write(tmp_path, "a.yaml", SVC.format(name="true", ip="10.96.0.1"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "metadata.name: must be a string, not true or false (True)" in out and "quote it" in out, out


def test_leading_zero_numbers_are_refused_as_ambiguous(tmp_path):
    # YAML 1.1 (kubectl) reads 010 as octal 8, YAML 1.2 as decimal 10: refuse, do not guess
    write(tmp_path, "a.yaml", SVC.format(name="a", ip="10.96.0.1").replace("port: 80", "port: 0080"))
    rc, out = validate(tmp_path)
    assert rc == 1 and "a.yaml:8:13: Service default/a: spec.ports[0].port:" in out and "leading zero" in out, out


def test_fifo_is_skipped_without_blocking(tmp_path):
    write(tmp_path, "a.yaml", SVC.format(name="a", ip="10.96.0.1"))
    os.mkfifo(tmp_path / "pipe.yaml")
    t = time.perf_counter()
    rc, out = validate(tmp_path)
    assert time.perf_counter() - t < 5
    assert rc == 0 and "pipe.yaml" in out and "not a regular file" in out, out
