"""A bad revision stops before the kernel: one with no Service at all is invalid unless
allowed (--allow-empty, allowEmpty), and one removing more than removalGuard of the
applied Services (and more than 5) is refused with their list unless --allow-removals.
`status` exits 1 while the newest revision is not applied. The guard's arithmetic is
tested alone; every command against the real kernel in throwaway namespaces, as real
processes (stdin from a pipe, a watch against a git-sync-like tree).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsutil import EXAMPLES, in_ns
from reconciler.intake import load_node_config
from watchproc import Watch

NFTREC = str(Path(sys.executable).with_name("nftrec"))
EDGE = EXAMPLES / "edge-small"
CONFIG = EXAMPLES / "edge-small.config.yaml"


def nftrec(*args: str, cwd: Path | None = None, input: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([NFTREC, *args], capture_output=True, text=True, timeout=120, input=input, cwd=cwd,
                          env={**os.environ, "NO_COLOR": "1"})


def services(d: Path, n: int, *, keep: range | None = None) -> Path:
    """`n` Services (default/svc-0 ... svc-<n-1>), one file each with its slice; `keep`:
    only those indexes (the others' files are removed)."""
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        f = d / f"svc-{i}.yaml"
        if keep is not None and i not in keep:
            f.unlink(missing_ok=True)
            continue
        f.write_text(
            f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: default}}\n"
            f"spec:\n  clusterIP: 10.96.1.{i + 1}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n"
            f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n"
            f"metadata:\n  name: svc-{i}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: svc-{i}}}\n"
            f"endpoints: [{{addresses: [10.244.1.{i + 1}], conditions: {{ready: true}}}}]\n"
            f"ports: [{{name: http, port: 8080, protocol: TCP}}]\n")
    return d


# --- the guard's arithmetic --------------------------------------------------------------------


def applied(n: int) -> set[str]:
    return {f"default/svc-{i}" for i in range(n)}


def removal_refusal(*args):
    from reconciler.engine import removal_refusal as refusal

    return refusal(*args)


def test_guard_refuses_more_than_the_share_and_more_than_five():
    refusal = removal_refusal(applied(6), lambda: applied(10), 50, "OVERRIDE")
    assert refusal is not None and refusal.startswith(
        "the revision would remove 6 of the 10 Services applied on this node (60%, more than removalGuard 50%): "
        "default/svc-0, default/svc-1, default/svc-2, default/svc-3, default/svc-4, default/svc-5; OVERRIDE")
    assert removal_refusal(applied(5), lambda: applied(10), 50, "") is None  # 5 or fewer always pass
    assert removal_refusal(applied(6), lambda: applied(20), 50, "") is None  # 30%
    assert removal_refusal(applied(10), lambda: applied(20), 50, "") is None  # exactly the share passes
    assert removal_refusal(applied(11), lambda: applied(20), 50, "") is not None
    assert removal_refusal(applied(10), lambda: applied(10), 100, "") is None  # 100%: no guard
    assert removal_refusal(applied(6), lambda: applied(10), 0, "") is not None
    assert removal_refusal(applied(6), lambda: None, 50, "") is None  # nothing applied: a first apply
    # only the applied Services count: Services the state never recorded are not its removals
    assert removal_refusal({f"other/x-{i}" for i in range(9)} | applied(3), lambda: applied(10), 50, "") is None


def test_guard_names_the_services_sorted_and_counts_the_rest():
    refusal = removal_refusal(applied(100), lambda: applied(100), 50, "x")
    listed = sorted(applied(100))
    assert ", ".join(listed[:20]) + " and 80 more; x" in refusal
    assert listed[20] not in refusal.split(" and 80 more")[0]


def test_guard_reads_the_applied_state_only_when_more_than_five_go():
    def boom():
        raise AssertionError("read")

    assert removal_refusal(applied(5), boom, 50, "") is None


