"""A fleet root from every source that is not a plain directory: a verified git commit
(`verify`: fleet.yaml and the node's layers are the signed commit's blobs, whatever the
worktree's user writes), a `diff --git` revision, a tar archive on standard input, and an
OCI artifact.

Real git and git-sync's defaults (tests/gitsync.py), real SSH keys, real `git archive` and
`tar`, nftrec as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gitsync import GitSync, push, remote
from ociregistry import push_artifact, registry  # noqa: F401 (fixture)
from reconciler.intake import Verifier, Verify, read_verified
from reconciler.intake.fleet import Identity
from test_cli_kernel import nftrec
from test_verify_signed import git, needs_ssh, sign_head, ssh_key, SSH_BY_HAND

FLEET = """apiVersion: nftrec/v1alpha1
kind: Fleet
layers:
- path: base
- path: sites/${labels.site}
- path: nodes/${nodeName}
  optional: true
"""

SERVICE = """apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {ip}
  ports: [{{port: 80, protocol: TCP}}]
"""

LYON = Identity("lyon-1", (("site", "lyon"),))


def write_fleet(root: Path) -> None:
    """base (web), sites/lyon (dns-lyon), sites/paris (dns-paris, and a file no node of
    Lyon may read: invalid YAML)."""
    (root / "fleet.yaml").write_text(FLEET)
    for rel, text in {"base/web.yaml": SERVICE.format(name="web", ip="10.96.0.10"),
                      "sites/lyon/dns.yaml": SERVICE.format(name="dns-lyon", ip="10.96.1.10"),
                      "sites/paris/dns.yaml": SERVICE.format(name="dns-paris", ip="10.96.2.10"),
                      "sites/paris/broken.yaml": "kind: [unclosed\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def services(result) -> set[str]:
    return {s.name for s in result.inventory.services}


class SignedFleet:
    """A fleet repository signed with ops's SSH key, synced by git-sync with its defaults."""

    def __init__(self, tmp: Path):
        self.key = ssh_key(tmp / "keys", "ops")
        self.src = tmp / "src"
        self.src.mkdir()
        git(self.src, "init", "-q")
        if not SSH_BY_HAND:
            git(self.src, "config", "gpg.format", "ssh")
            git(self.src, "config", "user.signingkey", str(self.key))
        write_fleet(self.src)
        self.first = self.commit("fleet")
        self.remote = remote(tmp, self.src)
        self.gs = GitSync(tmp / "git-sync", self.remote)
        self.verify = Verify("HEAD", (f"{self.key}.pub",))

    def commit(self, message: str, *, sign: bool = True) -> str:
        git(self.src, "add", "-A")
        by_git = sign and not SSH_BY_HAND
        git(self.src, "commit", "-q", "--allow-empty", "-m", message, *(["-S"] if by_git else []))
        return sign_head(self.src, self.key) if sign and not by_git else git(self.src, "rev-parse", "HEAD")

    def read(self, identity: Identity | None = LYON):
        """(verdict, read_verified of it for `identity`) of git-sync's current worktree."""
        with Verifier(self.verify) as v:
            verdict = v.check(self.gs.current, None)
        if not verdict.ok:
            return verdict, None
        return verdict, read_verified(verdict.files, identity=identity)


@needs_ssh
def test_verified_fleet_reads_the_signed_commits_projection(tmp_path):
    fleet = SignedFleet(tmp_path)
    assert fleet.gs.sync("main") == fleet.first
    verdict, result = fleet.read()
    assert verdict.ok and result.ok, [str(p) for p in result.problems]
    assert services(result) == {"web", "dns-lyon"}  # sites/paris (with its broken file) never parsed
    assert result.inventory.revision == fleet.first
    for _ in range(2):  # the intake cache (keyed with the node's Env) gives the same result
        cached = read_verified(verdict.files, identity=LYON, cache_dir=tmp_path / "cache")
        assert services(cached) == services(result) and cached.digest == result.digest and cached.ok
    _, paris = fleet.read(Identity("paris-1", (("site", "paris"),)))
    assert not paris.ok and any("broken.yaml" in p.file for p in paris.problems)
    _, nobody = fleet.read(None)
    assert not nobody.ok and "fleet repository" in nobody.errors[0].message


