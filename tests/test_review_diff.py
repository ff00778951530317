"""`nftrec diff`: the offline per-Service plan between two manifest trees or two git
revisions (issue 11, item 3). Runs the real command line in a subprocess; no root, no
kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "edge-small"
CONFIG = ROOT / "examples" / "edge-small.config.yaml"

CACHE = """\
apiVersion: v1
kind: Service
metadata:
  name: cache
  namespace: default
spec:
  clusterIP: 10.96.0.30
  ports:
    - name: redis
      port: 6379
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cache-h4s8d
  namespace: default
  labels:
    kubernetes.io/service-name: cache
addressType: IPv4
ports:
  - name: redis
    port: 6379
endpoints:
  - addresses: [10.244.0.40]
    nodeName: edge-1
"""

NEW_WEB_ENDPOINT = """\
  - addresses: [10.244.0.14]
    nodeName: edge-1
"""


def nftrec(*args: str, cwd: Path | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    env.pop("NFTREC_STATE_DIR", None)
    return subprocess.run([sys.executable, "-m", "reconciler.cli", *args], cwd=cwd, input=input,
                          capture_output=True, text=True, timeout=120, env=env)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=nftrec test", "-c", "user.email=t@example.org",
                           *args], check=True, capture_output=True, text=True, timeout=60).stdout


def edit_manifests(d: Path) -> None:
    """The second commit: web gets one more endpoint, legacy (Service and Endpoints in
    one file) is removed, a cache Service appears."""
    slices = d / "endpointslices.yaml"
    text = slices.read_text()
    anchor = "  - addresses: [10.244.0.13]\n"
    assert text.count(anchor) == 1
    slices.write_text(text.replace(anchor, NEW_WEB_ENDPOINT + anchor))
    (d / "legacy" / "endpoints.yaml").unlink()
    (d / "cache.yaml").write_text(CACHE)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """git init; commit examples/edge-small as manifests/; edit; commit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path_factory.mktemp("gitops")
    git(r, "init", "-q", "-b", "main")
    shutil.copytree(EXAMPLE, r / "manifests")
    (r / "README.md").write_text("not a manifest\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "edge-small")
    edit_manifests(r / "manifests")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "web +1 endpoint, cache added, legacy Endpoints removed")
    return r


# 22 operations: the hairpin elements lost (legacy) and gained (web, cache) are the only
# ones of their shards of hairpin-connections (layout sharded): one shard removed (set,
# chain, dispatch vmap element), two created, each its one Service's (no shared objects)
EXPECTED_TEXT = """\
+ default/cache ClusterIP 10.96.0.30:6379/TCP -> 1 endpoint
- default/legacy
~ default/web endpoints +10.244.0.14:8080; hairpin-connections-0e +1; hairpin-shards +1
Plan: 1 to add, 1 to change, 1 to remove; 22 nft operations.
"""


def test_git_two_commits_text_is_the_per_service_plan(repo):
    r = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED_TEXT


def test_git_detailed_exitcode_and_no_changes(repo):
    r = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "--detailed-exitcode", cwd=repo)
    assert r.returncode == 2, r.stderr
    same = nftrec("diff", "--git", "manifests", "HEAD", "main", "--config", str(CONFIG), "--detailed-exitcode",
                  cwd=repo)
    assert same.returncode == 0, same.stderr
    assert same.stdout == "No changes. OLD and NEW compile to the same ruleset.\n"
    # A..B is read as two revisions; the reverse direction reverses the signs
    back = nftrec("diff", "--git", str(repo / "manifests"), "HEAD..HEAD~1", "--config", str(CONFIG))
    assert back.returncode == 0, back.stderr
    assert "- default/cache\n" in back.stdout
    assert "+ default/legacy ClusterIP 10.96.0.17:80/TCP -> 1 endpoint\n" in back.stdout
    assert "~ default/web endpoints -10.244.0.14:8080; hairpin-shards -1\n" in back.stdout  # its shard goes whole
    assert "shared objects" not in back.stdout


def test_git_merge_base_range(repo):
    """A...B diffs B against the merge base of A and B (what a pull request changes)."""
    git(repo, "branch", "-f", "feature", "HEAD")
    git(repo, "branch", "-f", "base", "HEAD~1")
    r = nftrec("diff", "--git", "manifests", "base...feature", "--config", str(CONFIG), "-o", "json", cwd=repo)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["old"]["revision"] == git(repo, "rev-parse", "HEAD~1").strip()
    assert doc["old"]["source"] == "merge-base(base, feature)"


