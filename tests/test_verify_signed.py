"""Signed revisions (`verify` in the node config): only commits signed by a configured key
are applied, exactly their tree, never an older one after a newer one.

Real git, keys made here (ssh-keygen, gpg --batch), a git-sync layout (`current` linked to
a `git worktree` per commit), nftrec as a subprocess in a throwaway namespace.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nsutil import in_ns
from test_cli_kernel import nftrec, ok

pytestmark = pytest.mark.kernel

def git_version() -> tuple[int, ...]:
    """The test machine's git, as (major, minor): it signs the test commits."""
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=30).stdout
    return tuple(int(n) for n in out.split()[2].split(".")[:2])


needs_ssh = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                               reason="ssh-keygen (openssh-client) is not installed: it makes the test keys")
# git before 2.34 cannot sign with SSH: Repo.commit then signs by hand (sign_head); only
# tests that run `git tag -s` or `git commit -S` themselves need git's own SSH signing.
SSH_BY_HAND = git_version() < (2, 34) or bool(os.environ.get("NFTREC_TEST_SSH_BY_HAND"))
needs_ssh_git = pytest.mark.skipif(SSH_BY_HAND, reason="git before 2.34 cannot sign with SSH keys (the test's own signing)")
needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed: it makes the test keys")

SERVICE = """apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  clusterIP: {ip}
  ports: [{{port: 80, protocol: TCP}}]
"""


@functools.lru_cache(maxsize=None)
def _git_home() -> str:
    """A HOME whose .gitconfig trusts every repository: the tests' own git works in the
    repositories they give to git-sync's user (uid 65534). git before 2.32 ignores
    GIT_CONFIG_GLOBAL, and Debian 11's ignores `-c safe.directory` on the command line."""
    home = tempfile.mkdtemp(prefix="nftrec-test-git-home-")
    atexit.register(shutil.rmtree, home, True)
    Path(home, ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
    return home


def git_env(env: dict | None = None) -> dict:
    return {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": _git_home(), **(env or {})}


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=git_env(env), timeout=60).stdout.strip()


def ssh_key(d: Path, name: str, kind: str = "ed25519") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"{name}@example", "-f", str(d / name)],
                   check=True, capture_output=True, timeout=60)
    return d / name


def gpg_key(home: Path, name: str, algo: str = "ed25519", expire: str = "1d", *options: str) -> tuple[Path, str]:
    """(armored public key file, fingerprint) of a new signing key in GNUPGHOME `home`;
    `options` go to the gpg that makes it (--faked-system-time for a key made in the past)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    g = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run([*g, *options, "--quick-gen-key", f"{name} <{name}@example>", algo, "sign", expire],
                   check=True, capture_output=True, timeout=120)
    listed = subprocess.run([*g, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True).stdout
    fpr = next(ln.split(":")[9] for ln in listed.splitlines() if ln.startswith("fpr:"))
    out = home.parent / f"{name}.asc"
    out.write_bytes(subprocess.run([*g, "--armor", "--export", fpr], check=True, capture_output=True).stdout)
    return out, fpr


class Repo:
    """A manifest repository and its git-sync publication: `gs/current` -> a worktree."""

    def __init__(self, tmp: Path):
        self.src, self.gs = tmp / "src", tmp / "gs"
        self.src.mkdir()
        self.gs.mkdir()
        git(self.src, "init", "-q")
        self.env: dict = {}
        self.ssh: Path | None = None  # the key Repo.commit signs with by hand (SSH_BY_HAND)

    def use_ssh(self, key: Path) -> None:
        self.ssh = key if SSH_BY_HAND else None
        if not SSH_BY_HAND:  # (git before 2.34 refuses gpg.format=ssh in any command)
            git(self.src, "config", "gpg.format", "ssh")
            git(self.src, "config", "user.signingkey", str(key))

    def use_gpg(self, home: Path, fpr: str) -> None:
        self.ssh = None
        git(self.src, "config", "gpg.format", "openpgp")
        git(self.src, "config", "user.signingkey", fpr)
        self.env = {"GNUPGHOME": str(home)}

    def commit(self, ip: str, *, sign: bool = True) -> str:
        (self.src / "web.yaml").write_text(SERVICE.format(ip=ip))
        git(self.src, "add", "-A")
        by_git = sign and self.ssh is None
        git(self.src, "commit", "-q", "--allow-empty", "-m", ip, *(["-S"] if by_git else []), env=self.env)
        return sign_head(self.src, self.ssh) if sign and not by_git else git(self.src, "rev-parse", "HEAD")

    def publish(self, sha: str) -> Path:
        wt = self.gs / ".worktrees" / sha
        if not wt.exists():
            git(self.src, "worktree", "add", "-q", "--detach", str(wt), sha)
        (self.gs / "tmp-link").symlink_to(wt.relative_to(self.gs))
        os.replace(self.gs / "tmp-link", self.gs / "current")
        return wt

    @property
    def current(self) -> Path:
        return self.gs / "current"


def sign_head(src: Path, key: Path) -> str:
    """HEAD of `src` made again with an SSH signature that ssh-keygen makes over the commit
    object, as git 2.34 and later do (`gpgsig` header); the new commit's id."""
    raw = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src), "cat-file", "commit", "HEAD"], check=True,
                         capture_output=True, env=git_env()).stdout
    head, sep, message = raw.partition(b"\n\n")
    sig = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", "git"], input=raw, check=True,
                         capture_output=True, timeout=60).stdout.rstrip(b"\n").replace(b"\n", b"\n ")
    oid = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src), "hash-object", "-t", "commit", "-w", "--stdin"],
                         input=head + b"\ngpgsig " + sig + sep + message, check=True, capture_output=True,
                         env=git_env()).stdout
    git(src, "update-ref", "HEAD", oid.decode().strip())
    return oid.decode().strip()


