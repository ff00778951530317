"""A crash loop against the real kernel: `watch` killed with SIGKILL every 3 s and restarted
while a new revision arrives every 0.2 s (git-sync's symlink swap). The commit record
(engine/commits.py) keeps what the kernel holds: `status` names it at once after every
kill, and after convergence `apply --rollback` goes back to an earlier committed revision.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nsutil import EXAMPLES, in_ns
from test_watch import short_config
from watchproc import NFTREC, Watch

EDGE = EXAMPLES / "edge-small"
SLICES = "endpointslices.yaml"
ORIGINAL = "10.244.1.21"  # shop/api's endpoint; revision i moves it to address(i)
RUN, EVERY, KILL_EVERY = 30.0, 0.2, 3.0


def address(i: int) -> str:
    return f"10.244.{200 + i // 250}.{1 + i % 250}"


def revision(i: int) -> str:
    return f"{i:040x}"  # the worktree `rev-<sha>` names the revision (intake/git.py)


def publish(root: Path, i: int) -> Path:
    """Revision i as a new worktree, swapped in atomically (ln -s + rename, as git-sync)."""
    rev = root / f"rev-{revision(i)}"
    shutil.copytree(EDGE, rev)
    p = rev / SLICES
    p.write_text(p.read_text().replace(ORIGINAL, address(i)))
    (root / "tmp-link").symlink_to(rev.name)
    os.replace(root / "tmp-link", root / "current")
    return rev


def kernel_revision(ns: str) -> int | None:
    """Which revision's endpoint the kernel holds; None without nftrec's table."""
    p = in_ns(ns, "nft", "list", "table", "ip", "nftrec", check=False)
    if p.returncode != 0:
        return None
    found = {(int(a), int(b)) for a, b in re.findall(r"10\.244\.(2\d\d)\.(\d+)", p.stdout)}
    assert len(found) == 1, found
    a, b = found.pop()
    return (a - 200) * 250 + b - 1


def nftrec(state: Path, ns: str, config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NFTREC, "--state-dir", str(state), *args, "--netns", ns, "--config", str(config)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})


def kill(w: Watch) -> None:
    """SIGKILL, as an OOM killer does; waited for (the kernel releases the lock)."""
    if w.proc.poll() is None:
        w.proc.kill()
        w.proc.wait()


def status(state: Path, ns: str, config: Path) -> tuple[int, dict | None, str]:
    p = nftrec(state, ns, config, "status", "-o", "json")
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else None), p.stderr


@pytest.mark.kernel
def test_crash_loop_status_and_rollback(netns, tmp_path):
    root, state, cfg = tmp_path / "srv", tmp_path / "state", short_config(tmp_path)
    root.mkdir()
    publish(root, 0)
    w = Watch(netns, root / "current", cfg, state, metrics=False)
    kills, named, i = 0, 0, 0
    try:
        start = time.monotonic()
        next_kill = start + KILL_EVERY
        while time.monotonic() - start < RUN:
            i += 1
            publish(root, i)
            if time.monotonic() >= next_kill:
                kill(w)
                kills += 1
                held = kernel_revision(netns)
                rc, st, err = status(state, netns, cfg)  # at once: no state writer ran for this life
                if held is not None:
                    # something was applied: never "nothing was applied"; exit 0 names what the
                    # kernel holds (exit 2 only if killed between a commit and its record)
                    assert rc in (0, 2), err
                    if rc == 0:
                        assert st["lastAppliedRevision"] == revision(held) and st["drift"] is False, st
                        named += 1
                w = Watch(netns, root / "current", cfg, state, metrics=False)
                next_kill = time.monotonic() + KILL_EVERY
            time.sleep(max(0.0, start + i * EVERY - time.monotonic()))
        final = i
        w.wait_sync(0, revision=revision(final))
        assert kernel_revision(netns) == final
        rc, st, err = status(state, netns, cfg)  # no sleep: the state writer may not have run yet
        assert rc == 0, err
        assert st["lastAppliedRevision"] == revision(final) and st["drift"] is False, st
        assert kills >= 8 and named >= kills // 2, (kills, named)

        kill(w)  # one more kill -9, then roll back with whatever was recorded
        p = nftrec(state, netns, cfg, "apply", "--rollback")
        assert p.returncode == 0, p.stdout + p.stderr
        rc, st, err = status(state, netns, cfg)
        assert rc == 0, err
        back = int(st["lastAppliedRevision"], 16)
        assert back < final and kernel_revision(netns) == back, (back, final)
        # the kernel holds exactly that revision's ruleset
        p = nftrec(state, netns, cfg, "plan", str(root / f"rev-{revision(back)}"), "--refresh",
                   "--detailed-exitcode")
        assert p.returncode == 0 and "No changes" in p.stdout, p.stdout + p.stderr
    finally:
        kill(w)


@pytest.mark.kernel
def test_status_of_a_commit_the_state_writer_never_recorded(netns, tmp_path):
    """Killed right after a sync line (the state writer waits for idle time): status names
    the commit from the record alone; a foreign commit since makes the drift unknown (the
    ruleset is not on disk), and the next watch records its own commit as usual."""
    root, state, cfg = tmp_path / "srv", tmp_path / "state", short_config(tmp_path)
    root.mkdir()
    publish(root, 0)
    w = Watch(netns, root / "current", cfg, state, metrics=False)
    try:
        w.wait_sync(0, revision=revision(0))
        mark = len(w.lines)
        publish(root, 1)
        w.wait_sync(mark, revision=revision(1))
        kill(w)
        p = nftrec(state, netns, cfg, "status")
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"revision {revision(1)[:12]}" in p.stdout and "committed by nftrec watch" in p.stdout
        assert "drift:     no" in p.stdout and "nothing was applied" not in p.stdout + p.stderr

        in_ns(netns, "nft", "add", "chain", "ip", "nftrec", "stray")  # another writer commits
        p = nftrec(state, netns, cfg, "status")
        assert p.returncode == 2 and "drift:     unknown" in p.stdout, p.stdout + p.stderr

        w = Watch(netns, root / "current", cfg, state, metrics=False)
        w.wait_sync(0, revision=revision(1))
        assert "stray" not in in_ns(netns, "nft", "list", "table", "ip", "nftrec").stdout
        st = w.status(lambda st: "commit" not in st)  # the state writer's record
        assert st["lastAppliedRevision"] == revision(1) and st["drift"] is False
        assert w.find("state") and "not kept" in w.find("state")["msg"]
        assert w.stop() == 0
    finally:
        kill(w)