@needs_ssh
def test_verified_fleet_ignores_what_the_worktrees_user_writes(tmp_path):
    """git-sync's user owns the worktree: it moves the node to another site in fleet.yaml,
    edits a layer file, adds the node's optional layer: none of it is read."""
    fleet = SignedFleet(tmp_path)
    fleet.gs.sync("main")
    wt = fleet.gs.current
    (wt / "fleet.yaml").write_text(FLEET.replace("sites/${labels.site}", "sites/paris"))
    (wt / "sites" / "lyon" / "dns.yaml").write_text(SERVICE.format(name="dns-lyon", ip="10.96.9.9"))
    (wt / "nodes" / "lyon-1").mkdir(parents=True)
    (wt / "nodes" / "lyon-1" / "extra.yaml").write_text(SERVICE.format(name="extra", ip="10.96.9.10"))
    (wt / "sites" / "lyon" / "added.yaml").write_text(SERVICE.format(name="added", ip="10.96.9.11"))
    verdict, result = fleet.read()
    assert verdict.ok and result.ok, [str(p) for p in result.problems]
    assert services(result) == {"web", "dns-lyon"}
    lyon = next(s for s in result.inventory.services if s.name == "dns-lyon")
    assert "10.96.1.10" in str(lyon) and "10.96.9.9" not in str(lyon)


@needs_ssh
def test_verified_fleet_unsigned_fleet_yaml_is_refused(tmp_path):
    """A pusher without a key moves every node to Paris: git-sync syncs it, verify refuses it."""
    fleet = SignedFleet(tmp_path)
    (fleet.src / "fleet.yaml").write_text(FLEET.replace("sites/${labels.site}", "sites/paris"))
    unsigned = fleet.commit("move", sign=False)
    push(fleet.src, fleet.remote)
    assert fleet.gs.sync("main") == unsigned
    verdict, result = fleet.read()
    assert not verdict.ok and verdict.reason == "unsigned" and result is None


@needs_ssh
def test_verified_fleet_lists_only_the_nodes_layers_and_keeps_held_blobs(tmp_path):
    """`held` (the watch's blobs already parsed) is asked about the node's files only, and
    a held blob is not read; a layer's symlink may point anywhere in the fleet root."""
    fleet = SignedFleet(tmp_path)
    (fleet.src / "sites" / "lyon" / "shared.yaml").symlink_to("../../shared/extra.yaml")
    (fleet.src / "shared").mkdir()
    (fleet.src / "shared" / "extra.yaml").write_text(SERVICE.format(name="shared", ip="10.96.3.10"))
    (fleet.src / "own" / "lyon-1").mkdir(parents=True)  # the node's layer is a link to a directory
    (fleet.src / "own" / "lyon-1" / "own.yaml").write_text(SERVICE.format(name="own", ip="10.96.4.10"))
    (fleet.src / "nodes").mkdir()
    (fleet.src / "nodes" / "lyon-1").symlink_to("../own/lyon-1")
    fleet.commit("link")
    push(fleet.src, fleet.remote)
    fleet.gs.sync("main")
    asked: list[str] = []

    def held(display: str, oid: str) -> bool:
        asked.append(display[len(str(fleet.gs.current)) + 1:])
        return display.endswith("base/web.yaml")

    with Verifier(fleet.verify) as v:
        verdict = v.check(fleet.gs.current, None, held=held)
    assert asked == []  # fleet.yaml only, until the node's projection names the layers
    from reconciler.intake.fleetlisting import listed_node

    node = listed_node(verdict.files, LYON)
    assert sorted(asked) == ["base/web.yaml", "nodes/lyon-1/own.yaml", "sites/lyon/dns.yaml", "sites/lyon/shared.yaml"]
    assert [(f[0].rsplit("/", 3)[-3:], f[2] is None) for f in node.files] == [
        (["current", "base", "web.yaml"], True), (["sites", "lyon", "dns.yaml"], False),
        (["sites", "lyon", "shared.yaml"], False), (["nodes", "lyon-1", "own.yaml"], False)]
    assert node.layers == (0, 1, 1, 2) and not node.problems
    from reconciler.intake import read_inventory

    _, verified = fleet.read()
    disk = read_inventory(fleet.gs.current, identity=LYON)  # the clean worktree read as a directory agrees
    assert verified.ok and services(verified) == services(disk) == {"web", "dns-lyon", "shared", "own"}


