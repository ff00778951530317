"""Manifests that are not a directory on disk: standard input (`-`, as kubectl and
kubeconform read it: a YAML stream, or a tar archive of a tree, a fleet root's too) and
files held in memory (a git revision, see intake/git.py). They go through load.read_file,
so the same bytes are refused or accepted exactly as in a file; only the display path
differs (`<stdin>:12:3: ...`, `<stdin>/base/web.yaml:3:1: ...`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from reconciler.intake.fleet import FLEET_FILE
from reconciler.intake.load import Document, LoadResult, read_file, tree_digest
from reconciler.intake.parse import MAX_FILE_BYTES
from reconciler.intake.problems import ERROR, Problem

if TYPE_CHECKING:
    from reconciler.intake.gitobjects import ManifestFiles

STDIN = "-"
STDIN_DISPLAY = "<stdin>"
TAR_HEAD = 512  # a tar header block
TAR_MAGIC = 257  # where a POSIX or GNU tar header holds "ustar"


def is_stdin(root: str | Path | None) -> bool:
    """`-` names standard input wherever a manifest directory is expected."""
    return root is not None and str(root) == STDIN


def display_root(root: str | Path) -> str:
    """How a manifest root is named in messages: `<stdin>` for `-`."""
    return STDIN_DISPLAY if is_stdin(root) else str(root)


@dataclass
class _Stat:
    st_size: int


class Blob:
    """The part of pathlib.Path that load.read_file uses (`name`, `stat`, `read_bytes`),
    over bytes already in memory. `name` decides the parser: `.json` JSON, else YAML
    (which also reads JSON, as kubectl's YAML-or-JSON decoder does for stdin)."""

    def __init__(self, name: str, raw: bytes | int):
        self.name, self._raw = name, raw

    def stat(self) -> _Stat:
        # an int is the size of a blob too big to read (read_file refuses it by size)
        return _Stat(self._raw if isinstance(self._raw, int) else len(self._raw))

    def read_bytes(self) -> bytes:
        return self._raw

    def __str__(self) -> str:
        return self.name


def load_blobs(files: list[tuple[str, bytes | int]], *, revision: str | None, root: str,
               problems: list[Problem] | None = None) -> LoadResult:
    """A LoadResult from (display path, bytes) pairs, read as load_manifests reads files;
    every display path starts with `root`. `revision`: the git commit they come from, else
    None for `sha256:<digest>`. A size instead of bytes stands for a file over the size
    limit, refused unread."""
    problems = list(problems or [])
    docs: list[Document] = []
    digest = tree_digest([read_file(display, Blob(display.rsplit("/", 1)[-1], raw), problems, docs)  # type: ignore[arg-type]
                          for display, raw in sorted(files, key=lambda f: f[0])], prefix=root)
    return LoadResult(docs, problems, revision or f"sha256:{digest}", digest, len(files), root)


class _Rest:
    """A stream whose first bytes were read already (to tell a tar archive)."""

    def __init__(self, head: bytes, stream: BinaryIO):
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (self.head, b"") if n is None or n < 0 or n >= len(self.head) else \
                (self.head[:n], self.head[n:])
            return out
        return self.stream.read(n)


def stdin_source(stream: BinaryIO | None = None) -> LoadResult | ManifestFiles:
    """What standard input holds: a tar archive (`git archive HEAD`, `tar -c`: the ustar
    magic at offset 257) read into memory with an artifact's limits and refusals
    (intake/unpack.py), as ManifestFiles displayed `<stdin>/path` (a fleet root when
    fleet.yaml is at its top); else one stream of YAML documents (`---`), JSON, or a `kind:
    List`, loaded with positions `<stdin>:line:col`, where a Fleet is an error."""
    stream = stream if stream is not None else sys.stdin.buffer
    head = stream.read(TAR_HEAD)
    if head[TAR_MAGIC:TAR_MAGIC + 5] == b"ustar":
        return _tar_files(_Rest(head, stream))
    loaded = load_blobs([(STDIN_DISPLAY, head + stream.read(MAX_FILE_BYTES + 1 - len(head)))], revision=None,
                        root=STDIN_DISPLAY)
    fleet = next((d for d in loaded.documents if d.kind == "Fleet"), None)
    if fleet is not None:
        loaded.problems.append(Problem(STDIN_DISPLAY, fleet.source.line, fleet.source.col, "Fleet", "", "",
                                       "a fleet needs its directory tree: pipe a tar archive, e.g. `git archive HEAD | "
                                       "nftrec validate -`", ERROR))
    return loaded


def _tar_files(stream) -> ManifestFiles:
    from reconciler.intake.gitobjects import FleetRoot, ManifestFiles
    from reconciler.intake.load import SUFFIXES
    from reconciler.intake.oci_reference import SourceError
    from reconciler.intake.unpack import MAX_BYTES, MAX_ENTRIES, Memory, read_tar

    root = STDIN_DISPLAY + "/"
    tree = Memory("the archive on standard input")
    try:
        read_tar(stream, tree, tree.what, MAX_ENTRIES, MAX_BYTES)
    except SourceError as e:
        return ManifestFiles("", root, (), (Problem(STDIN_DISPLAY, 0, 0, "", "", "", str(e), ERROR),))
    files = tuple((root + rel, "", raw if len(raw) <= MAX_FILE_BYTES else len(raw)) for rel, raw in sorted(tree.files.items())
                  if rel.endswith(SUFFIXES) and rel != FLEET_FILE and not any(p.startswith(".") for p in rel.split("/")))
    fleet = None
    if FLEET_FILE in tree.files:
        raw = tree.files[FLEET_FILE]
        fleet = FleetRoot(None, ".", (root + FLEET_FILE, "", raw if len(raw) <= MAX_FILE_BYTES else len(raw)),
                          frozenset(tree.dirs))
    return ManifestFiles("", root, files, (), fleet)


def read_stdin_inventory(stream: BinaryIO | None = None, *, identity=None, strict: bool = False,
                         fields: str = "strict"):
    """inventory.read_inventory of `-`: stdin_source read as a plain tree, or, for an
    archive of a fleet root, `identity`'s projection of it. The revision is
    `sha256:<digest>` of the files read."""
    from dataclasses import replace

    from reconciler.intake.inventory import inventory_from_load, read_verified

    got = stdin_source(stream)
    if isinstance(got, LoadResult):
        return inventory_from_load(got, strict=strict, fields=fields)
    result = read_verified(got, identity=identity, strict=strict, fields=fields)
    return replace(result, inventory=replace(result.inventory, revision=f"sha256:{result.digest}"))
