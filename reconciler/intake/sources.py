"""Manifests that are not a directory on disk: standard input (`-`, as kubectl and
kubeconform read it; intake/stdin.py) and files held in memory (a git revision, see
intake/git.py). They go through load.read_file, so the same bytes are refused or accepted
exactly as in a file; only the display path differs (`<stdin>:12:3: ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reconciler.intake.load import Document, LoadResult, read_file, tree_digest
from reconciler.intake.problems import Problem

STDIN = "-"
STDIN_DISPLAY = "<stdin>"


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
