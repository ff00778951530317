"""Standard input (`-`): a tar archive of a tree (`git archive HEAD`, `tar -c`: the ustar
magic at offset 257), read into memory with an OCI artifact's limits and refusals
(unpack.read_tar), displayed `<stdin>/path` and, with fleet.yaml at its top, a fleet
root; else one stream of YAML documents (`---`), JSON, or a `kind: List`, positioned
`<stdin>:line:col`, where a Fleet is an error (a fleet needs its directory tree).
"""

from __future__ import annotations

import sys
from typing import BinaryIO

from reconciler.intake.fleet import FLEET_FILE
from reconciler.intake.gitobjects import FleetRoot, ManifestFiles
from reconciler.intake.load import SUFFIXES, LoadResult
from reconciler.intake.oci_reference import SourceError
from reconciler.intake.parse import MAX_FILE_BYTES
from reconciler.intake.problems import ERROR, Problem
from reconciler.intake.sources import STDIN_DISPLAY, load_blobs
from reconciler.intake.unpack import MAX_BYTES, MAX_ENTRIES, Memory, read_tar

TAR_HEAD = 512  # a tar header block
TAR_MAGIC = 257  # where a POSIX or GNU tar header holds "ustar"


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
    """What standard input holds (module doc): ManifestFiles of an archive (a fleet root
    when fleet.yaml is at its top; its revision left "": the caller names it by digest),
    else the stream loaded."""
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
    """The archive's manifest files (suffixes and hidden entries as a directory's walk)."""
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