def config(tmp: Path, *keys: Path, extra: str = "") -> Path:
    c = tmp / "config.yaml"
    c.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: n1\nnodeIPs: [192.168.50.2]\n"
                 f"verify:\n  mode: HEAD\n  keys: [{', '.join(str(k) for k in keys)}]\n{extra}")
    return c


def ssh_setup(tmp: Path) -> tuple[Path, Repo, Path]:
    """(ops's private key, a repository signing with it, a node config trusting it)."""
    ops = ssh_key(tmp / "keys", "ops")
    repo = Repo(tmp)
    repo.use_ssh(ops)
    return ops, repo, config(tmp, Path(f"{ops}.pub"))


def live_ips(ns: str) -> str:
    return in_ns(ns, "nft", "list", "table", "ip", "nftrec", check=False).stdout


def status(state: Path, ns: str, cfg: Path) -> dict:
    return json.loads(nftrec("status", "-o", "json", state=state, ns=ns, config=cfg).stdout)


@needs_ssh
@needs_ssh_git  # (git 2.30 refuses to write the hand-signed commit once the repository is uid 65534's)
def test_ssh_signed_applied_and_every_untrusted_revision_refused(tmp_path, netns):
    ops, repo, cfg = ssh_setup(tmp_path)
    stranger = ssh_key(tmp_path / "keys", "stranger")
    state = tmp_path / "state"
    good = repo.commit("10.96.0.10")
    repo.publish(good)
    subprocess.run(["chown", "-R", "65534:65534", str(repo.src), str(repo.gs)], check=True)  # git-sync's own user
    p = ok(nftrec("plan", str(repo.current), state=state, ns=netns, config=cfg), 0)
    assert f"revision {good[:12]} verified: signed by ops@example" in p.stdout.splitlines()[0]
    doc = json.loads(ok(nftrec("plan", str(repo.current), "-o", "json", state=state, ns=netns, config=cfg)).stdout)
    assert doc["verification"]["revision"] == good and doc["verification"]["signer"] == "ops@example"
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns)
    assert status(state, netns, cfg)["lastAppliedRevision"] == good

    def refused(reason: str, revision: str, *words: str) -> None:
        p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"refused ({reason})" in p.stderr, p.stderr
        assert "10.96.0.10" in live_ips(netns) and "10.96.0.11" not in live_ips(netns)
        st = status(state, netns, cfg)
        assert st["lastAppliedRevision"] == good and st["lastAttemptedRevision"] == revision
        for w in (f"refused ({reason})", *words):
            assert w in st["lastError"], st["lastError"]
        text = nftrec("status", state=state, ns=netns, config=cfg).stdout
        assert f"refused ({reason})" in text

    repo.publish(repo.commit("10.96.0.11", sign=False))
    refused("unsigned", git(repo.src, "rev-parse", "HEAD"), "no trusted signature")

    repo.use_ssh(stranger)
    repo.publish(repo.commit("10.96.0.11"))
    refused("unknown-key", git(repo.src, "rev-parse", "HEAD"))

    # tampered: the good commit's signature over another tree
    repo.use_ssh(ops)
    signed = repo.commit("10.96.0.12")
    body = git(repo.src, "cat-file", "commit", signed)
    other_tree = git(repo.src, "rev-parse", f"{good}^{{tree}}")
    forged = body.replace(body.split("\n")[0], f"tree {other_tree}", 1)
    sha = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo.src), "hash-object", "-t", "commit", "-w", "--stdin"],
                         input=forged + "\n", capture_output=True, text=True, check=True).stdout.strip()
    wt = repo.publish(sha)
    (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.10"))
    refused("bad-signature", sha)

    # a modified tracked file and an untracked manifest in a validly signed checkout: what
    # is applied is the signed commit's tree, read from the object store
    latest = repo.commit("10.96.0.13")
    wt = repo.publish(latest)
    (wt / "web.yaml").write_text(SERVICE.format(ip="10.96.0.11"))
    (wt / "extra.yaml").write_text(SERVICE.format(ip="10.96.0.14").replace("web", "extra"))
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.13" in live_ips(netns) and "10.96.0.11" not in live_ips(netns) and "10.96.0.14" not in live_ips(netns)
    git(wt, "checkout", "--", "web.yaml")
    (wt / "extra.yaml").unlink()

    # an older signed commit after a newer one: refused, then applied once with --allow-rollback
    repo.publish(good)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (rollback)" in p.stderr
    assert "10.96.0.13" in live_ips(netns)
    p = ok(nftrec("apply", str(repo.current), "--allow-rollback", state=state, ns=netns, config=cfg))
    assert "it does not descend from the last applied revision" in p.stderr and ", allowed" in p.stderr, p.stderr
    assert "10.96.0.10" in live_ips(netns) and "10.96.0.13" not in live_ips(netns)
    assert status(state, netns, cfg)["lastAppliedRevision"] == good
    # the override is recorded with the commit
    records = [json.loads(line) for f in Path(state).rglob("commits.jsonl") for line in f.read_text().splitlines()]
    assert [r["kind"] for r in records if r["revision"] == good][-1] == "allow-rollback", records


@needs_gpg
def test_openpgp_signed_applied_and_unknown_key_refused(tmp_path, netns):
    ops_asc, ops_fpr = gpg_key(tmp_path / "gpg-ops", "ops")
    _, other_fpr = gpg_key(tmp_path / "gpg-other", "other")
    repo = Repo(tmp_path)
    repo.use_gpg(tmp_path / "gpg-ops", ops_fpr)
    cfg = config(tmp_path, ops_asc)
    state = tmp_path / "state"
    good = repo.commit("10.96.0.10")
    repo.publish(good)
    p = ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns), p.stderr
    repo.use_gpg(tmp_path / "gpg-other", other_fpr)
    bad = repo.commit("10.96.0.11")
    repo.publish(bad)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unknown-key)" in p.stderr, p.stderr
    assert "10.96.0.11" not in live_ips(netns)
    assert status(state, netns, cfg)["lastAttemptedRevision"] == bad
    # a key that expired after signing: refused, even when it is in verify.keys
    exp_home = tmp_path / "gpg-exp"
    _, exp_fpr = gpg_key(exp_home, "exp")
    repo.use_gpg(exp_home, exp_fpr)
    late = repo.commit("10.96.0.12")
    subprocess.run(["gpg", "--homedir", str(exp_home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
                    "--quick-set-expire", exp_fpr, "seconds=1"], check=True, capture_output=True, timeout=60)
    time.sleep(2.5)  # past the expiry: a fact to set up, not a timed assertion
    exp_asc = tmp_path / "exp-expired.asc"
    exp_asc.write_bytes(subprocess.run(["gpg", "--homedir", str(exp_home), "--armor", "--export", exp_fpr],
                                       check=True, capture_output=True).stdout)
    repo.publish(late)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=config(tmp_path, ops_asc, exp_asc))
    assert p.returncode == 1 and "refused (expired-key)" in p.stderr, p.stderr
    assert "10.96.0.12" not in live_ips(netns)


