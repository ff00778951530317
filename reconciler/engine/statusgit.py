"""git for the status records, run as nftrec's own program: in a private temporary
repository (mkdtemp, 0700), from a clean environment (no GIT_* variable, HOME and
XDG_CONFIG_HOME in that directory, no system or global config), with hooks off, no
terminal prompt, and only the remote's own transport allowed (never ext::). A remote or
key that could smuggle an option or a program into git or ssh is refused up front.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

REF_PREFIX = "refs/nftrec/status/"
RECORD_FILE = "status.json"  # the only file of each record's commit
PUSH_ATTEMPTS = 4  # a push rejected because the ref moved: fetch, build on top, push again
REMOTE = "status"  # the remote's name in the private repository: its URL is never on a command line
GIT_TIMEOUT = 120.0  # seconds for one push (its fetches, commits and pushes together)
SSH_CONNECT_TIMEOUT = 15  # seconds

_SCP_LIKE = re.compile(r"[A-Za-z0-9._-]+@[A-Za-z0-9][A-Za-z0-9.-]*:[^\s]+")
_URL = re.compile(r"(ssh|git|https|file)://[^\s]*")
_KEY_PATH = re.compile(r"/[A-Za-z0-9._/@+-]+")
# Variables a git process may keep from nftrec's environment: data, never a program or a config.
_KEPT = ("PATH", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy",
         "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "TZ")


class StatusGitError(Exception):
    """A remote or key refused, git missing, or a git command that failed (its first line
    of complaint; `stderr`: all it said)."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


def check_remote(remote: str) -> str:
    """The transport git may use for `remote` (ssh, git, https, file), or StatusGitError:
    ssh://, git://, https://, file:// URLs and scp-like user@host:path only."""
    if not isinstance(remote, str) or len(remote) > 4096 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in remote):
        raise StatusGitError(f"status.remote {shown(remote)!r} is not a git URL")
    m = _URL.fullmatch(remote)
    if m:
        return m.group(1)
    if _SCP_LIKE.fullmatch(remote):
        return "ssh"
    raise StatusGitError(f"status.remote {shown(remote)!r} is not a git URL nftrec pushes to; write "
                         "ssh://host/repo.git, git://host/repo.git, https://host/repo.git, file:///path/repo.git "
                         "or user@host:repo.git")


def shown(remote: str) -> str:
    """`remote` for a message: a password in the URL (https://user:token@host) masked."""
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", remote)


def check_key(ssh_key: str | None) -> None:
    if ssh_key is None:
        return
    if not _KEY_PATH.fullmatch(ssh_key) or "/../" in ssh_key + "/" or len(ssh_key) > 4096:
        raise StatusGitError(f"status.sshKey {ssh_key!r} is not an absolute path of letters, digits and ._/@+-; "
                             "move the key to a plain path such as /etc/nftrec/status_ed25519")


def check_file_remote(remote: str) -> None:
    """A file:// remote's upload-pack and receive-pack run on this host under that
    repository's own config, which can name programs (core.alternateRefsCommand, gc's):
    only a repository owned by the user running nftrec is pushed to (hooks stay off
    anyway). StatusGitError otherwise, naming the file and what to do."""
    from urllib.parse import unquote, urlsplit

    top = Path(unquote(urlsplit(remote).path))
    if not os.path.lexists(top):
        return  # no repository, no config: git says it is missing
    gitdir = top / ".git" if (top / ".git").is_dir() else top
    me = os.getuid()
    for path in (top, gitdir, gitdir / "config"):
        try:
            owner = path.stat().st_uid
        except OSError as e:
            raise StatusGitError(f"status.remote {shown(remote)!r}: cannot stat {path} ({e.strerror}); "
                                 "create the repository (git init --bare) or fix the path") from None
        if owner != me:
            raise StatusGitError(f"status.remote {shown(remote)!r}: {path} belongs to uid {owner}, not to uid {me} "
                                 "running nftrec; git's receive-pack would run under that repository's config, "
                                 "which can name programs: give the repository to this user, or push over "
                                 "ssh:// or git://")