def test_git_revisions_of_a_fleet_root_one_read_many_nodes(tmp_path):
    """`diff --git`'s reader: each revision's fleet.yaml and files read once from git's
    objects (revision_files), projected per node (listed_node, read_revision identity=)."""
    from reconciler.intake import read_revision
    from reconciler.intake.fleetlisting import listed_node
    from reconciler.intake.git import revision_files

    src = tmp_path / "repo"
    (src / "fleet").mkdir(parents=True)
    git(src, "init", "-q")
    write_fleet(src / "fleet")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "one")
    (src / "fleet" / "sites" / "lyon" / "dns.yaml").write_text(SERVICE.format(name="dns-lyon", ip="10.96.1.11"))
    (src / "fleet" / "nodes" / "lyon-1").mkdir(parents=True)
    (src / "fleet" / "nodes" / "lyon-1" / "own.yaml").write_text(SERVICE.format(name="own", ip="10.96.4.10"))
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "two")
    (src / "fleet" / "fleet.yaml").write_text("kind: [broken\n")  # the worktree is not the revision
    old = read_revision(src / "fleet", "HEAD~1", identity=LYON)
    new = read_revision(src / "fleet", "HEAD", identity=LYON)
    assert old.ok and new.ok, [str(p) for p in old.problems + new.problems]
    assert services(old) == {"web", "dns-lyon"} and services(new) == {"web", "dns-lyon", "own"}
    assert {p.file for p in new.problems} <= {"HEAD:fleet/fleet.yaml"}
    listed = revision_files(src / "fleet", "HEAD")
    assert listed.fleet.file[0] == "HEAD:fleet/fleet.yaml" and b"kind: Fleet" in listed.fleet.file[2]
    assert "HEAD:fleet/sites/paris/broken.yaml" in [f[0] for f in listed.files]
    paris = listed_node(listed, Identity("paris-1", (("site", "paris"),)))
    assert [f[0] for f in paris.files] == ["HEAD:fleet/base/web.yaml", "HEAD:fleet/sites/paris/broken.yaml",
                                          "HEAD:fleet/sites/paris/dns.yaml"] and paris.layers == (0, 1, 1)
    nowhere = listed_node(listed, Identity("x", (("site", "nice"),)))
    assert not nowhere.files and "layer sites/nice does not exist" in nowhere.problems[0].message
    assert nowhere.problems[0].file == "HEAD:fleet/fleet.yaml" and nowhere.problems[0].line == 5


def archive(tmp: Path, how: str) -> bytes:
    """A fleet root as a tar archive, made by the real tool: `git archive HEAD` (pax, with
    its global header) or GNU `tar -c` (directories and files)."""
    src = tmp / "tree"
    src.mkdir()
    write_fleet(src)
    if how == "git":
        git(src, "init", "-q")
        git(src, "add", "-A")
        git(src, "commit", "-q", "-m", "fleet")
        return subprocess.run(["git", "-C", str(src), "archive", "HEAD"], capture_output=True, check=True).stdout
    return subprocess.run(["tar", "-c", "-C", str(src), "."], capture_output=True, check=True).stdout


@pytest.mark.parametrize("how", ["git", "tar"])
def test_stdin_tar_of_a_fleet_root_is_projected_for_the_node(tmp_path, how):
    import io

    from reconciler.intake.inventory import read_stdin as read_stdin_inventory

    raw = archive(tmp_path, how)
    assert raw[257:262] == b"ustar"
    lyon = read_stdin_inventory(io.BytesIO(raw), identity=LYON)
    assert lyon.ok, [str(p) for p in lyon.problems]
    assert services(lyon) == {"web", "dns-lyon"} and lyon.files == 2  # Paris's broken file never parsed
    assert lyon.inventory.revision == f"sha256:{lyon.digest}"
    paris = read_stdin_inventory(io.BytesIO(raw), identity=Identity("paris-1", (("site", "paris"),)))
    assert not paris.ok and any(p.file == "<stdin>/sites/paris/broken.yaml" for p in paris.errors)
    unknown = read_stdin_inventory(io.BytesIO(raw))
    assert not unknown.ok and "fleet repository" in unknown.errors[0].message


