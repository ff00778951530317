"""`nftrec watch` (SPEC §6): unit tests of the runner and the incremental pipeline, then
the daemon as a real process against the real kernel, inside throwaway namespaces.

Every daemon runs with `--netns NS --state-dir TMP --log-format json`, short periods
from its own node config, and metrics on a free port (`127.0.0.1:0`; the port is read
from its log). Waits are bounded polls, never fixed long sleeps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nsutil import EXAMPLES, in_ns, needs_nft_spelling
from watchproc import Watch

NFTREC = str(Path(sys.executable).with_name("nftrec"))
EDGE = EXAMPLES / "edge-small"
CONFIG = EXAMPLES / "edge-small.config.yaml"
REV_A = "rev-" + "a" * 40
REV_B = "rev-" + "b" * 40


# --- unit: the runner (fake clock) -----------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_runner_bounded_frequency_semantics():
    from reconciler.daemon.runner import Runner, SyncFailed

    clock = FakeClock()
    calls, fail = [], [False]

    def fn():
        calls.append(clock.t)
        if fail[0]:
            raise SyncFailed("x")

    r = Runner(fn, min_interval=1.0, retry_interval=5.0, max_interval=30.0, clock=clock)
    assert r.delay(clock.t) is None  # nothing asked for yet
    r.run()
    assert r.delay(clock.t) == 0
    r.run_once()
    # timer: max_interval after the run
    assert r.delay(clock.t) == 30.0
    # triggers coalesce and wait out min_interval
    clock.t += 0.2
    r.run(); r.run(); r.run()
    assert r.delay(clock.t) == pytest.approx(0.8)
    clock.t += 0.8
    assert r.delay(clock.t) == pytest.approx(0.0)
    r.run_once()
    assert len(calls) == 2 and r.delay(clock.t) == 30.0
    # a failure retries after retry_interval (min(retry, max))
    fail[0] = True
    r.run()
    clock.t += 1.0
    assert not r.run_once()
    assert r.delay(clock.t) == pytest.approx(5.0)
    fail[0] = False
    clock.t += 5.0
    assert r.run_once()
    # fn's hint shortens the timer (the daemon's "next full sync in")
    r._fn = lambda: 7.0
    clock.t += 1.0
    r.run()
    r.run_once()
    assert r.delay(clock.t) == pytest.approx(7.0)
    # the hint never undercuts min_interval
    r._fn = lambda: 0.0
    clock.t += 1.0
    r.run_once()
    assert r.delay(clock.t) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        Runner(fn, 10.0, 1.0, 5.0, clock=clock)


def test_runner_loop_stops_and_coalesces():
    from reconciler.daemon.runner import Runner

    hits = []
    r = Runner(lambda: hits.append(1), 0.05, 1.0, 60.0)
    t = threading.Thread(target=r.loop)
    t.start()
    for _ in range(20):
        r.run()
    deadline = time.monotonic() + 2
    while not hits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    r.stop()
    t.join(2)
    assert not t.is_alive() and 1 <= len(hits) <= 2


# --- unit: the incremental pipeline against the whole-pipeline oracle ------------------------


def _cfg():
    from reconciler.intake.config import load_node_config

    cfg, problems = load_node_config(str(CONFIG), discover=False)
    assert not [p for p in problems if p.is_error]
    return cfg


def _same_as_read_inventory(intake, d: Path, changed: set[str] | None = None):
    from reconciler.intake.inventory import read_inventory

    snap = intake.read(changed)
    ref = read_inventory(d)
    assert snap.problems == ref.problems
    assert snap.inventory == ref.inventory
    assert snap.revision == ref.inventory.revision and snap.digest == ref.digest
    return snap


def test_intake_and_incremental_compile_equal_the_whole_pipeline(tmp_path):
    from reconciler.compile.services import compile_ruleset
    from reconciler.engine.changes import diff
    from reconciler.kernel.live import canonical
    from reconciler.compile import compile_static
    from reconciler.compile import changed_services, compile_incremental, project
    from reconciler.intake import Intake

    d = tmp_path / "m"
    shutil.copytree(EDGE, d)
    cfg = _cfg()
    intake = Intake(d)
    snap = _same_as_read_inventory(intake, d)
    assert intake.parsed == 6
    c1 = compile_incremental(snap.inventory, cfg, None)
    assert c1.ruleset == compile_ruleset(snap.inventory, cfg)
    # one slice edited: only that file re-parsed, only that Service recompiled
    p = d / "endpointslices.yaml"
    p.write_text(p.read_text().replace("10.244.0.12", "10.244.0.99"))
    snap2 = _same_as_read_inventory(intake, d)
    assert intake.parsed == 1
    c2 = compile_incremental(snap2.inventory, cfg, c1)
    assert c2.recompiled == 1 and c2.ruleset == compile_ruleset(snap2.inventory, cfg)
    changed = changed_services(c1, c2)
    assert changed == {"default/web"}
    static = compile_static(cfg, snap2.inventory)
    frags = [f for k in changed for f in (c1.fragments.get(k), c2.fragments.get(k)) if f]
    small = diff(project(c2.ruleset, static, frags), canonical(project(c1.ruleset, static, frags)))
    whole = diff(c2.ruleset, canonical(c1.ruleset))
    assert sorted(c.id for c in small) == sorted(c.id for c in whole) and len(whole) > 0
    # a Service removed, one added (copy under another name): still equal
    text = (d / "services.yaml").read_text()
    (d / "services.yaml").write_text(text.replace("name: idle", "name: idle2"))
    snap3 = _same_as_read_inventory(intake, d)
    c3 = compile_incremental(snap3.inventory, cfg, c2)
    assert c3.ruleset == compile_ruleset(snap3.inventory, cfg)
    changed = changed_services(c2, c3)
    frags = [f for k in changed for f in (c2.fragments.get(k), c3.fragments.get(k)) if f]
    small = diff(project(c3.ruleset, static, frags), canonical(project(c2.ruleset, static, frags)))
    whole = diff(c3.ruleset, canonical(c2.ruleset))
    assert sorted(c.id for c in small) == sorted(c.id for c in whole)
    # invalid input: the same problems as validate; a file moved in by rename is seen
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 70000}]\n")
    os.replace(bad, d / "bad.yaml")
    snap4 = _same_as_read_inventory(intake, d)
    assert not snap4.ok and any(p.file.endswith("bad.yaml") and p.line for p in snap4.problems)


def _step(intake, d: Path, cfg, prev):
    """One read + incremental compile, checked against the whole pipeline (the oracle):
    inventory, ruleset, and the projected (fast-path) diff against the whole diff."""
    from reconciler.compile import compile_ruleset, compile_static
    from reconciler.engine.changes import diff
    from reconciler.kernel.live import canonical
    from reconciler.compile import changed_services, compile_incremental, project

    snap = _same_as_read_inventory(intake, d)
    if not snap.ok:
        return snap, prev
    c = compile_incremental(snap.inventory, cfg, prev)
    assert c.ruleset == compile_ruleset(snap.inventory, cfg)
    if prev is not None:  # the swap (compile/incremental._swap: assemble.patch) equals assembling everything
        whole = compile_incremental(snap.inventory, cfg, None, prev.ruleset)
        assert c.ruleset == whole.ruleset and c.allocation == whole.allocation and c.shared == whole.shared
    if prev is not None:
        whole = sorted(x.id for x in diff(c.ruleset, canonical(prev.ruleset)))
        changed = changed_services(prev, c)
        if changed is not None:
            static = compile_static(cfg, snap.inventory)
            frags = [f for k in changed for f in (prev.fragments.get(k), c.fragments.get(k)) if f]
            small = diff(project(c.ruleset, static, frags), canonical(project(prev.ruleset, static, frags)))
            assert sorted(x.id for x in small) == whole
            if prev.static == c.static:  # the daemon then leaves the skeleton's chains out: same plan
                assert c.static is prev.static  # handed on, not compiled again
                from reconciler.engine.plan import make_plan
                new_p = project(c.ruleset, static, frags, static_chains=False)
                old_p = canonical(project(prev.ruleset, static, frags, static_chains=False))
                assert sorted(x.id for x in diff(new_p, old_p)) == whole
                with_chains = make_plan(project(c.ruleset, static, frags),
                                        canonical(project(prev.ruleset, static, frags)))
                assert make_plan(new_p, old_p).transaction.ops == with_chains.transaction.ops
    return snap, c


@pytest.mark.parametrize("seed", range(6))
def test_incremental_chain_of_random_edits_equals_oracle(seed, tmp_path):
    """compile_incremental's common step (only the Services whose model objects are new:
    `_recompile_changed`), chained over random edits (endpoints moved, added, removed;
    Services removed, renamed with their slices, affinity and policy flipped): each
    result equals a full compile with the same previous ranges, and changed_services
    (answered from the step) equals the pass over every fragment."""
    import random

    from test_oneshot import _edit

    from reconciler.compile import changed_services, compile_incremental, compile_ruleset
    from reconciler.intake import load_node_config, read_inventory

    from benchmix import mix

    mix.generate(tmp_path / "m", 120, 3)
    (tmp_path / "cfg.yaml").write_text(mix.NODE_CONFIG)
    cfg, _ = load_node_config(str(tmp_path / "cfg.yaml"), discover=False)
    inv = read_inventory(tmp_path / "m").inventory
    rnd = random.Random(seed)
    c = compile_incremental(inv, cfg, None)
    for round_ in range(6):
        inv = _edit(inv, rnd, seed * 10 + round_)
        nxt = compile_incremental(inv, cfg, c)
        assert nxt.recompiled < len(inv.services)
        assert nxt.ruleset == compile_ruleset(inv, cfg, previous=c.ruleset)
        everything = {k for k in set(c.fragments) | set(nxt.fragments)
                      if c.fragments.get(k) is not nxt.fragments.get(k)} | set(nxt.moved)
        assert changed_services(c, nxt) == everything
        assert list(nxt.fragments) == sorted(nxt.fragments, key=lambda k: tuple(k.split("/")))
        c = nxt


def test_incremental_equals_oracle_on_deletes_moves_relabels_cidrs_and_invalid(tmp_path):
    from dataclasses import replace

    from reconciler.intake import Intake

    d = tmp_path / "m"
    shutil.copytree(EDGE, d)
    cfg = _cfg()
    intake = Intake(d)
    snap, c = _step(intake, d, cfg, None)
    svc = d / "services.yaml"
    eps = d / "endpointslices.yaml"
    docs = svc.read_text().split("\n---\n")
    idle = next(x for x in docs if "name: idle" in x)
    # a Service moves to another file (same content): nothing to recompile or change
    svc.write_text("\n---\n".join(x for x in docs if x is not idle))
    (d / "apps" / "idle.yaml").write_text(idle)
    snap, c2 = _step(intake, d, cfg, c)
    assert c2.recompiled == 0 and c2.ruleset == c.ruleset
    # a file deleted: its Service goes; the cache forgets the file
    (d / "apps" / "idle.yaml").unlink()
    snap, c3 = _step(intake, d, cfg, c2)
    assert "default/idle" not in c3.fragments and not any("idle.yaml" in k for k in intake._files)
    # a slice changes its service-name label: both Services recompiled
    eps.write_text(eps.read_text().replace("kubernetes.io/service-name: web", "kubernetes.io/service-name: web2", 1))
    snap, c4 = _step(intake, d, cfg, c3)
    # ... and back
    eps.write_text(eps.read_text().replace("kubernetes.io/service-name: web2", "kubernetes.io/service-name: web", 1))
    snap, c5 = _step(intake, d, cfg, c4)
    assert c5.ruleset == c3.ruleset
    # ServiceCIDR changed, then removed (a static-part change)
    sc = d / "servicecidr.json"
    sc.write_text(sc.read_text().replace("10.96.0.0/16", "10.96.0.0/12"))
    snap, c6 = _step(intake, d, cfg, c5)
    sc.unlink()
    snap, c7 = _step(intake, d, cfg, c6)
    # a rename within the tree (git mv)
    os.rename(eps, d / "apps" / "slices.yaml")
    snap, c8 = _step(intake, d, cfg, c7)
    assert c8.ruleset == c7.ruleset
    # node config changed: everything recompiled
    cfg2 = replace(cfg, masquerade_all=not cfg.masquerade_all)
    snap, c9 = _step(intake, d, cfg2, c8)
    assert c9.recompiled == len(c9.fragments)
    # a file becomes invalid, then valid again (the same bytes as before)
    good = svc.read_text()
    svc.write_text(good.replace("port: 80\n", "port: 70000\n", 1))
    bad, same = _step(intake, d, cfg2, c9)
    assert not bad.ok and same is c9
    svc.write_text(good)
    snap, c10 = _step(intake, d, cfg2, c9)
    assert c10.ruleset == c9.ruleset and c10.recompiled == 0
    # caches hold only what the last read saw
    assert len(intake._files) == snap.files
    assert all(len(e.checks) == len(e.docs) and e.prev is None for e in intake._files.values())
    assert len(intake._models) <= sum(len(e.docs) for e in intake._files.values())


def _svc_doc(i: int, port: int = 80) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata:\n  name: s{i}\n  namespace: ns{i % 3}\nspec:\n"
            f"  clusterIP: 10.96.{i // 250}.{i % 250 + 1}\n  ports:\n  - name: http\n    port: {port}\n"
            f"    targetPort: 8080\n")


def _slice_doc(i: int, last: int = 1) -> str:
    return (f"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s{i}-a\n"
            f"  namespace: ns{i % 3}\n  labels:\n    kubernetes.io/service-name: s{i}\naddressType: IPv4\n"
            f"ports:\n- name: http\n  port: 8080\nendpoints:\n- addresses: [10.244.{i // 250}.{i % 250 + 1}]\n"
            f"- addresses: [10.245.{i // 250}.{last}]\n")


def _gitsync_tree(root: Path, n: int, per_file: int) -> None:
    for f in range(0, n, per_file):
        (root / f"svc-{f:04d}.yaml").write_text("---\n".join(_svc_doc(i) for i in range(f, min(n, f + per_file))))
        (root / "slices").mkdir(exist_ok=True)
        (root / "slices" / f"eps-{f:04d}.yaml").write_text(
            "---\n".join(_slice_doc(i) for i in range(f, min(n, f + per_file))))


def _random_edit(rng, rev: Path, r: int, n: int) -> str:
    """One random revision's edit of the tree at `rev`: its kind."""
    files = sorted(rev.rglob("*.yaml"))
    kind = "endpoint" if r <= 3 else rng.choice(["endpoint", "same-size", "port", "duplicate", "move",
                                               "delete", "reorder", "invalid", "none", "insert"])
    f = rng.choice(files)
    text = f.read_text()
    if kind in ("endpoint", "same-size"):
        f = rng.choice([x for x in files if x.parent.name == "slices"])
        text = f.read_text()
        old = re.findall(r"10\.245\.\d+\.\d+", text)
        victim = rng.choice(old)
        a, b, c3, d4 = victim.split(".")
        new = f"{a}.{b}.{c3}.{int(d4) % 9 + 1}" if kind == "same-size" else f"{a}.{b}.{c3}.{rng.randint(10, 250)}"
        if new == victim:
            new = f"{a}.{b}.{c3}.{int(d4) % 9 + 2}"
        st = f.stat()
        f.write_text(text.replace(victim + "]", new + "]", 1))
        if kind == "same-size":
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as before
    elif kind == "port":
        f.write_text(text.replace("port: 80\n", f"port: {rng.randint(81, 90)}\n", 1))
    elif kind == "duplicate":
        (rev / f"dup-{r}.yaml").write_text(_svc_doc(rng.randrange(n), port=443))
    elif kind == "move":
        docs = text.split("---\n")
        k = rng.randrange(len(docs))
        f.write_text("---\n".join(docs[:k] + docs[k + 1:]))
        (rev / f"moved-{r}.yaml").write_text(docs[k])
    elif kind == "delete" and len(files) > 4:
        f.unlink()
    elif kind == "reorder":
        docs = text.split("---\n")
        rng.shuffle(docs)
        f.write_text("---\n".join(docs))
    elif kind == "invalid":
        f.write_text(text.replace("port: ", "port: 7000", 1))
    elif kind == "insert":  # a new document in the middle: the following ones move down
        docs = text.split("---\n")
        docs.insert(rng.randrange(len(docs) + 1), "# a comment\n" + _svc_doc(n + r))
        f.write_text("---\n".join(docs))
    return kind