class Repo:
    """A private temporary bare repository and the git commands run in it (a context
    manager: the directory is removed on exit). `timeout`: seconds for all its git
    commands together. `cancel` kills the running git (the pusher's stop)."""

    def __init__(self, remote: str, ssh_key: str | None = None, timeout: float = GIT_TIMEOUT):
        self.scheme = check_remote(remote)
        check_key(ssh_key)
        if self.scheme == "file":
            check_file_remote(remote)
        self.remote = remote
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.dir = Path(tempfile.mkdtemp(prefix="nftrec-status-"))  # 0700, ours
        self.git_dir = self.dir / "repo.git"
        self.env = {k: os.environ[k] for k in _KEPT if k in os.environ}
        self.env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        ssh = f"ssh -o BatchMode=yes -o ConnectTimeout={SSH_CONNECT_TIMEOUT}"
        if ssh_key is not None:
            ssh += f" -i {shlex.quote(ssh_key)} -o IdentitiesOnly=yes"
        self.env.update({
            "LC_ALL": "C", "HOME": str(self.dir), "XDG_CONFIG_HOME": str(self.dir), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": ssh,
            "GIT_SSH_VARIANT": "ssh", "GIT_PROTOCOL_FROM_USER": "0", "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_OPTIONAL_LOCKS": "0",
        })
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._cancelled = False
        try:
            self.git("init", "--quiet", "--bare", str(self.git_dir), repo=False)
            # written here, not with `git config`: a password in the URL stays off every command line
            quoted = remote.replace("\\", "\\\\").replace('"', '\\"')
            with open(self.git_dir / "config", "a", encoding="utf-8") as f:
                f.write(f'[remote "{REMOTE}"]\n\turl = "{quoted}"\n')
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Repo":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def _config(self) -> list[str]:
        settings = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "protocol.allow=never",
                    f"protocol.{self.scheme}.allow=always", "credential.helper=", "core.askPass=",
                    "transfer.fsckObjects=true", "fetch.fsckObjects=true", "gc.auto=0", "maintenance.auto=false",
                    "user.name=nftrec", "user.email=nftrec@localhost")
        return [arg for setting in settings for arg in ("-c", setting)]

    def pack_program(self, verb: str) -> list[str]:
        """The option of `git fetch` (verb upload-pack) or `git push` (receive-pack) for the
        remote: a file:// remote's program runs here, under that repository's config,
        so with its hooks off."""
        if self.scheme != "file":
            return []
        return [f"--{verb}=git -c core.hooksPath=/dev/null {verb}"]

    def git(self, *args: str, stdin: bytes | None = None, repo: bool = True, env: dict | None = None) -> bytes:
        """Run `git ARGS` in the repository; its stdout, or StatusGitError with git's first
        line of complaint."""
        cmd = ["git", *self._config()]
        if repo:
            cmd += ["--git-dir", str(self.git_dir)]
        cmd += list(args)
        with self._lock:
            if self._cancelled:
                raise StatusGitError("stopped")
            try:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, env={**self.env, **(env or {})}, cwd=self.dir)
            except FileNotFoundError:
                raise StatusGitError("git is not installed (or not on PATH); status records are pushed with git") \
                    from None
        proc = self._proc
        try:
            out, err = proc.communicate(stdin, timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise StatusGitError(f"`git {args[0]}` with {shown(self.remote)} did not finish within the "
                                 f"{self.timeout:g} s allowed; is the remote reachable?") from None
        if proc.returncode != 0:
            said = [line for line in err.decode("utf-8", "replace").replace(self.remote, shown(self.remote))
                    .splitlines() if line.strip()]
            first = next((s for s in said if s.startswith(("fatal:", "error:", " ! "))), said[0] if said else "")
            raise StatusGitError(f"`git {args[0]}` failed: {first.strip() or f'exit {proc.returncode}'}",
                                 "\n".join(said))
        return out


def _fetch_tip(repo: Repo, ref: str) -> str | None:
    """The remote's commit at `ref` (fetched, depth 1), None when the remote has no such ref."""
    try:
        repo.git("fetch", "--quiet", "--no-tags", "--depth", "1", *repo.pack_program("upload-pack"), REMOTE,
                 f"+{ref}:refs/tip")
    except StatusGitError as e:
        if "couldn't find remote ref" in e.stderr:
            return None
        raise
    return repo.git("rev-parse", "--verify", "--quiet", "refs/tip^{commit}").decode().strip()


def _commit(repo: Repo, node: str, raw: bytes, when: int, message: str, parent: str | None) -> str:
    blob = repo.git("hash-object", "-w", "--stdin", stdin=raw).decode().strip()
    tree = repo.git("mktree", stdin=f"100644 blob {blob}\t{RECORD_FILE}\n".encode()).decode().strip()
    date = f"@{when} +0000"
    return repo.git("commit-tree", tree, *(("-p", parent) if parent else ()), stdin=message.encode() + b"\n",
                    env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
                         "GIT_AUTHOR_NAME": node, "GIT_COMMITTER_NAME": node}).decode().strip()