@needs_ssh
@pytest.mark.parametrize("case", ["plain-directory", "empty-key", "missing-key", "unknown-mode"])
def test_configuration_errors_are_loud(tmp_path, netns, case):
    key = Path(f"{ssh_key(tmp_path / 'keys', 'ops')}.pub")
    d = tmp_path / "plain"
    d.mkdir()
    (d / "web.yaml").write_text(SERVICE.format(ip="10.96.0.10"))
    if case == "empty-key":
        key.write_text("\n")
    elif case == "missing-key":
        key = tmp_path / "nope.pub"
    cfg = config(tmp_path, key)
    if case == "unknown-mode":
        cfg.write_text(cfg.read_text().replace("mode: HEAD", "mode: Commit"))
    state = tmp_path / "state"
    for cmd in ("plan", "apply"):
        p = nftrec(cmd, str(d), state=state, ns=netns, config=cfg)
        assert p.returncode == 1, p.stdout + p.stderr
        said = {"plain-directory": "is not a git checkout", "empty-key": "is empty",
                "missing-key": "cannot read", "unknown-mode": "verify.mode"}[case]
        assert said in p.stderr, p.stderr
    assert "10.96.0.10" not in live_ips(netns)
    if case == "plain-directory":  # watch runs (git-sync may clone later) and refuses what it reads
        from watchproc import Watch

        w = Watch(netns, d, cfg, state)
        try:
            line = w.wait_event("unverified", 0)
            assert line["reason"] == "configuration" and "is not a git checkout" in line["msg"], line
            assert "10.96.0.10" not in live_ips(netns)
        finally:
            assert w.stop() == 0
    # validate stays a schema check: no keys read, no git
    p = nftrec("validate", str(d), config=cfg)
    assert p.returncode == (1 if case == "unknown-mode" else 0), p.stdout + p.stderr