def test_git_json_names_both_commits(repo):
    r = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "-o", "json", cwd=repo)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["old"] == {"source": "HEAD~1", "revision": git(repo, "rev-parse", "HEAD~1").strip()}
    assert doc["new"] == {"source": "HEAD", "revision": git(repo, "rev-parse", "HEAD").strip()}
    assert doc["changed"] is True
    assert doc["summary"] == {"add": 1, "change": 1, "remove": 1, "operations": 22}
    assert [(s["action"], s["service"]) for s in doc["services"]] == [
        ("+", "default/cache"), ("-", "default/legacy"), ("~", "default/web")]
    assert len(doc["transaction"]) == 22


def test_git_markdown_is_a_pull_request_comment(repo):
    r = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "-o", "markdown", cwd=repo)
    assert r.returncode == 0, r.stderr
    md = r.stdout
    lines = md.splitlines()
    assert lines[0] == "<!-- nftrec-diff -->"
    assert lines[1] == "### nftrec diff `HEAD~1` → `HEAD`"
    assert "**Plan: 1 to add, 1 to change, 1 to remove; 22 nft operations.**" in lines
    assert "| `+` | `default/cache` | ClusterIP 10.96.0.30:6379/TCP -&gt; 1 endpoint |" in lines
    assert "| `-` | `default/legacy` | removed |" in lines
    assert "| `~` | `default/web` | endpoints +10.244.0.14:8080; hairpin-connections-0e +1; hairpin-shards +1 |" in lines
    assert not any("shared objects" in line for line in lines)
    start = lines.index("<details><summary>Transaction: 22 nft operations, one atomic commit on each node</summary>")
    end = lines.index("</details>")
    block = lines[start + 2:end - 1]
    assert block[0] == "```" and block[-1] == "```" and len(block) == 24
    assert "delete chain ip nftrec service-YYRJGEZM-default/legacy/tcp/http" in block


def test_git_reads_no_hidden_entries_and_refuses_links_leaving_the_tree(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "r"
    r.mkdir()
    git(r, "init", "-q")
    shutil.copytree(EXAMPLE, r / "m")
    (r / "m" / ".github").mkdir()
    (r / "m" / ".github" / "ci.yaml").write_text("this: [is not, a manifest\n")
    (r / "outside.yaml").write_text(CACHE)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "one")
    ok = nftrec("diff", "--git", "m", "HEAD..HEAD", "--config", str(CONFIG), cwd=r)
    assert ok.returncode == 0, ok.stderr  # .github/ci.yaml (broken YAML) was skipped
    (r / "m" / "extra").mkdir()
    (r / "m" / "extra" / "cache.txt").write_text(CACHE)  # no manifest suffix: read only through the link
    (r / "m" / "inside.yaml").symlink_to("extra/cache.txt")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "a link inside the tree")
    followed = nftrec("diff", "--git", "m", "HEAD~1..HEAD", "--config", str(CONFIG), cwd=r)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.startswith("+ default/cache ClusterIP 10.96.0.30:6379/TCP -> 1 endpoint\n")
    (r / "m" / "escape.yaml").symlink_to("../outside.yaml")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "a link leaving the tree")
    bad = nftrec("diff", "--git", "m", "HEAD~1..HEAD", "--config", str(CONFIG), cwd=r)
    assert bad.returncode == 1
    assert "HEAD:m/escape.yaml: this symlink points outside the manifest tree" in bad.stderr


def test_invalid_new_revision_is_reported_with_file_and_line_and_exits_1(repo):
    svc = repo / "manifests" / "services.yaml"
    text = svc.read_text()
    try:
        svc.write_text(text.replace("      port: 80\n      targetPort: 8080\n---", "      port: 70000\n      targetPort: 8080\n---", 1))
        git(repo, "commit", "-q", "-am", "bad port")
        line = next(i for i, ln in enumerate(svc.read_text().splitlines(), 1) if "70000" in ln)
        r = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "--detailed-exitcode",
                   cwd=repo)
        assert r.returncode == 1
        assert r.stdout == ""
        assert f"HEAD:manifests/services.yaml:{line}:" in r.stderr
        assert "70000 is out of range" in r.stderr
        md = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "-o", "markdown", cwd=repo)
        assert md.returncode == 1
        assert "### nftrec diff `HEAD~1` → `HEAD`: invalid input" in md.stdout
        assert f"HEAD:manifests/services.yaml:{line}:" in md.stdout
        js = nftrec("diff", "--git", "manifests", "HEAD~1..HEAD", "--config", str(CONFIG), "-o", "json", cwd=repo)
        assert js.returncode == 1
        doc = json.loads(js.stdout)
        assert doc["valid"] is False and doc["errors"] == 1
        assert [p["file"] for p in doc["problems"] if p["severity"] == "error"] == ["HEAD:manifests/services.yaml"]
    finally:
        git(repo, "reset", "-q", "--hard", "HEAD~1")