def _check_swap(intake, kind: str, was_ok: bool, snap, c) -> None:
    if kind in ("endpoint", "same-size"):
        assert intake.parsed == 1 and intake.checked == 1, (kind, intake.parsed, intake.checked)
        assert not intake.cross or not (was_ok and snap.ok), kind  # no check across documents
        assert (c.recompiled == 1 and c.swapped) or not (was_ok and snap.ok), kind
    elif kind == "none":
        assert intake.parsed == 0 and intake.checked == 0


def test_git_sync_swap_rereads_only_changed_files_and_equals_the_oracle(tmp_path):
    """git-sync: every revision a whole new worktree. A revision that moves one endpoint
    re-parses that one file and re-checks that one document; random edits across swaps
    (edits, same-size edits with the mtime kept, duplicates, moves, deletes, reorders)
    always give what a full read gives (read_inventory, the oracle)."""
    import random

    from reconciler.intake import Intake

    rng = random.Random(8)
    gs = tmp_path / "gs"
    rev = gs / "rev-0000"
    rev.mkdir(parents=True)
    n, per_file = 60, 10
    _gitsync_tree(rev, n, per_file)
    (gs / "current").symlink_to(rev.name)
    cur = gs / "current"
    cfg = _cfg()
    intake = Intake(cur)
    snap, c = _step(intake, cur, cfg, None)
    assert snap.ok and len(snap.inventory.services) == n and intake.parsed == 12
    swaps = 0
    for r in range(1, 25):
        prev, rev = rev, gs / f"rev-{r:04d}"
        shutil.copytree(prev, rev)  # copy2: mtimes kept, as a worktree of the same commit
        kind = _random_edit(rng, rev, r, n)
        (gs / "tmp-link").symlink_to(rev.name)
        os.replace(gs / "tmp-link", cur)
        was_ok = snap.ok
        snap, c = _step(intake, cur, cfg, c)
        assert not intake.git  # plain directories: the files are compared
        _check_swap(intake, kind, was_ok, snap, c)
        swaps += c.swapped
        shutil.rmtree(prev)
    assert len(intake._files) == snap.files and swaps >= 3


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env, timeout=60).stdout.strip()