def push(repo: Repo, node: str, records: list[tuple[bytes, int, str]]) -> str:
    """Push `records` ((file, Unix time, commit message), oldest first) to the node's ref,
    each the only file of a commit whose parent is the one before it; the first's is the
    ref's tip on the remote. When the ref moved meanwhile (another writer, a restored
    remote) its new tip is fetched and the records are built on top again. The new tip."""
    ref = REF_PREFIX + node
    for attempt in range(PUSH_ATTEMPTS):
        tip = _fetch_tip(repo, ref)
        for raw, when, message in records:
            tip = _commit(repo, node, raw, when, message, tip)
        try:
            repo.git("push", "--quiet", "--no-verify", *repo.pack_program("receive-pack"), REMOTE, f"{tip}:{ref}")
            return tip
        except StatusGitError as e:
            moved = any(w in e.stderr for w in ("[rejected]", "non-fast-forward", "fetch first", "cannot lock ref",
                                                "failed to update ref", "stale info"))
            if not moved or attempt == PUSH_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def fetch_tips(remote: str, ssh_key: str | None, timeout: float, max_bytes: int,
               started: Callable[[Repo], None] | None = None) -> list[tuple[str, bytes]]:
    """(ref, its tip's RECORD_FILE) of every ref under REF_PREFIX of `remote`: only those
    refs, depth 1, read from the objects (no checkout); a file over `max_bytes`, or a tip
    without it, is left out. `started(repo)`: the caller may `cancel` the read."""
    with Repo(remote, ssh_key, timeout) as repo:
        if started is not None:
            started(repo)
        try:
            repo.git("fetch", "--quiet", "--no-tags", "--depth", "1", *repo.pack_program("upload-pack"), REMOTE,
                     f"+{REF_PREFIX}*:refs/fetched/*")
        except StatusGitError as e:
            # a shallow fetch whose refspec matches nothing fails without a word: no record yet
            if e.stderr or repo.git("ls-remote", *repo.pack_program("upload-pack"), REMOTE, f"{REF_PREFIX}*"):
                raise
            return []
        listed = repo.git("for-each-ref", "--format=%(objectname) %(refname)", "refs/fetched/").decode()
        tips = [(oid, REF_PREFIX + ref[len("refs/fetched/"):]) for oid, ref in
                (line.split(" ", 1) for line in listed.splitlines() if line)]
        if not tips:
            return []
        names = "".join(f"{oid}:{RECORD_FILE}\n" for oid, _ in tips).encode()
        sizes = repo.git("cat-file", "--batch-check=%(objecttype) %(objectsize)", stdin=names).decode().splitlines()
        wanted = [(oid, ref) for (oid, ref), size in zip(tips, sizes)
                  if size.startswith("blob ") and int(size.split()[1]) <= max_bytes]
        out = repo.git("cat-file", "--batch", stdin="".join(f"{oid}:{RECORD_FILE}\n" for oid, _ in wanted).encode())
    found = []
    pos = 0
    for _oid, ref in wanted:
        end = out.index(b"\n", pos)
        size = int(out[pos:end].split()[2])
        found.append((ref, out[end + 1:end + 1 + size]))
        pos = end + 1 + size + 1
    return found