def test_stdin_tar_of_a_plain_tree_and_a_fleet_stream(tmp_path):
    """Through the command: a tar without fleet.yaml is a plain tree; a YAML stream holding
    a Fleet says to pipe an archive."""
    tree = tmp_path / "plain"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "web.yaml").write_text(SERVICE.format(name="web", ip="10.96.0.10"))
    (tree / "a" / "README.md").write_text("not a manifest\n")
    (tree / ".hidden.yaml").write_text("kind: [broken\n")
    plain = subprocess.run(["tar", "-c", "-C", str(tree), "."], capture_output=True, check=True).stdout
    p = nftrec_bytes("validate", "-", input=plain)
    assert p.returncode == 0, p.stdout + p.stderr
    p = nftrec_bytes("render", "-", input=plain)
    assert p.returncode == 0 and "10.96.0.10" in p.stdout, p.stdout + p.stderr
    p = nftrec_bytes("validate", "-", input=(FLEET + "---\n" + SERVICE.format(name="web", ip="10.96.0.10")).encode())
    assert p.returncode == 1 and "a fleet needs its directory tree: pipe a tar archive" in p.stdout + p.stderr
    assert "git archive HEAD | nftrec validate -" in p.stdout + p.stderr


@pytest.mark.parametrize("case,why", [
    ("symlink", "a symbolic link"), ("hardlink", "a hard link"), ("dotdot", "'..'"), ("absolute", "an absolute path"),
    ("fifo", "a FIFO")])
def test_stdin_tar_refusals_are_unpacks(tmp_path, case, why):
    """The archive on standard input is refused as an artifact's layer is (intake/unpack.py)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = SERVICE.format(name="web", ip="10.96.0.10").encode()
        info = tarfile.TarInfo("web.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        bad = tarfile.TarInfo({"dotdot": "../x.yaml", "absolute": "/etc/x.yaml"}.get(case, "x.yaml"))
        if case == "symlink":
            bad.type, bad.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif case == "hardlink":
            bad.type, bad.linkname = tarfile.LNKTYPE, "web.yaml"
        elif case == "fifo":
            bad.type = tarfile.FIFOTYPE
        tar.addfile(bad, io.BytesIO(b"") if bad.isreg() else None)
    p = nftrec_bytes("validate", "-", input=buf.getvalue())
    assert p.returncode == 1 and why in p.stdout + p.stderr and "<stdin>" in p.stdout + p.stderr, p.stdout + p.stderr


def nftrec_bytes(*args: str, input: bytes, config: Path | None = None) -> subprocess.CompletedProcess:
    import os
    import sys

    cmd = [sys.executable, "-m", "reconciler.cli", *args, *(["--config", str(config)] if config else [])]
    p = subprocess.run(cmd, input=input, capture_output=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    out = subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())
    assert "Traceback" not in out.stderr, out.stderr
    return out


@pytest.mark.kernel
def test_oci_artifact_of_a_fleet_root_applies_the_nodes_site(registry, tmp_path, netns):  # noqa: F811
    """A `flux push artifact`-shaped artifact whose tree has fleet.yaml at its top, applied
    by a node whose labels pick Lyon: only Lyon's Services (and the base's) in the kernel."""
    from test_cli_kernel import CONFIG, listing, ok
    from test_cli_kernel import nftrec as cli

    tree = tmp_path / "tree"
    tree.mkdir()
    write_fleet(tree)
    files = {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}
    push_artifact(registry.host, "fleet/edge", "v1", files)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(CONFIG.read_text().replace("nodeName: edge-1", "nodeName: lyon-1\nnodeLabels: {site: lyon}")
                   + "oci:\n  insecure: true\n")
    state = tmp_path / "state"
    ok(cli("apply", registry.ref("fleet/edge", "v1"), state=state, ns=netns, config=cfg))
    rules = listing(netns)
    assert "10.96.0.10" in rules and "10.96.1.10" in rules and "10.96.2.10" not in rules


@needs_ssh
def test_watch_verified_fleet_reads_the_nodes_layers_of_each_signed_commit(tmp_path):
    """The watch's gate (daemon/signed.py) and Intake on a fleet root under `verify`: the
    signed commit's projection, never the worktree's edits; a new commit that changes only
    another site's layer parses nothing for this node (held blobs); read_verified agrees."""
    from reconciler.daemon.signed import SignatureGate
    from reconciler.intake import Intake

    fleet = SignedFleet(tmp_path)
    fleet.gs.sync("main")
    gate = SignatureGate()
    assert gate.configure(fleet.verify)
    intake = Intake(fleet.gs.current, identity=LYON)
    snap = gate.read(intake, None, again=True)
    assert snap.ok and {s.name for s in snap.inventory.services} == {"web", "dns-lyon"}, snap.problems
    assert snap.revision == fleet.first and intake.parsed == 2
    _, oracle = fleet.read()
    assert snap.digest == oracle.digest
    (fleet.gs.current / "fleet.yaml").write_text(FLEET.replace("sites/${labels.site}", "sites/paris"))
    (fleet.gs.current / "sites" / "lyon" / "dns.yaml").write_text("kind: [broken\n")
    snap = gate.read(intake, None, again=True)
    assert snap.ok and {s.name for s in snap.inventory.services} == {"web", "dns-lyon"} and intake.parsed == 0
    (fleet.src / "sites" / "paris" / "dns.yaml").write_text(SERVICE.format(name="dns-paris", ip="10.96.2.11"))
    paris_only = fleet.commit("paris")
    push(fleet.src, fleet.remote)
    assert fleet.gs.sync("main") == paris_only
    snap = gate.read(intake, None, again=False)
    assert snap.ok and snap.revision == paris_only and intake.parsed == 0 and intake.looked == 0
    (fleet.src / "sites" / "lyon" / "dns.yaml").write_text(SERVICE.format(name="dns-lyon", ip="10.96.1.11"))
    lyon_edit = fleet.commit("lyon")
    push(fleet.src, fleet.remote)
    fleet.gs.sync("main")
    snap = gate.read(intake, None, again=False)
    assert snap.ok and snap.revision == lyon_edit and intake.parsed == 1
    assert "10.96.1.11" in str([s for s in snap.inventory.services if s.name == "dns-lyon"])