@pytest.mark.parametrize("sub", [".", "deploy/manifests"])
def test_git_worktree_swaps_ask_git_and_equal_the_oracle(tmp_path, sub):
    """git-sync v4: one repository, a `git worktree` per commit (`.worktrees/<sha>`), the
    link swapped. `git ls-tree` of the new commit says which files hold the bytes read
    before (no file compared, no walk when the same files exist); random edits across
    swaps, the manifests at the top or in a subdirectory, always equal the oracle. A
    published checkout edited by hand is still read right: in place (the bytes read then
    are not the next commit's), or before the swap with another size."""
    import random

    from reconciler.intake import Intake

    rng = random.Random(len(sub))
    src = tmp_path / "src"
    n, per_file = 40, 10
    (src / sub).mkdir(parents=True)
    _gitsync_tree(src / sub, n, per_file)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "0")
    gs = tmp_path / "gs"

    def checkout() -> Path:
        sha = _git(src, "rev-parse", "HEAD")
        wt = gs / ".worktrees" / sha
        _git(src, "worktree", "add", "-q", "--detach", str(wt), sha)
        return wt

    rev = checkout()
    (gs / "current").symlink_to(rev.relative_to(gs))
    cur = gs / "current" / sub if sub != "." else gs / "current"
    cfg = _cfg()
    intake = Intake(cur)
    snap, c = _step(intake, cur, cfg, None)
    assert snap.ok and snap.revision == rev.name
    asked = 0
    for r in range(1, 22):
        kind = _random_edit(rng, src / sub, r, n)
        _git(src, "add", "-A")
        _git(src, "commit", "-q", "--allow-empty", "-m", str(r))
        prev, rev = rev, checkout()
        if r == 20:  # a published checkout edited by hand: git cannot know; the size check sees it
            f = sorted((rev / sub).rglob("*.yaml"))[0]
            f.write_text(f.read_text() + "\n# edited\n")
        (gs / "tmp-link").symlink_to(rev.relative_to(gs))
        os.replace(gs / "tmp-link", gs / "current")
        was_ok = snap.ok
        snap, c = _step(intake, cur, cfg, c)
        assert intake.git and snap.revision == (rev.name if r != 20 else f"{rev.name}+dirty:sha256:{snap.digest}")
        asked += 1
        if r not in (11, 20, 21):  # 11, 21: the hand-edited file is read again (the commit does not hold its bytes)
            _check_swap(intake, kind, was_ok, snap, c)
            if kind in ("endpoint", "same-size", "port", "none", "reorder", "invalid", "insert"):
                assert intake.compared <= 1, kind  # git said which file changed: only it is read
        _git(src, "worktree", "remove", "--force", str(prev))
        if r == 10:  # the published checkout edited in place (same size): read; the next swap reads it again
            f = sorted((rev / sub).rglob("eps-*.yaml"))[1]
            f.write_text(f.read_text().replace("10.244.", "10.243.", 1))
            snap, c = _step(intake, cur, cfg, c)
            assert snap.revision == f"{rev.name}+dirty:sha256:{snap.digest}"
    assert asked == 21 and len(intake._files) == snap.files


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_checkout_blobs_are_the_commits_tree(tmp_path, monkeypatch, object_format):
    """A checkout's files and ids come from its commit in the object store (no git
    process, no index) and equal `git ls-tree` of the commit; edits to the worktree or
    the index change nothing."""
    import dulwich

    from reconciler.intake import git as G

    if object_format == "sha256" and dulwich.__version__ < (1, 2):
        pytest.skip("dulwich before 1.2 cannot read sha256 repositories")
    src = tmp_path / "src"
    (src / "m" / "deep").mkdir(parents=True)
    for i in range(5):
        (src / "m" / ("d" * i + f"f{i}.yaml")).write_text(f"x: {i}\n")
    (src / "m" / "deep" / "g.yaml").write_text("y: 1\n")
    (src / "m" / "run.yaml").write_text("z: 1\n")
    (src / "m" / "run.yaml").chmod(0o755)
    (src / "other.txt").write_text("not under m\n")
    _git(src, "init", "-q", f"--object-format={object_format}")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "0")
    wt = tmp_path / "wt"
    _git(src, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
    listed = {}
    for line in _git(wt, "ls-tree", "-r", "--full-tree", "HEAD", "--", "m").splitlines():
        meta, path = line.split("\t")
        mode, _, oid = meta.split(" ")
        listed[path[len("m/"):]] = (mode, oid)
    assert len(listed) == 7 and {len(oid) for _, oid in listed.values()} == {40 if object_format == "sha1" else 64}
    index = Path(_git(src, "rev-parse", "--absolute-git-dir"), "worktrees", "wt", "index")
    monkeypatch.setenv("PATH", "/nonexistent")  # no git to run
    assert G.checkout_blobs(wt / "m") == listed
    (wt / "m" / "deep" / "g.yaml").write_text("y: 2\n")
    (wt / "m" / "new.yaml").write_text("n: 1\n")
    index.write_bytes(b"DIRC torn")
    assert G.checkout_blobs(wt / "m") == listed


def test_changed_paths_look_at_those_files_only(tmp_path, monkeypatch):
    """The watcher's changed paths: no walk, no stat of the other files; a new file
    comes with a walk (the watcher passes None), and the results equal the oracle."""
    import reconciler.intake.incremental as incremental
    from reconciler.intake import Intake

    monkeypatch.setattr(incremental, "RACY_SECONDS", 0.0)  # freshly written files count as settled
    d = tmp_path / "m"
    d.mkdir()
    _gitsync_tree(d, 40, 10)
    intake = Intake(d)
    _same_as_read_inventory(intake, d)
    assert intake.looked == 8
    f = d / "slices" / "eps-0010.yaml"
    before = next(e for k, e in intake._files.items() if k.endswith("eps-0010.yaml")).docs
    f.write_text(f.read_text().replace("10.244.0.12]", "10.244.0.99]"))
    _same_as_read_inventory(intake, d, {str(f)})
    assert intake.looked == 1 and intake.parsed == 1 and intake.checked == 1
    after = next(e for k, e in intake._files.items() if k.endswith("eps-0010.yaml")).docs
    # the 9 unchanged documents are the same objects (their checks and models stand), on the new text
    assert [a is b for a, b in zip(before, after)] == [True, False] + [True] * 8
    assert all(a.src is after[0].src and "10.244.0.99]" in a.src.text for a in after)
    _same_as_read_inventory(intake, d, set())
    assert intake.looked == 0 and intake.parsed == 0
    (d / "more.yaml").write_text(_svc_doc(99))
    snap = _same_as_read_inventory(intake, d, None)
    assert intake.looked == 9 and len(snap.inventory.services) == 41


def test_swap_falls_back_where_elements_are_shared(tmp_path):
    """Two Services on one ClusterIP (other ports) share elements of the static sets (the
    first Service in key order owns them): editing them, or moving the owner to another
    IP, is assembled whole, and equals the oracle; unshared edits are swapped."""
    from reconciler.intake import Intake

    d = tmp_path / "m"
    d.mkdir()
    svcs = [_svc_doc(i) for i in range(4)] + [_svc_doc(0).replace("name: s0", "name: t0").replace("port: 80", "port: 81")]
    (d / "svc.yaml").write_text("---\n".join(svcs))
    slices = [_slice_doc(i) for i in range(4)] + [_slice_doc(0).replace("s0-a", "t0-a").replace("name: s0", "name: t0")
                                                  .replace("service-name: s0", "service-name: t0")]
    (d / "eps.yaml").write_text("---\n".join(slices))
    cfg = _cfg()
    intake = Intake(d)
    snap, c = _step(intake, d, cfg, None)
    assert snap.ok and c.shared, "the two Services on 10.96.0.1 share elements"
    eps = d / "eps.yaml"
    eps.write_text(eps.read_text().replace("10.245.0.1]", "10.245.0.7]"))  # every slice: s0 and t0 too
    snap, c2 = _step(intake, d, cfg, c)
    assert c2.recompiled == 5 and not c2.swapped
    text = eps.read_text().split("---\n")
    text[2] = text[2].replace("10.245.0.7]", "10.245.0.8]")  # s2 alone: nothing shared
    eps.write_text("---\n".join(text))
    snap, c3 = _step(intake, d, cfg, c2)
    assert c3.recompiled == 1 and c3.swapped
    svc = d / "svc.yaml"
    svc.write_text("---\n".join([svcs[0].replace("10.96.0.1", "10.96.9.9")] + svcs[1:]))
    snap, c4 = _step(intake, d, cfg, c3)  # s0 moves away: t0 alone keeps 10.96.0.1's elements
    assert not c4.swapped and not c4.shared


# --- the daemon as a process ----------------------------------------------------------------


def run(*args: str, state: Path, ns: str, config: Path | None = None, timeout: float = 60):
    cmd = [NFTREC, "--state-dir", str(state), *args, "--netns", ns]
    if config is not None:
        cmd += ["--config", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"})


def short_config(tmp: Path, **overrides: str) -> Path:
    text = CONFIG.read_text()
    values = {"minSyncPeriod": "0s", "syncPeriod": "1s", "fullSyncPeriod": "30s", **overrides}
    for k, v in values.items():
        text = re.sub(rf"^{k}: .*$", f"{k}: {v}", text, flags=re.M)
    path = tmp / "config.yaml"
    path.write_text(text)
    return path


def listing(ns: str, family: str = "ip") -> str:
    return in_ns(ns, "nft", "list", "table", family, "nftrec").stdout


def assert_clean(d: Path, state: Path, ns: str, config: Path) -> None:
    p = run("plan", str(d), "--detailed-exitcode", "--refresh", state=state, ns=ns, config=config)
    assert p.returncode == 0 and "No changes" in p.stdout, p.stdout + p.stderr


@pytest.fixture
def watched(netns, tmp_path):
    """A manifest copy of edge-small, a short-period config and a running daemon."""
    d = tmp_path / "m"
    shutil.copytree(EDGE, d)
    cfg = short_config(tmp_path)
    w = Watch(netns, d, cfg, tmp_path / "state")
    try:
        yield w
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


@pytest.mark.kernel
def test_initial_sync_edit_editor_save_and_concurrent_apply(watched):
    w = watched
    first = w.wait_sync(0, kind="full")
    # a cold transaction: every object of edge-small (fewer with kube-proxy's spelling, nft 0.9.8)
    assert first["operations"] > 80 and len(first["servicesChanged"]) == 8
    assert_clean(w.manifests, w.state, w.ns, w.config)

    # one EndpointSlice edited in place: only that Service's objects change
    mark = len(w.lines)
    p = w.manifests / "endpointslices.yaml"
    t0 = time.monotonic()
    p.write_text(p.read_text().replace("10.244.0.12", "10.244.0.77"))
    s = w.wait_sync(mark)
    assert s["servicesChanged"] == ["~default/web"] and s["kind"] == "partial", s
    assert s["filesParsed"] == 1 and s["recompiled"] == 1
    # <= 6, and the hairpin shards: .12 was the only element of hairpin-connections-0c (set,
    # chain and dispatch vmap element go), .77 is the first of 0d (they come)
    assert 0 < s["operations"] <= 12
    assert "10.244.0.77" in listing(w.ns) and "10.244.0.12 " not in listing(w.ns)
    assert time.monotonic() - t0 < 5

    # an editor's save: write a temp file, rename it over the original -> exactly one sync
    mark = len(w.lines)
    tmp = w.manifests / "endpointslices.yaml.swp~"
    tmp.write_text(p.read_text().replace("10.244.0.77", "10.244.0.78"))
    os.replace(tmp, p)
    s = w.wait_sync(mark)
    assert s["servicesChanged"] == ["~default/web"]
    time.sleep(0.8)  # a second sync would come within debounce + minSyncPeriod
    assert len(w.events("sync", mark)) == 1, w.events("sync", mark)
    assert_clean(w.manifests, w.state, w.ns, w.config)

    # a concurrent apply fails fast and names the watch process (the lock is held for its lifetime)
    t0 = time.monotonic()
    a = run("apply", str(w.manifests), state=w.state, ns=w.ns, config=w.config)
    assert a.returncode == 1 and time.monotonic() - t0 < 10
    assert f"pid {w.proc.pid}" in a.stderr and "watch" in a.stderr, a.stderr

    # SIGTERM: exit 0, the rules stay
    assert w.stop() == 0
    assert "10.244.0.78" in listing(w.ns)
    assert w.find("stop")


def _affinity_id(ns: str, endpoint: str) -> str:
    """`HI . LO`: the shared affinity set's id of default/sticky's endpoint chain for `endpoint`."""
    m = re.search(r"chain endpoint-\S+/sticky/\S+__" + re.escape(endpoint) + r"/8080 \{\s*update @affinity-clients"
                  r" \{ ip saddr \. numgen random mod 1 offset (\d+) \. numgen random mod 1 offset (\d+)", listing(ns))
    assert m, listing(ns)
    return f"{m.group(1)} . {m.group(2)}"


@pytest.mark.kernel
def test_a_removed_affinity_endpoint_loses_its_clients(watched):
    """The sync after an endpoint of an affinity Service goes deletes that endpoint's
    entries from the shared affinity set (engine/sync.forget_affinity_clients), only those."""
    needs_nft_spelling("shared_affinity")
    w = watched
    w.wait_sync(0, kind="full")
    gone, kept = _affinity_id(w.ns, "10.244.0.51"), _affinity_id(w.ns, "10.244.0.52")
    in_ns(w.ns, "nft", "add", "element", "ip", "nftrec", "affinity-clients",
          f"{{ 198.51.100.7 . {gone} timeout 600s, 198.51.100.7 . {kept} timeout 600s }}")
    mark = len(w.lines)
    p = w.manifests / "endpointslices.yaml"
    p.write_text(p.read_text().replace("  - addresses: [10.244.0.51]\n", "", 1))
    # (the elements added above are another process's commit: a full sync with nothing to
    # repair may come first)
    s = w.wait_sync(mark, servicesChanged=["~default/sticky"])
    assert w.wait_event("affinity", mark)["deleted"] == 1
    text = listing(w.ns)
    assert f"198.51.100.7 . {gone} " not in text and f"198.51.100.7 . {kept} " in text
    # the cleanup's own commit is accounted for: the next sync still trusts its memory
    mark = len(w.lines)
    p.write_text(p.read_text().replace("10.244.0.52", "10.244.0.53", 1))
    s = w.wait_sync(mark)
    assert s["kind"] == "partial" and w.wait_event("affinity", mark)["deleted"] == 1, s
    assert_clean(w.manifests, w.state, w.ns, w.config)


def git_sync_watch(netns: str, tmp_path: Path) -> tuple[Path, "Watch"]:
    """A git-sync layout (`srv/current -> rev-A`, edge-small) watched by a daemon."""
    root = tmp_path / "srv"
    root.mkdir()
    shutil.copytree(EDGE, root / REV_A)
    (root / "current").symlink_to(REV_A)
    return root, Watch(netns, root / "current", short_config(tmp_path), tmp_path / "state")


@pytest.mark.kernel
def test_git_sync_swap_is_one_revision(netns, tmp_path):
    root, w = git_sync_watch(netns, tmp_path)
    try:
        w.wait_sync(0, revision="a" * 40)
        # rev-B renames shop/api's port in the Service AND its slice: either file alone
        # is invalid (the named targetPort resolves through the slice port's name)
        shutil.copytree(root / REV_A, root / REV_B)
        svc, eps = root / REV_B / "services.yaml", root / REV_B / "endpointslices.yaml"
        svc.write_text(svc.read_text().replace("- name: https\n      port: 443\n      targetPort: https",
                                               "- name: tls\n      port: 443\n      targetPort: tls"))
        eps.write_text(eps.read_text().replace("- name: https\n    port: 8443", "- name: tls\n    port: 8443"))
        mark = len(w.lines)
        (root / "tmp-link").symlink_to(REV_B)
        os.replace(root / "tmp-link", root / "current")  # mv -T: the atomic swap
        s = w.wait_sync(mark, revision="b" * 40)
        assert s["servicesChanged"] == ["~shop/api"], s
        assert not w.find("invalid", mark) and not [x for x in w.lines[mark:] if x.get("level") == "error"]
        assert "/tls" in listing(netns)
        st = w.status(lambda st: st["lastAppliedRevision"] == "b" * 40)
        # git-sync removes the old worktree; nothing happens
        shutil.rmtree(root / REV_A)
        time.sleep(0.5)
        assert not w.find("invalid", mark)
        assert w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()


@pytest.mark.kernel
def test_invalid_revision_keeps_last_good_and_metrics(watched):
    w = watched
    w.wait_sync(0, kind="full")
    code, body = w.http("/healthz")
    assert code == 200, body
    before = listing(w.ns)
    svc = w.manifests / "services.yaml"
    good = svc.read_text()
    mark = len(w.lines)
    svc.write_text(good.replace("port: 80\n", "port: 70000\n", 1))
    bad = w.wait(lambda: w.find("invalid", mark), what="the invalid revision")
    problems = [x for x in w.lines[mark:] if x.get("severity") == "error"]
    assert problems and problems[0]["file"].endswith("services.yaml") and problems[0]["line"] > 0
    assert listing(w.ns) == before  # the last good ruleset stays
    st = w.status(lambda st: st["lastAttemptedRevision"] == bad["revision"])
    assert st["lastAttemptedRevision"] == bad["revision"] != st["lastAppliedRevision"]
    code, body = w.http("/healthz")  # the last good ruleset is live: healthy, and the refusal is named
    from reconciler.engine import short_revision

    assert code == 200 and f"revision {short_revision(bad['revision'])} was refused (invalid)" in body, body
    _, metrics = w.http("/metrics")
    assert 'nftrec_revision_refused{reason="invalid"} 1.0' in metrics
    assert 'nftrec_revision_refused{reason="unverified"} 0.0' in metrics
    alert = [NFTREC, "--state-dir", str(w.state), "status", "--detailed-exitcode", "--netns", w.ns,
             "--config", str(w.config)]
    p = subprocess.run(alert, capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "attempted: revision" in p.stdout, p.stdout + p.stderr
    assert f'nftrec_attempted_revision_info{{revision="{bad["revision"]}"}} 1.0' in metrics
    assert f'nftrec_applied_revision_info{{revision="{st["lastAppliedRevision"]}"}} 1.0' in metrics

    mark = len(w.lines)
    svc.write_text(good.replace("port: 80\n", "port: 81\n", 1))
    s = w.wait_sync(mark)
    assert s["servicesChanged"] == ["~default/web"]
    code, body = w.http("/healthz")
    assert code == 200 and "refused" not in body, body
    assert 'nftrec_revision_refused{reason="invalid"} 0.0' in w.http("/metrics")[1]
    st = w.status(lambda st: st["lastAppliedRevision"] == s["revision"])
    assert subprocess.run(alert, capture_output=True, text=True, timeout=60).returncode == 0
    assert st["lastAttemptedRevision"] == st["lastAppliedRevision"] == s["revision"]

    _, m = w.http("/metrics")
    values = {}
    for line in m.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    assert values['nftrec_sync_duration_seconds_count{kind="full"}'] >= 1
    assert values['nftrec_sync_duration_seconds_count{kind="partial"}'] >= 1
    assert 0 < values['nftrec_sync_duration_seconds_sum{kind="partial"}'] < 10
    assert abs(values["nftrec_last_sync_timestamp_seconds"] - time.time()) < 30
    assert values["nftrec_sync_failures_total"] == 0
    rules_ip = sum(1 for ln in listing(w.ns).splitlines() if ln.strip() and not ln.strip().startswith(
        ("table", "chain", "set", "map", "type", "flags", "elements", "comment", "}", "timeout", "hook")))
    assert values['nftrec_rules{family="ip"}'] > 10 and values['nftrec_set_elements{family="ip"}'] > 5
    assert rules_ip > 0
    assert f'nftrec_applied_revision_info{{revision="{s["revision"]}"}} 1.0' in m
    assert "nftrec_drift_repairs_total 0.0" in m and "nftrec_conntrack_entries_deleted_total" in m
    assert w.stop() == 0


@pytest.mark.kernel
def test_drift_repaired_by_full_sync(netns, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(EDGE, d)
    cfg = short_config(tmp_path, fullSyncPeriod="2s")
    w = Watch(netns, d, cfg, tmp_path / "state")
    try:
        w.wait_sync(0, kind="full")
        chain = next(ln.split()[1] for ln in listing(netns).splitlines()
                     if ln.strip().startswith("chain service-") and "default/web" in ln)
        out = in_ns(netns, "nft", "-a", "list", "chain", "ip", "nftrec", chain).stdout
        handle = re.findall(r"# handle (\d+)", out)[-1]
        mark = len(w.lines)
        in_ns(netns, "nft", "delete", "rule", "ip", "nftrec", chain, "handle", handle)
        drift = w.wait(lambda: w.find("drift", mark), timeout=10, what="the drift repair")
        assert drift["objects"] >= 1 and "default/web" in drift["services"]
        w.wait_sync(mark, kind="full")
        assert_clean(d, w.state, netns, cfg)
        _, m = w.http("/metrics")
        assert "nftrec_drift_repairs_total 1.0" in m or "nftrec_drift_repairs_total 2.0" in m
        assert w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()


@pytest.mark.kernel
def test_invalid_first_revision_then_fixed_and_sighup(netns, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(EDGE, d)
    svc = d / "services.yaml"
    good = svc.read_text()
    svc.write_text(good.replace("clusterIP: 10.96.0.10", "clusterIP: 10.96.0.300"))
    cfg = short_config(tmp_path)
    w = Watch(netns, d, cfg, tmp_path / "state")
    try:
        w.wait(lambda: w.find("invalid"), what="the invalid first revision")
        time.sleep(0.3)
        assert in_ns(netns, "nft", "list", "tables").stdout.strip() == ""  # kernel untouched
        assert w.http("/healthz")[0] == 503
        mark = len(w.lines)
        svc.write_text(good)
        w.wait_sync(mark, kind="full")
        assert w.http("/healthz")[0] == 200
        assert_clean(d, w.state, netns, cfg)

        # SIGHUP with a changed node config: re-read and applied in a full sync
        cfg.write_text(cfg.read_text().replace("masqueradeAll: false", "masqueradeAll: true"))
        mark = len(w.lines)
        w.proc.send_signal(signal.SIGHUP)
        s = w.wait_sync(mark, kind="full")
        assert s["operations"] > 0
        assert_clean(d, w.state, netns, cfg)
        assert w.stop() == 0
        assert "nftrec" in in_ns(netns, "nft", "list", "tables").stdout  # rules stay
    finally:
        if w.proc.poll() is None:
            w.proc.kill()


@pytest.mark.kernel
def test_same_content_revision_is_recorded(netns, tmp_path):
    """git-sync publishes a commit that changed no manifest: the kernel stays, but the new
    revision is the applied one (the input digest alone must not hide it)."""
    root, w = git_sync_watch(netns, tmp_path)
    try:
        w.wait_sync(0, revision="a" * 40)
        shutil.copytree(root / REV_A, root / REV_B)
        mark = len(w.lines)
        (root / "tmp-link").symlink_to(REV_B)
        os.replace(root / "tmp-link", root / "current")
        s = w.wait_sync(mark, revision="b" * 40)
        assert s["operations"] == 0 and s["servicesChanged"] == []
        st = w.status(lambda st: st["lastAppliedRevision"] == "b" * 40)
        assert st["lastAppliedRevision"] == st["lastAttemptedRevision"] == "b" * 40
        assert w.stop() == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()


@pytest.mark.kernel
def test_unwritable_state_dir_and_deleted_namespace(watched):
    """State writes failing: the kernel is still reconciled, one clear error, no traceback.
    The namespace deleted under the daemon: a clear error and exit 1, not a silent sync of
    an orphaned namespace."""
    w = watched
    w.wait_sync(0, kind="full")
    w.status(lambda st: st.get("lastAppliedRevision"))  # recorded after the sync line (statewriter.py)
    tables = next(w.state.rglob("tables"))
    shutil.rmtree(tables)
    tables.write_text("not a directory")  # root ignores modes: make writes fail another way
    p = w.manifests / "endpointslices.yaml"
    for ip in ("10.244.0.71", "10.244.0.72"):
        mark = len(w.lines)
        p.write_text(re.sub(r"10\.244\.0\.(12|7\d)\]", ip + "]", p.read_text()))
        w.wait_sync(mark, kind="partial")
        w.wait(lambda: ip in listing(w.ns), what=f"{ip} in the kernel")
    w.wait(lambda: w.find("state"), what="the failed state write")
    time.sleep(1.5)  # any further write (deferred while idle < statewriter.IDLE) is not logged again
    errors = [x for x in w.lines if x.get("event") == "state" and x.get("ok") is False]
    assert len(errors) == 1 and "cannot record the state" in errors[0]["msg"], errors
    tables.unlink()
    mark = len(w.lines)
    p.write_text(p.read_text().replace("10.244.0.72]", "10.244.0.73]"))
    w.wait_sync(mark, kind="partial")
    w.wait(lambda: w.find("state", mark), what="the state dir writable again")
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)

    in_ns(w.ns, "true")
    subprocess.run(["ip", "netns", "del", w.ns], check=True)
    p.write_text(p.read_text().replace("10.244.0.73]", "10.244.0.74]"))
    rc = w.proc.wait(timeout=10)
    w._t.join(5)
    assert rc == 1
    assert any(x.get("event") == "netns" and "was deleted" in x.get("msg", "") for x in w.lines), "".join(w.raw)
    assert not any("Traceback" in line for line in w.raw), "".join(w.raw)