def test_node_config_allow_empty_and_removal_guard(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("allowEmpty: true\nremovalGuard: 30%\n")
    node, problems = load_node_config(str(cfg), discover=False)
    assert not problems and node.allow_empty and node.removal_guard == 30
    node, _ = load_node_config(None, discover=False)
    assert not node.allow_empty and node.removal_guard == 50
    for value, said in (("30", "write 30% (100% turns the guard off); a count of Services is not accepted"),
                        ("150%", "a percentage from 0% to 100%"), ("'half'", "a percentage from 0% to 100%")):
        cfg.write_text(f"removalGuard: {value}\n")
        _, problems = load_node_config(str(cfg), discover=False)
        assert len(problems) == 1 and problems[0].field == "removalGuard" and said in problems[0].message, problems


# --- empty input: validate ------------------------------------------------------------------------


EMPTY = "no Services in {}: applying it would remove every Service from this node; `--allow-empty`"


def test_validate_refuses_an_empty_directory_stdin_and_cwd(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = nftrec("validate", str(empty))
    assert r.returncode == 1 and EMPTY.format(empty) in r.stdout, r.stdout + r.stderr
    r = nftrec("validate", "-", input="")
    assert r.returncode == 1 and EMPTY.format("<stdin>") in r.stdout, r.stdout + r.stderr
    r = nftrec("validate", cwd=empty)  # DIR defaults to .
    assert r.returncode == 1 and EMPTY.format(".") in r.stdout, r.stdout + r.stderr
    # other kinds only (a helm chart of Deployments): still no Service
    (empty / "d.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")
    r = nftrec("validate", str(empty), "-o", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and not doc["valid"] and EMPTY.format(empty) in doc["problems"][-1]["message"]
    (empty / "d.yaml").unlink()
    r = nftrec("validate", "-", "--allow-empty", input="")
    assert r.returncode == 0, r.stdout + r.stderr
    allow = tmp_path / "allow.yaml"
    allow.write_text("allowEmpty: true\n")
    r = nftrec("validate", str(empty), "--config", str(allow))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_headless_or_external_name_service_counts(tmp_path):
    for spec in ("clusterIP: None\n  ports: [{port: 80}]", "type: ExternalName\n  externalName: example.org"):
        r = nftrec("validate", "-", input=f"apiVersion: v1\nkind: Service\nmetadata: {{name: s}}\nspec:\n  {spec}\n")
        assert r.returncode == 0, r.stdout + r.stderr


# --- empty input and the guard: the real kernel ---------------------------------------------------


def kernel_args(tmp_path: Path, ns: str, config: Path = CONFIG) -> tuple[list[str], list[str]]:
    """(global options, command options) for a command in `ns` with its own state."""
    return ["--state-dir", str(tmp_path / "state")], ["--config", str(config), "--netns", ns]


@pytest.mark.kernel
def test_empty_stdin_apply_removes_nothing_and_status_says_so(netns, tmp_path):
    g, o = kernel_args(tmp_path, netns)
    r = nftrec(*g, "apply", str(EDGE), *o)
    assert r.returncode == 0, r.stderr
    before = in_ns(netns, "nft", "list", "ruleset").stdout
    assert nftrec(*g, "status", *o).returncode == 0
    for argv, cwd in ((["apply", "-"], None), (["plan", "-"], None), (["apply"], tmp_path / "empty"),
                      (["apply", str(tmp_path / "empty")], None)):
        (tmp_path / "empty").mkdir(exist_ok=True)
        r = nftrec(*g, *argv, *o, cwd=cwd, input="")
        shown = "<stdin>" if argv[-1] == "-" else "." if cwd else str(tmp_path / "empty")
        assert r.returncode == 1 and EMPTY.format(shown) in r.stderr, (argv, r.stdout + r.stderr)
        assert "to remove" not in r.stdout
        assert in_ns(netns, "nft", "list", "ruleset").stdout == before  # nothing in the kernel changed
    st = nftrec(*g, "status", *o)
    assert st.returncode == 1 and "attempted: revision" in st.stdout, st.stdout + st.stderr
    assert nftrec(*g, "status", "--detailed-exitcode", *o).returncode == 3
    # a good revision again: all is well
    assert nftrec(*g, "apply", str(EDGE), *o).returncode == 0
    assert nftrec(*g, "status", *o).returncode == 0


@pytest.mark.kernel
def test_allow_empty_applies_it(netns, tmp_path):
    g, o = kernel_args(tmp_path, netns)
    r = nftrec(*g, "apply", "-", "--allow-empty", *o)  # a fresh node: nothing to guard
    assert r.returncode == 0, r.stderr
    assert "nftrec" in in_ns(netns, "nft", "list", "tables").stdout
    assert nftrec(*g, "apply", str(EDGE), *o).returncode == 0
    allow = tmp_path / "allow.yaml"
    allow.write_text(CONFIG.read_text() + "allowEmpty: true\n")
    g, o = kernel_args(tmp_path, netns, allow)
    # edge-small's 8 Services all go: allowed empty, still more than the removal guard lets through
    r = nftrec(*g, "apply", "-", *o)
    assert r.returncode == 1 and "would remove 8 of the 8 Services" in r.stderr, r.stderr
    r = nftrec(*g, "apply", "-", "--allow-removals", *o)
    assert r.returncode == 0, r.stderr
    assert "default/web" not in in_ns(netns, "nft", "list", "ruleset").stdout
    assert nftrec(*g, "status", *o).returncode == 0


@pytest.mark.kernel
def test_removal_guard_against_the_kernel(netns, tmp_path):
    g, o = kernel_args(tmp_path, netns)
    d = services(tmp_path / "m", 10)
    assert nftrec(*g, "apply", str(d), *o).returncode == 0
    before = in_ns(netns, "nft", "list", "ruleset").stdout
    services(d, 10, keep=range(6, 10))  # 6 of 10 go
    p = nftrec(*g, "plan", str(d), "--out", str(tmp_path / "p.plan"), *o)
    assert p.returncode == 1 and "- default/svc-5" in p.stdout, p.stdout + p.stderr  # shown, then refused
    assert "would remove 6 of the 10 Services applied on this node (60%, more than removalGuard 50%): " \
           "default/svc-0, default/svc-1, default/svc-2, default/svc-3, default/svc-4, default/svc-5" in p.stderr
    assert not (tmp_path / "p.plan").exists()
    r = nftrec(*g, "apply", str(d), *o)
    assert r.returncode == 1 and "`nftrec apply --allow-removals` lets it through once" in r.stderr, r.stderr
    assert in_ns(netns, "nft", "list", "ruleset").stdout == before
    st = nftrec(*g, "status", *o)
    assert st.returncode == 1 and "refused by the removal guard" in st.stdout, st.stdout
    # a plan saved with --allow-removals: apply --plan checks the guard again, and takes the flag too
    p = nftrec(*g, "plan", str(d), "--allow-removals", "--out", str(tmp_path / "p.plan"), *o)
    assert p.returncode == 0 and (tmp_path / "p.plan").exists(), p.stderr
    r = nftrec(*g, "apply", "--plan", str(tmp_path / "p.plan"), *o)
    assert r.returncode == 1 and "would remove 6 of the 10" in r.stderr, r.stderr
    r = nftrec(*g, "apply", str(d), "--allow-removals", *o)
    assert r.returncode == 0 and "would remove 6 of the 10" in r.stderr, r.stderr
    assert "10.96.1.1 " not in in_ns(netns, "nft", "list", "ruleset").stdout
    assert nftrec(*g, "status", *o).returncode == 0

    services(d, 10)  # back to 10; then 5 of 10 go: passes
    assert nftrec(*g, "apply", str(d), *o).returncode == 0
    services(d, 10, keep=range(5, 10))
    r = nftrec(*g, "apply", str(d), *o)
    assert r.returncode == 0 and "would remove" not in r.stderr, r.stderr

    services(d, 20)  # 20 applied; 6 go (30%): passes
    assert nftrec(*g, "apply", str(d), *o).returncode == 0
    services(d, 20, keep=range(6, 20))
    r = nftrec(*g, "apply", str(d), *o)
    assert r.returncode == 0 and "would remove" not in r.stderr, r.stderr


@pytest.mark.kernel
def test_after_cleanup_nothing_is_applied_and_nothing_is_guarded(netns, tmp_path):
    """apply plans against the kernel (nothing to remove after cleanup); watch starts from
    the state, which must not count the Services cleanup removed as applied."""
    g, o = kernel_args(tmp_path, netns)
    d = services(tmp_path / "m", 10)
    assert nftrec(*g, "apply", str(d), *o).returncode == 0
    assert nftrec(*g, "cleanup", *o).returncode == 0
    services(d, 10, keep=range(8, 10))
    w = Watch(netns, d, short_config(tmp_path), tmp_path / "state")
    try:
        w.wait_sync(0)
        assert not w.find("removal-guard")
        assert "10.96.1.10 " in in_ns(netns, "nft", "list", "ruleset").stdout
        assert w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
    services(d, 10)
    assert nftrec(*g, "apply", str(d), *o).returncode == 0


# --- watch ----------------------------------------------------------------------------------------


def short_config(tmp: Path) -> Path:
    path = tmp / "config.yaml"
    path.write_text(CONFIG.read_text().replace("minSyncPeriod: 1s", "minSyncPeriod: 0s")
                    .replace("syncPeriod: 30s", "syncPeriod: 1s"))
    return path


@pytest.mark.kernel
def test_watch_keeps_the_last_good_ruleset_on_a_mass_removal_and_an_empty_revision(netns, tmp_path):
    root = tmp_path / "srv"  # git-sync's layout: current -> rev-...
    services(root / "rev-a", 10)
    (root / "current").symlink_to("rev-a")
    cfg = short_config(tmp_path)
    w = Watch(netns, root / "current", cfg, tmp_path / "state")
    try:
        w.wait_sync(0)
        before = in_ns(netns, "nft", "list", "ruleset").stdout
        assert w.http("/readyz")[0] == 200
        for rev, keep, why, said in (("rev-b", range(7, 10), "removal-guard", "would remove 7 of the 10 Services"),
                                     ("rev-c", range(0), "invalid", "no Services in")):
            shutil.copytree(root / "rev-a", root / rev)
            services(root / rev, 10, keep=keep)
            mark = len(w.lines)
            (root / "tmp-link").symlink_to(rev)
            os.replace(root / "tmp-link", root / "current")
            line = w.wait(lambda: w.find(why, mark), what=f"the {why} refusal")
            assert said in line["msg"] and "the last good ruleset stays in the kernel" in line["msg"], line
            assert in_ns(netns, "nft", "list", "ruleset").stdout == before
            code, body = w.http("/readyz")
            assert code == 503 and f"({why})" in body and said in body, body
            assert w.http("/healthz")[0] == 200  # the data plane is fine
            assert f'nftrec_revision_refused{{reason="{why}"}} 1.0' in w.http("/metrics")[1]
            st = w.status(lambda st: said in (st["lastError"] or ""))  # written after the log line
            assert st["lastAttemptedRevision"] != st["lastAppliedRevision"], st
            r = nftrec("--state-dir", str(w.state), "status", "--netns", netns, "--config", str(cfg))
            assert r.returncode == 1 and said in r.stdout, r.stdout + r.stderr
        assert len([x for x in w.lines if x.get("event") == "removal-guard"]) == 1  # logged once
        # the operator means it: removalGuard 100% and SIGHUP let the removal through
        cfg.write_text(cfg.read_text() + "removalGuard: 100%\n")
        (root / "tmp-link").symlink_to("rev-b")
        os.replace(root / "tmp-link", root / "current")
        mark = len(w.lines)
        w.proc.send_signal(__import__("signal").SIGHUP)
        w.wait_sync(mark)
        assert "10.96.1.1 " not in in_ns(netns, "nft", "list", "ruleset").stdout
        assert w.http("/readyz")[0] == 200
        assert w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