@needs_ssh
def test_watch_skips_an_unsigned_revision_and_applies_the_next_signed_one(tmp_path, netns):
    from watchproc import Watch

    _, repo, cfg = ssh_setup(tmp_path)
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10")
    repo.publish(first)
    w = Watch(netns, repo.current, cfg, state)
    try:
        w.wait_sync(0)
        assert "10.96.0.10" in live_ips(netns)
        mark = len(w.lines)
        unsigned = repo.commit("10.96.0.11", sign=False)
        repo.publish(unsigned)
        line = w.wait_event("unverified", mark)
        assert line["revision"] == unsigned and line["reason"] == "unsigned"
        st = w.status(lambda st: st["lastAttemptedRevision"] == unsigned)
        assert st["lastAppliedRevision"] == first and "refused (unsigned)" in st["lastError"]
        assert "10.96.0.11" not in live_ips(netns)
        _, body = w.http("/metrics")
        assert 'nftrec_revision_verification_failures_total{reason="unsigned"} 1.0' in body
        assert 'nftrec_verified_signer_info{key="SHA256:' in body and 'signer="ops@example"' in body
        mark = len(w.lines)
        signed = repo.commit("10.96.0.12")
        repo.publish(signed)
        w.wait_sync(mark)
        assert "10.96.0.12" in live_ips(netns)
        assert len(w.events("unverified", mark)) == 0
        assert len(w.events("unverified")) == 1  # one line per refusal, no retry of the same revision
        w.status(lambda st: st["lastAppliedRevision"] == signed)
        mark = len(w.lines)
        repo.publish(first)  # a validly signed older revision: a replay
        assert w.wait_event("unverified", mark)["reason"] == "rollback"
        assert "10.96.0.12" in live_ips(netns) and "10.96.0.10" not in live_ips(netns)
    finally:
        assert w.stop() == 0


@needs_ssh
@needs_ssh_git
def test_tag_mode_and_rollback_from_history(tmp_path, netns):
    """Tag: the commit needs a signed annotated tag; TagAndHEAD: both signed. `apply
    --rollback` (nftrec's own history) stays allowed and says so."""
    _, repo, cfg = ssh_setup(tmp_path)
    cfg.write_text(cfg.read_text().replace("mode: HEAD", "mode: Tag"))
    state = tmp_path / "state"
    first = repo.commit("10.96.0.10", sign=False)
    repo.publish(first)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (no-tag)" in p.stderr, p.stderr
    git(repo.src, "tag", "-a", "-m", "v1", "v1", first)  # annotated, unsigned
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unsigned)" in p.stderr and "tag 'v1'" in p.stderr, p.stderr
    stranger = ssh_key(tmp_path / "keys", "stranger")
    git(repo.src, "-c", f"user.signingkey={stranger}", "tag", "-s", "-m", "v1x", "v1x", first)
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unknown-key)" in p.stderr, p.stderr
    git(repo.src, "tag", "-s", "-m", "v1s", "v1s", first)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.10" in live_ips(netns)
    cfg.write_text(cfg.read_text().replace("mode: Tag", "mode: TagAndHEAD"))
    p = nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unsigned)" in p.stderr, p.stderr  # the commit itself is not signed
    second = repo.commit("10.96.0.11")
    git(repo.src, "tag", "-s", "-m", "v2", "v2", second)
    repo.publish(second)
    ok(nftrec("apply", str(repo.current), state=state, ns=netns, config=cfg))
    assert "10.96.0.11" in live_ips(netns)
    p = ok(nftrec("apply", "--rollback", state=state, ns=netns, config=cfg))
    assert "--rollback re-applies a ruleset from nftrec's own history" in p.stderr
    assert "10.96.0.10" in live_ips(netns) and "10.96.0.11" not in live_ips(netns)