def test_git_errors_are_one_clear_line_and_exit_1(repo, tmp_path):
    r = nftrec("diff", "--git", "manifests", "no-such-branch..HEAD", cwd=repo)
    assert r.returncode == 1
    assert "the revision 'no-such-branch' does not exist" in r.stderr
    assert "Traceback" not in r.stderr
    r = nftrec("diff", "--git", str(tmp_path), "HEAD..HEAD")
    assert r.returncode == 1
    assert "is not inside a git working tree" in r.stderr
    r = nftrec("diff", "--git", "manifests", "--", "--upload-pack=x", "HEAD", cwd=repo)
    assert r.returncode == 1
    assert "is not a revision name" in r.stderr


@pytest.mark.parametrize("args", [
    ["diff", "only-one-dir"],
    ["diff", "-", "-"],
    ["diff", "--git", ".", "HEAD"],
    ["diff", "a", "b", "-o", "yaml"],
    ["diff", "--git", ".", "A..B", "C"],
])
def test_usage_errors_exit_64(args):
    r = nftrec(*args)
    assert r.returncode == 64, (r.stdout, r.stderr)


def test_directories_and_stdin(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(EXAMPLE, old)
    shutil.copytree(EXAMPLE, new)
    edit_manifests(new)
    r = nftrec("diff", str(old), str(new), "--config", str(CONFIG), "--detailed-exitcode")
    assert r.returncode == 2, r.stderr
    assert r.stdout == EXPECTED_TEXT
    # NEW from standard input: only cache.yaml's objects, so every other Service is removed
    r = nftrec("diff", str(old), "-", "--config", str(CONFIG), input=CACHE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("+ default/cache ClusterIP 10.96.0.30:6379/TCP -> 1 endpoint\n- default/idle\n")
    assert "Plan: 1 to add, 0 to change, 8 to remove;" in r.stdout
    # invalid stdin: <stdin>:line
    r = nftrec("diff", str(old), "-", "--config", str(CONFIG), input=CACHE.replace("port: 6379\n---", "port: 0\n---"))
    assert r.returncode == 1
    assert "<stdin>:10:" in r.stderr


def _ci_diff_commands() -> list[tuple[str, list[str]]]:
    """The `nftrec diff` command line of each CI example, as its shell would split it."""
    import shlex

    from ruamel.yaml import YAML

    out = []
    for f in sorted((ROOT / "examples" / "ci").glob("*.yaml")):
        doc = YAML(typ="safe").load(f.read_text())
        scripts = [s["run"] for job in (doc.get("jobs") or {}).values() for s in job["steps"] if "run" in s]
        scripts += [line for job in doc.values() if isinstance(job, dict) for line in job.get("script", [])]
        cmds = [s for s in scripts if "nftrec diff" in s]
        assert len(cmds) == 1, f
        text = cmds[0].replace("\\\n", " ")
        text = text[text.index("nftrec diff"):].split(">", 1)[0]
        text = (text.replace("${{ github.base_ref }}", "main")
                .replace("$CI_MERGE_REQUEST_TARGET_BRANCH_NAME", "main"))
        out.append((f.name, shlex.split(text)))
    return out


@pytest.mark.parametrize("name,argv", _ci_diff_commands())
def test_the_ci_examples_command_runs_on_a_pull_request(tmp_path, name, argv):
    """Each example CI job's command, run in a repository laid out as the job expects
    (manifests/, nodes/edge-1.config.yaml, origin/main one commit behind HEAD)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "r"
    r.mkdir()
    git(r, "init", "-q", "-b", "feature")
    shutil.copytree(EXAMPLE, r / "manifests")
    (r / "nodes").mkdir()
    shutil.copy(CONFIG, r / "nodes" / "edge-1.config.yaml")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "base")
    git(r, "update-ref", "refs/remotes/origin/main", "HEAD")
    edit_manifests(r / "manifests")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "change")
    assert argv[:2] == ["nftrec", "diff"] and "--detailed-exitcode" in argv and "markdown" in argv
    res = nftrec(*argv[1:], cwd=r)
    assert res.returncode == 2, (name, res.stderr)
    assert res.stdout.startswith("<!-- nftrec-diff -->\n")
    assert "| `+` | `default/cache` |" in res.stdout