@needs_ssh
@pytest.mark.kernel
def test_apply_verified_fleet_in_the_kernel(tmp_path, netns):
    """`apply` under `verify` on git-sync's worktree of a fleet root, owned by git-sync's
    user (65534) who edits fleet.yaml, a layer file and adds the node's layer: the kernel
    gets the signed commit's projection for the node; an unsigned fleet.yaml moving the node
    to Paris is refused and the kernel keeps Lyon."""
    from test_cli_kernel import CONFIG, listing, ok
    from test_cli_kernel import nftrec as cli

    fleet = SignedFleet(tmp_path)
    fleet.gs.sync("main")
    cfg = tmp_path / "node.yaml"
    cfg.write_text(CONFIG.read_text().replace("nodeName: edge-1", "nodeName: lyon-1\nnodeLabels: {site: lyon}")
                   + f"verify:\n  mode: HEAD\n  keys: [{fleet.key}.pub]\n")
    state = tmp_path / "state"
    wt = fleet.gs.current
    (wt / "fleet.yaml").write_text(FLEET.replace("sites/${labels.site}", "sites/paris"))
    (wt / "sites" / "lyon" / "dns.yaml").write_text(SERVICE.format(name="dns-lyon", ip="10.96.9.9"))
    (wt / "nodes" / "lyon-1").mkdir(parents=True)
    (wt / "nodes" / "lyon-1" / "extra.yaml").write_text(SERVICE.format(name="extra", ip="10.96.9.10"))
    subprocess.run(["chown", "-R", "65534:65534", str(fleet.gs.root)], check=True)
    p = ok(cli("apply", str(wt), state=state, ns=netns, config=cfg))
    assert f"revision {fleet.first[:12]} verified" in p.stdout + p.stderr
    rules = listing(netns)
    assert "10.96.0.10" in rules and "10.96.1.10" in rules
    assert "10.96.2.10" not in rules and "10.96.9.9" not in rules and "10.96.9.10" not in rules
    (fleet.src / "fleet.yaml").write_text(FLEET.replace("sites/${labels.site}", "sites/paris"))
    unsigned = fleet.commit("move", sign=False)
    push(fleet.src, fleet.remote)
    subprocess.run(["chown", "-R", "0:0", str(fleet.gs.root)], check=True)
    assert fleet.gs.sync("main") == unsigned
    p = cli("apply", str(fleet.gs.current), state=state, ns=netns, config=cfg)
    assert p.returncode == 1 and "refused (unsigned)" in p.stderr, p.stderr
    rules = listing(netns)
    assert "10.96.1.10" in rules and "10.96.2.10" not in rules


