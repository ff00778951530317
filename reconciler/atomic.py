"""Atomic file replacement, shared by every stage that keeps files (the state store in
engine/, the intake cache in intake/). It sits beside `logs.py`, below every stage.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterable


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX: the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | Iterable[bytes], mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace `path` with `data` so that readers and crashes see the old or the new file.
    `data` may be an iterable of byte strings (a large file is never joined in memory).
    The temp file is in the same directory (rename is atomic within a filesystem); with
    `durable` it and then the directory are fsynced. A cache that checks its entries on
    read may pass durable=False: after a power loss, a damaged entry, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-", suffix="")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                for chunk in data:
                    f.write(chunk)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)
