"""Status records on a real git remote: a bare repository served by `git daemon
--enable=receive-pack` on 127.0.0.1 (started here, always stopped), and a file:// remote.
20 nodes pushing at once lose no record and each ref's log is its node's records in
order; an unreachable or hung remote delays no enqueue, and the queued records arrive once
the daemon is back, across a restart of the channel; git ignores every config and program
planted in the environment or in the remote; parse_record refuses forged records.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from reconciler.engine import StatusChannel, StatusSettings, fetch_records, parse_record, record_json
from reconciler.engine.statusgit import StatusGitError, check_key, check_remote
from reconciler.intake import Record

FAST = (0.05, 0.3)  # backoff (first, cap) seconds: tests do not wait through real backoff


CLEAN_ENV = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def git(repo: Path, *args: str) -> str:
    """The test's own git, on a repository it made (never the planted environment)."""
    env = CLEAN_ENV
    return subprocess.run(["git", "--git-dir", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def bare(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


def record(node: str, i: int, outcome: str = "applied", **kw) -> Record:
    fields = dict(node=node, labels=(("ring", "canary"), ("site", "lyon")), wave="canary", applied=f"rev{i}",
                  attempted=f"rev{i}", outcome=outcome, error="", time=1_800_000_000.0 + i)
    fields.update(kw)
    return Record(**fields)


def log_of(repo: Path, node: str) -> list[Record]:
    """The node's ref's records, oldest first, each commit's only file parsed."""
    ref = f"refs/nftrec/status/{node}"
    out = []
    for commit in git(repo, "rev-list", "--reverse", ref).split():
        assert git(repo, "ls-tree", "--name-only", commit).split() == ["status.json"]
        out.append(parse_record(git(repo, "cat-file", "blob", f"{commit}:status.json").encode(), ref))
    assert None not in out
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`git daemon --enable=receive-pack` serving `base` on 127.0.0.1:port."""

    def __init__(self, base: Path, port: int | None = None):
        self.base, self.port, self.proc = base, port or free_port(), None

    @property
    def url(self) -> str:
        return f"git://127.0.0.1:{self.port}/status.git"

    def start(self) -> "Daemon":
        self.proc = subprocess.Popen(
            ["git", "daemon", "--enable=receive-pack", "--export-all", "--reuseaddr", f"--base-path={self.base}",
             "--listen=127.0.0.1", f"--port={self.port}", "--informative-errors", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CLEAN_ENV)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "git daemon did not start"
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def daemon(tmp_path):
    bare(tmp_path / "served" / "status.git")
    d = Daemon(tmp_path / "served").start()
    try:
        yield d
    finally:
        d.stop()


def wait_for(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def channel(state: Path, remote: str, ssh_key: str | None = None) -> StatusChannel:
    return StatusChannel(state, StatusSettings(remote, ssh_key), backoff=FAST)


# --- records -----------------------------------------------------------------------------


def test_record_json_is_canonical_and_parses_back():
    r = record("edge-1", 3, outcome="failed", error="health check\n\x1b[31mred\u202e", time=1_800_000_000.25)
    raw = record_json(r)
    doc = json.loads(raw)
    assert raw == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert set(doc) == {"node", "labels", "wave", "applied", "attempted", "outcome", "error", "time"}
    assert doc["time"] == "2027-01-15T08:00:00.250Z" and doc["labels"] == {"ring": "canary", "site": "lyon"}
    back = parse_record(raw, "refs/nftrec/status/edge-1")
    assert back == Record("edge-1", r.labels, "canary", "rev3", "rev3", "failed",
                          "health check\\n\\x1b[31mred\\u202e", 1_800_000_000.25)
    assert parse_record(record_json(record("edge-1", 1, error="x" * 100_000)), "edge-1").error == "x" * 1024
    for name in ("Edge_1", "edge.lock", "a" * 254, ""):  # not a nodeName, or not a ref's last component
        with pytest.raises(ValueError):
            record_json(record(name, 1))
    with pytest.raises(ValueError):
        record_json(record("edge-1", 1, outcome="exploded"))


def _forged(**changes) -> bytes:
    doc = json.loads(record_json(record("edge-1", 1)))
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("raw", [
    _forged(node="edge-2"),  # another node's record under edge-1's ref
    _forged(outcome="applied-ish"),
    _forged(time="2027-01-15 08:00:00"),
    _forged(time="2027-13-15T08:00:00Z"),
    _forged(time=1800000000),
    _forged(error="\x1b]0;owned\x07"),
    _forged(wave="a\u2028b"),
    _forged(applied=["rev1"]),
    _forged(applied="r" * 1025),
    _forged(labels={"ring": "canary; drop"}),
    _forged(labels={f"k{i}": "v" for i in range(65)}),
    _forged(labels=[["ring", "canary"]]),
    _forged(extra="field"),
    json.dumps({"node": "edge-1"}).encode(),
    b'{"node":"edge-1","node":"edge-1"}',
    _forged(error="x" * 20_000),  # over the byte cap
    b"[" * 100_000 + b"]" * 100_000,
    b"\xff\xfe",
    b"NaN",
    record_json(record("edge-1", 1)).replace(b'"time"', b'"time":NaN,"x"'),
], ids=lambda raw: repr(raw[:40]))
def test_parse_record_refuses_forged(raw):
    assert parse_record(raw, "refs/nftrec/status/edge-1") is None


def test_parse_record_refuses_a_misnamed_ref():
    raw = record_json(record("edge-1", 1))
    assert parse_record(raw, "refs/nftrec/status/edge-1") is not None
    for ref in ("refs/nftrec/status/edge-2", "refs/nftrec/status/x/edge-1", "refs/nftrec/status/", "EDGE-1"):
        assert parse_record(raw, ref) is None


# --- pushing -----------------------------------------------------------------------------


def test_file_remote_log_is_the_nodes_records_in_order(tmp_path):
    remote = bare(tmp_path / "status.git")
    ch = channel(tmp_path / "state", f"file://{remote}")
    sent = [record("edge-1", i) for i in range(5)]
    for r in sent:
        ch.enqueue(r)
    assert ch.flush(30)
    ch.stop()
    assert log_of(remote, "edge-1") == sent
    records, why = fetch_records(f"file://{remote}")
    assert why is None and records == (sent[-1],)


def test_repeats_coalesce_to_the_latest(tmp_path):
    """An outcome repeated while nothing is pushed is queued once, at its latest time;
    a different outcome in between is kept."""
    remote = bare(tmp_path / "status.git")
    ch = channel(tmp_path / "state", f"file://{remote}")
    for t in range(3):
        ch.enqueue(record("edge-1", 1, outcome="held", time=1_800_000_000.0 + t))
    ch.enqueue(record("edge-1", 1, outcome="applied", time=1_800_000_010.0))
    ch.enqueue(record("edge-1", 1, outcome="held", time=1_800_000_020.0))
    assert ch.pending == 5
    assert ch.flush(30)
    ch.stop()
    assert [(r.outcome, r.time) for r in log_of(remote, "edge-1")] == [
        ("held", 1_800_000_002.0), ("applied", 1_800_000_010.0), ("held", 1_800_000_020.0)]


@pytest.mark.parametrize("served", ["git-daemon", "file"])
def test_twenty_nodes_at_once_lose_nothing(tmp_path, served, request):
    """20 nodes, each its own channel and state directory, push 6 records each at the same
    time (through git daemon, or to a file:// remote): every ref's log is exactly its
    node's records, in order."""
    if served == "file":
        remote, url = bare(tmp_path / "status.git"), f"file://{tmp_path}/status.git"
    else:
        daemon = request.getfixturevalue("daemon")
        remote, url = daemon.base / "status.git", daemon.url
    nodes = [f"edge-{i:03d}" for i in range(20)]
    channels = {n: channel(tmp_path / "state" / n, url) for n in nodes}
    sent = {n: [record(n, i, outcome="applied" if i % 2 else "held") for i in range(6)] for n in nodes}
    for ch in channels.values():
        ch.start()
    try:
        def node_pushes(n):
            for r in sent[n]:
                channels[n].enqueue(r)
                time.sleep(0.01)
        threads = [threading.Thread(target=node_pushes, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(lambda: all(ch.pending == 0 for ch in channels.values()), 120, "every queue sent")
    finally:
        for ch in channels.values():
            ch.stop()
    for n in nodes:
        assert log_of(remote, n) == sent[n], n
    records, why = fetch_records(url)
    assert why is None and records == tuple(sent[n][-1] for n in nodes)


def test_two_processes_on_one_queue_send_each_record_once(tmp_path):
    """A watch and a one-shot run of one node share the state directory's queue: one of
    them pushes at a time, and every record lands exactly once, in order."""
    remote = bare(tmp_path / "status.git")
    a, b = (channel(tmp_path / "state", f"file://{remote}") for _ in range(2))
    a.start()
    b.start()
    try:
        for i in range(20):
            (a if i % 2 else b).enqueue(record("edge-1", i))
            time.sleep(0.005)
        wait_for(lambda: a.pending == 0, 60, "the shared queue sent")
    finally:
        a.stop()
        b.stop()
    assert [r.applied for r in log_of(remote, "edge-1")] == [f"rev{i}" for i in range(20)]


def test_a_moved_ref_is_built_upon(tmp_path):
    """Another writer (or a node that lost its state directory) moved the ref: the next
    push fetches it and puts its records on top, never replacing the history."""
    remote = bare(tmp_path / "status.git")
    url = f"file://{remote}"
    first = channel(tmp_path / "state-a", url)
    first.enqueue(record("edge-1", 1))
    assert first.flush(30)
    first.stop()
    second = channel(tmp_path / "state-b", url)  # a fresh state directory: no memory of the tip
    second.enqueue(record("edge-1", 2))
    assert second.flush(30)
    second.stop()
    assert log_of(remote, "edge-1") == [record("edge-1", 1), record("edge-1", 2)]


# --- an unreachable remote ---------------------------------------------------------------


def test_unreachable_remote_delays_nothing_and_records_arrive_when_back(tmp_path):
    """The daemon is down: enqueue returns at once, the records stay queued, also across a
    restart of the channel (a new process), and arrive in order once the daemon is back."""
    bare(tmp_path / "served" / "status.git")
    d = Daemon(tmp_path / "served")
    state = tmp_path / "state"
    ch = channel(state, d.url)
    ch.start()
    sent = [record("edge-1", i) for i in range(4)]
    try:
        for r in sent[:2]:
            t0 = time.monotonic()
            ch.enqueue(r)
            assert time.monotonic() - t0 < 0.5
        wait_for(lambda: ch.last_error is not None, 30, "a failed push")
        assert "git" in ch.last_error and ch.pending == 2
        ch.stop()
        ch = channel(state, d.url)  # a restart: the queue is on disk
        assert ch.pending == 2
        ch.start()
        for r in sent[2:]:
            ch.enqueue(r)
        d.start()
        wait_for(lambda: ch.pending == 0, 60, "the queue sent once the daemon is back")
        assert ch.last_error is None
    finally:
        ch.stop()
        d.stop()
    assert log_of(tmp_path / "served" / "status.git", "edge-1") == sent


def test_hung_remote_blocks_no_enqueue_and_stop_kills_git(tmp_path):
    """A remote that accepts the connection and never answers: the pusher's git hangs,
    enqueue still returns at once, and stop() ends the hung git promptly."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # never accepted: the connection opens, nothing is ever said
    try:
        ch = channel(tmp_path / "state", f"git://127.0.0.1:{hole.getsockname()[1]}/status.git")
        ch.start()
        ch.enqueue(record("edge-1", 0))
        time.sleep(0.5)  # the pusher is now inside git, waiting on the remote
        t0 = time.monotonic()
        for i in range(1, 50):
            ch.enqueue(record("edge-1", i))
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        ch.stop(timeout=5)
        assert time.monotonic() - t0 < 3.0
        assert ch.pending == 50
    finally:
        hole.close()


def test_fetch_records_of_an_unreachable_remote_says_why(tmp_path):
    records, why = fetch_records(f"git://127.0.0.1:{free_port()}/status.git", timeout=10)
    assert records == () and "cannot read the status records of git://127.0.0.1" in why
    records, why = fetch_records(f"file://{tmp_path}/none.git")
    assert records == () and "does not appear to be a git repository" in why


# --- reading ---------------------------------------------------------------------------------


def test_fetch_records_reads_only_status_refs_and_skips_bad_ones(tmp_path):
    remote = bare(tmp_path / "status.git")
    url = f"file://{remote}"
    ch = channel(tmp_path / "state", url)
    for n in ("edge-1", "edge-2"):
        ch.enqueue(record(n, 1))
    assert ch.flush(30)
    ch.stop()
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)

    def plant(ref: str, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            (work / name).write_bytes(data)
        subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(work), "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", ref],
                       check=True)
        subprocess.run(["git", "-C", str(work), "push", "-q", url, f"HEAD:{ref}"], check=True)
        subprocess.run(["git", "-C", str(work), "rm", "-qr", "."], check=True)

    plant("refs/nftrec/status/edge-3", {"status.json": record_json(record("edge-4", 1))})  # misnamed
    plant("refs/nftrec/status/edge-5", {"status.json": b" " * (1 << 20) + record_json(record("edge-5", 1))})
    plant("refs/nftrec/status/edge-6", {"other.json": record_json(record("edge-6", 1))})
    plant("refs/nftrec/status/a/edge-7", {"status.json": record_json(record("edge-7", 1))})
    plant("refs/heads/main", {"status.json": record_json(record("main", 1))})
    records, why = fetch_records(url)
    assert why is None and [r.node for r in records] == ["edge-1", "edge-2"]
    records, why = fetch_records(f"file://{bare(tmp_path / 'empty.git')}")
    assert (records, why) == ((), None)


# --- nftrec's own git only -----------------------------------------------------------------


def test_git_ignores_configs_and_programs_planted_in_the_environment(tmp_path, daemon, monkeypatch):
    """HOME's .gitconfig, XDG's git/config, GIT_CONFIG_GLOBAL/SYSTEM, GIT_CONFIG_PARAMETERS,
    GIT_SSH_COMMAND and GIT_DIR all name a trap (url.insteadOf to another remote,
    core.sshCommand, a credential helper, hooks): the records go to the real remote and no
    trap runs."""
    marker = tmp_path / "marker"
    trap = tmp_path / "trap.sh"
    trap.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 1\n')
    trap.chmod(0o755)
    decoy = bare(tmp_path / "decoy.git")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("pre-push", "reference-transaction", "post-checkout"):
        (hooks / hook).symlink_to(trap)
    evil = (f'[url "file://{decoy}"]\n\tinsteadOf = {daemon.url}\n\tinsteadOf = git://127.0.0.1\n'
            f'[core]\n\tsshCommand = {trap}\n\thooksPath = {hooks}\n\tfsmonitor = {trap}\n'
            f'[credential]\n\thelper = !{trap}\n[protocol]\n\tallow = always\n')
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".gitconfig").write_text(evil)
    (home / ".config" / "git" / "config").write_text(evil)
    (tmp_path / "evil.config").write_text(evil)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "evil.config"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(tmp_path / "evil.config"))
    monkeypatch.setenv("GIT_CONFIG", str(tmp_path / "evil.config"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'url.file://{decoy}.insteadof'='{daemon.url}'")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.sshCommand")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(trap))
    monkeypatch.setenv("GIT_SSH_COMMAND", str(trap))
    monkeypatch.setenv("GIT_SSH", str(trap))
    monkeypatch.setenv("GIT_ASKPASS", str(trap))
    monkeypatch.setenv("GIT_DIR", str(decoy))
    monkeypatch.setenv("GIT_EXEC_PATH", str(tmp_path))
    ch = channel(tmp_path / "state", daemon.url)
    ch.enqueue(record("edge-1", 1))
    assert ch.flush(30), ch.last_error
    ch.stop()
    assert log_of(daemon.base / "status.git", "edge-1") == [record("edge-1", 1)]
    records, why = fetch_records(daemon.url)
    assert why is None and records == (record("edge-1", 1),)
    # ssh: the planted core.sshCommand / GIT_SSH_COMMAND never run (the port is closed)
    records, why = fetch_records(f"ssh://127.0.0.1:{free_port()}/status.git", timeout=20)
    assert records == () and why
    assert not decoy.joinpath("refs/nftrec").exists()
    assert not marker.exists(), marker.read_text()


def test_a_file_remote_runs_none_of_its_hooks(tmp_path):
    """A file:// remote's receive-pack runs on this host: its hooks (in hooks/ or where its
    config's core.hooksPath says) never run."""
    remote = bare(tmp_path / "status.git")
    marker = tmp_path / "marker"
    other = tmp_path / "other-hooks"
    other.mkdir()
    for d in (remote / "hooks", other):
        for hook in ("pre-receive", "update", "post-receive", "post-update", "reference-transaction",
                     "proc-receive", "push-to-checkout"):
            (d / hook).write_text(f'#!/bin/sh\necho "{hook}" >> {marker}\n')
            (d / hook).chmod(0o755)
    ch = channel(tmp_path / "state", f"file://{remote}")
    ch.enqueue(record("edge-1", 1))
    assert ch.flush(30), ch.last_error
    git(remote, "config", "core.hooksPath", str(other))
    ch.enqueue(record("edge-1", 2))
    assert ch.flush(30), ch.last_error
    ch.stop()
    assert len(log_of(remote, "edge-1")) == 2
    assert not marker.exists(), marker.read_text()


def test_a_file_remote_of_another_user_is_refused(tmp_path):
    """A file:// remote's receive-pack runs here under that repository's config, which
    can name programs: a repository (or its config) that another user owns is refused
    with what to do, and nothing is pushed there."""
    remote = bare(tmp_path / "status.git")
    os.chown(remote / "config", 65534, 65534)
    records, why = fetch_records(f"file://{remote}", timeout=30)
    assert records == () and "config belongs to uid 65534" in why and "ssh://" in why
    ch = channel(tmp_path / "state", f"file://{remote}")
    ch.enqueue(record("edge-1", 1))
    assert not ch.flush(3) and "belongs to uid 65534" in ch.last_error
    ch.stop()
    assert git(remote, "for-each-ref") == ""
    os.chown(remote / "config", os.getuid(), os.getgid())  # given back: the queued record goes out
    ch = channel(tmp_path / "state", f"file://{remote}")
    assert ch.flush(30), ch.last_error
    ch.stop()
    assert [r.time for r in log_of(remote, "edge-1")] == [record("edge-1", 1).time]


@pytest.mark.parametrize("remote", [
    "ext::sh -c touch% /tmp/owned", "fd::3", "-uhttps://x/y", "/srv/status.git", "status.git", "http://x/y.git",
    "https://x/y.git\n", "host:path", "git@-oProxyCommand=x:repo", "ssh://x/y z",
])
def test_remotes_git_could_misuse_are_refused(remote, tmp_path):
    with pytest.raises(StatusGitError):
        check_remote(remote)
    records, why = fetch_records(remote)
    assert records == () and "is not a git URL" in why


@pytest.mark.parametrize("key", ["relative/key", "/keys/id ed25519", "/keys/$(touch x)", "/keys/a;b", "/keys/'q'",
                                 "/keys/a\nb"])
def test_odd_key_paths_are_refused(key):
    with pytest.raises(StatusGitError):
        check_key(key)


def test_accepted_remotes():
    assert [check_remote(r) for r in ("ssh://git@host:2222/fleet/status.git", "git://127.0.0.1:9418/s.git",
                                      "https://user:token@git.example/fleet/status.git", "file:///srv/status.git",
                                      "git@github.example:fleet/status.git")] == ["ssh", "git", "https", "file", "ssh"]
    check_key("/etc/nftrec/status_ed25519")


def test_a_password_in_the_remote_is_not_shown(tmp_path, monkeypatch):
    """Neither in a message nor on a git command line (which every local user can read in
    /proc): a wrapper first on PATH records every git argument vector."""
    argv = tmp_path / "argv"
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {argv}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    url = f"https://nftrec:s3cret@127.0.0.1:{free_port()}/status.git"
    records, why = fetch_records(url, timeout=10)
    assert records == () and why and "s3cret" not in why and "***" in why
    ch = channel(tmp_path / "state", url)
    ch.enqueue(record("edge-1", 1))
    ch.start()
    wait_for(lambda: ch.last_error is not None, 30, "a failed push")
    ch.stop()
    assert "s3cret" not in ch.last_error
    assert "fetch" in argv.read_text() and "s3cret" not in argv.read_text()


def test_enqueue_on_an_unwritable_state_directory_does_not_raise(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    ch = channel(blocker / "state", f"file://{tmp_path}/status.git")  # under a file: cannot be made
    ch.enqueue(record("edge-1", 1))
    assert "status record not queued" in caplog.text


def test_ssh_runs_with_the_key_and_batch_mode(tmp_path, monkeypatch):
    """With status.sshKey, git's ssh is `ssh -i KEY -o IdentitiesOnly=yes -o BatchMode=yes`
    (a stand-in `ssh` first on PATH records its arguments and fails)."""
    argv = tmp_path / "argv"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done >> {argv}\nexit 255\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    key = tmp_path / "keys" / "status_ed25519"
    records, why = fetch_records("ssh://git@127.0.0.1:2222/fleet/status.git", str(key), timeout=10)
    assert records == () and why
    args = argv.read_text().splitlines()
    assert args[args.index("-i") + 1] == str(key)
    assert {"IdentitiesOnly=yes", "BatchMode=yes"} <= set(args) and "git@127.0.0.1" in args
    argv.unlink()
    fetch_records("git@127.0.0.1:fleet/status.git", timeout=10)  # scp-like, no key: the remote's own ssh setup
    args = argv.read_text().splitlines()
    assert "-i" not in args and "BatchMode=yes" in args and "git@127.0.0.1" in args


def test_queue_past_its_cap_keeps_every_outcomes_latest(tmp_path, monkeypatch):
    """Past MAX_QUEUED records (the remote down for long), the oldest records whose outcome
    has a later one go first: the latest record of each outcome is always kept."""
    from reconciler.engine import statusqueue

    monkeypatch.setattr(statusqueue, "MAX_QUEUED", 4)
    remote = bare(tmp_path / "status.git")
    ch = channel(tmp_path / "state", f"file://{remote}")
    ch.enqueue(record("edge-1", 0, outcome="invalid"))
    for i in range(1, 7):
        ch.enqueue(record("edge-1", i, outcome="applied"))
    assert ch.flush(30)
    ch.stop()
    assert [(r.outcome, r.applied) for r in log_of(remote, "edge-1")] == [
        ("invalid", "rev0"), ("applied", "rev4"), ("applied", "rev5"), ("applied", "rev6")]


def test_fetch_records_of_a_hung_remote_ends_at_its_timeout(tmp_path):
    """`timeout` bounds the whole read (every git process of it), not each process."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    try:
        t0 = time.monotonic()
        records, why = fetch_records(f"git://127.0.0.1:{hole.getsockname()[1]}/status.git", timeout=1.5)
        assert time.monotonic() - t0 < 5
        assert records == () and "did not finish within the 1.5 s allowed" in why
    finally:
        hole.close()


def test_node_config_status_block(tmp_path):
    from reconciler.intake import load_node_config

    def read(status: str):
        path = tmp_path / "config.yaml"
        path.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: edge-1\nnodeIPs: [192.0.2.1]\n"
                        + status)
        cfg, problems = load_node_config(str(path), discover=False)
        return cfg.status, [p.field for p in problems if p.is_error]

    assert read("") == (None, [])
    assert read("status: {remote: 'git@git.example:fleet/status.git', sshKey: /etc/nftrec/status_ed25519}\n") == (
        StatusSettings("git@git.example:fleet/status.git", "/etc/nftrec/status_ed25519"), [])
    assert read("status: {remote: 'https://git.example/fleet/status.git'}\n") == (
        StatusSettings("https://git.example/fleet/status.git"), [])
    for bad, field in (("{remote: 'ext::sh -c id'}", "status.remote"), ("{remote: '/srv/status.git'}", "status.remote"),
                       ("{remote: 'file:///s.git', sshKey: 'keys/id'}", "status.sshKey"),
                       ("{remote: 'file:///s.git', sshKey: '/k/a b'}", "status.sshKey"),
                       ("{sshKey: /k/id}", "status"), ("{remote: 'file:///s.git', user: x}", "status")):
        status, fields = read(f"status: {bad}\n")
        assert status is None and fields and all(f.startswith(field) for f in fields), (bad, fields)