@pytest.mark.parametrize("how", ["git", "tar"])
def test_stdin_fleet_archive_through_the_commands(tmp_path, how):
    """`git archive HEAD | nftrec validate -` and `render -` project the archive for the
    node config's identity, or --node/--labels'."""
    raw = archive(tmp_path, how)
    cfg = tmp_path / "node.yaml"
    cfg.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: lyon-1\nnodeLabels: {site: lyon}\n"
                   "nodeIPs: [192.168.50.2]\n")
    p = nftrec_bytes("validate", "-", input=raw, config=cfg)
    assert p.returncode == 0, p.stdout + p.stderr
    p = nftrec_bytes("render", "-", input=raw, config=cfg)
    assert p.returncode == 0 and "10.96.1.10" in p.stdout and "10.96.2.10" not in p.stdout, p.stdout + p.stderr
    p = nftrec_bytes("render", "--node", "paris-1", "--labels", "site=paris", "-", input=raw, config=cfg)
    assert p.returncode == 1 and "<stdin>/sites/paris/broken.yaml" in p.stdout + p.stderr, p.stdout + p.stderr


def test_diff_git_of_a_fleet_root_is_the_nodes(tmp_path):
    """`nftrec diff --git DIR A..B` on a fleet root: each revision read from git's objects
    and projected for the node config's identity."""
    src = tmp_path / "repo"
    src.mkdir()
    git(src, "init", "-q")
    write_fleet(src)
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "one")
    (src / "sites" / "lyon" / "dns.yaml").write_text(SERVICE.format(name="dns-lyon", ip="10.96.1.11"))
    (src / "sites" / "paris" / "dns.yaml").write_text(SERVICE.format(name="dns-paris", ip="10.96.2.11"))
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "two")
    cfg = tmp_path / "node.yaml"
    cfg.write_text("apiVersion: nftrec/v1alpha1\nkind: NodeConfig\nnodeName: lyon-1\nnodeLabels: {site: lyon}\n"
                   "nodeIPs: [192.168.50.2]\n")
    p = nftrec_bytes("diff", "--git", str(src), "HEAD~1..HEAD", input=b"", config=cfg)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dns-lyon" in p.stdout and "dns-paris" not in p.stdout, p.stdout


def test_memory_sink_limits_and_refusals():
    """unpack.read_tar into memory keeps the disk's limits: entries (directories counted),
    bytes, a second entry for one path, a directory where a file is."""
    import io
    import tarfile

    from reconciler.intake.oci_reference import SourceError
    from reconciler.intake.unpack import Memory, read_tar

    def tar(*members: tuple[str, bytes | None]) -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in members:
                info = tarfile.TarInfo(name)
                if data is None:
                    info.type = tarfile.DIRTYPE
                    t.addfile(info)
                else:
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        buf.seek(0)
        return buf

    mem = Memory("x")
    read_tar(tar(("a/", None), ("a/b/c.yaml", b"1"), ("d.yaml", b"22")), mem, "x", 4, 3)
    assert mem.files == {"a/b/c.yaml": b"1", "d.yaml": b"22"} and mem.dirs == {"a", "a/b"}
    for members, limits, says in [
        ((("a/b/c.yaml", b"1"), ("d.yaml", b"2")), (3, 10), "more than 3 entries"),
        ((("a.yaml", b"12"), ("b.yaml", b"34")), (10, 3), "more than 3 bytes"),
        ((("a.yaml", b"1"), ("a.yaml", b"2")), (10, 10), "a second entry for one path"),
        ((("a", b"1"), ("a/b.yaml", b"2")), (10, 10), "a directory where the file 'a' is"),
    ]:
        with pytest.raises(SourceError) as e:
            read_tar(tar(*members), Memory("x"), "x", *limits)
        assert says in str(e.value), (members, str(e.value))
