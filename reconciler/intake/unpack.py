"""Safe extraction of an artifact's tar.gz layer (or of a tar into memory: `read_tar` with
`Memory`, standard input's archive): regular files and directories only, every
name relative, without `..` and bounded in depth and length, bounded in entries (every
directory created counts, parents too) and bytes (counted while writing, so a gzip bomb
stops at the limit), into a fresh hidden directory that is renamed into place only when
the whole archive passed. A refusal removes that directory: nothing is left.
Files are 0644 and directories 0755, owned by whoever runs nftrec; no owner, mode, time,
setuid bit or link of the archive is ever applied.
"""

# Links are refused, every one, symbolic or hard, inside the tree or not: `flux push
# artifact` packs regular files and directories only, and a tree without links cannot be
# escaped through one, whatever order the entries come in. Devices, FIFOs, sparse and
# other special entries are refused too. tarfile reads the stream once (mode "r|"):
# no seeking, no member list kept, every byte through _Metered's budget; its `filter=`
# is not used (Python 3.9.2 lacks it).

from __future__ import annotations

import ctypes
import gzip
import os
import secrets
import shutil
import stat
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from reconciler.intake.oci_reference import SourceError

MAX_ENTRIES = 100_000  # files and directories in one artifact
MAX_BYTES = 100 << 20  # unpacked bytes in one artifact by default (Flux's default); oci.maxSize
MAX_DEPTH = 64  # components of one member's path
MAX_NAME = 1024  # bytes of one member's path
CHUNK = 1 << 20
HEADER_ROOM = 1 << 20  # decompressed bytes of tar headers (pax records, GNU long names) before one member
TMP_PREFIX = ".tmp-"


def unpack(layer: Path, store: Path, name: str, *, what: str = "the layer",
           max_entries: int | None = None, max_bytes: int | None = None, files: dict[str, bytes] | None = None) -> Path:
    """Extract the tar.gz `layer` into <store>/<name> (a directory) and return it; when it
    exists already (pulled concurrently), the existing one is kept. `files` (name: bytes)
    are written at the tree's top before it is renamed into place (the metadata); the
    archive may not hold them. SourceError unsafe-archive / too-large / bad-artifact on
    refusal, nothing left behind."""
    final = store / name
    tmp = store / f"{TMP_PREFIX}{secrets.token_hex(8)}"
    tmp.mkdir(mode=0o700)  # 0755 once complete: no reader sees it half-written anyway (hidden)
    try:
        _extract(layer, tmp, what, MAX_ENTRIES if max_entries is None else max_entries,
                 MAX_BYTES if max_bytes is None else max_bytes)
        for extra, raw in (files or {}).items():
            if os.path.lexists(tmp / extra):
                raise _refuse(what, extra, "a name nftrec keeps for its own metadata")
            (tmp / extra).write_bytes(raw)
            os.chmod(tmp / extra, 0o644)
        os.chmod(tmp, 0o755)
        _sync(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another pull of the same digest won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _refuse(what: str, member: str, why: str) -> SourceError:
    shown = repr(member[:200])
    return SourceError("unsafe-archive", f"{what} holds {shown}, {why}: the artifact is refused, nothing was unpacked")


class _Metered:
    """The decompressed layer as tarfile reads it, on a budget that the loop sets before
    each header (HEADER_ROOM) and each member's data (its size): tarfile reads a pax
    header or a GNU long name whole into memory, so one that claims gigabytes must stop
    at the budget, not fill the memory first."""

    def __init__(self, raw):
        self.raw, self.room = raw, HEADER_ROOM

    def read(self, n: int = -1) -> bytes:
        want = self.room + 1 if n is None or n < 0 else min(n, self.room + 1)
        chunk = self.raw.read(want)
        self.room -= len(chunk)
        if self.room < 0:
            raise SourceError("too-large", "a tar header of the layer is over "
                                           f"{HEADER_ROOM} bytes: refused, nothing was unpacked")
        return chunk


def _extract(layer: Path, root: Path, what: str, max_entries: int, max_bytes: int) -> None:
    try:
        with gzip.open(layer, "rb") as gz:
            read_tar(gz, _Disk(root, what), what, max_entries, max_bytes, "tar.gz")
    except (zlib.error, EOFError, OSError) as e:  # (gzip.open's own; read_tar translates the rest)
        raise SourceError("bad-artifact", f"{what} is not a readable tar.gz ({type(e).__name__}: {str(e)[:200]}): "
                                          f"refused, nothing was unpacked") from None


def read_tar(stream, sink, what: str, max_entries: int, max_bytes: int, kind: str = "tar") -> None:
    """Every member of the tar read from `stream` (once, never seeking), checked (module
    comment) and handed to `sink`: mkdirs(rel, member name, entries so far, limit) -> the
    directories it created; write(tar, member, rel, bytes allowed) -> the bytes written.
    SourceError on refusal."""
    entries = 0
    total = 0
    try:
        meter = _Metered(stream)
        with tarfile.open(fileobj=meter, mode="r|") as tar:  # reads the meter in records, never seeks
            while True:
                meter.room = HEADER_ROOM
                member = tar.next()
                if member is None:
                    break
                entries += 1
                rel = _relative(member.name, what)
                if member.isdir():
                    if rel is not None:
                        entries += max(0, sink.mkdirs(rel, member.name, entries, max_entries) - 1)
                    _check_entries(entries, max_entries, what)
                    continue
                _check_entries(entries, max_entries, what)
                if member.issym() or member.islnk():
                    raise _refuse(what, member.name, f"a {'symbolic' if member.issym() else 'hard'} link "
                                                     f"(to {member.linkname[:200]!r}); an artifact holds files and directories only")
                if member.ischr() or member.isblk():
                    raise _refuse(what, member.name, "a device node")
                if member.isfifo():
                    raise _refuse(what, member.name, "a FIFO")
                if not member.isreg() or member.issparse():
                    raise _refuse(what, member.name, f"an entry of type {member.type!r}; only files and directories are unpacked")
                if rel is None:
                    raise _refuse(what, member.name, "a file without a name")
                if total + member.size > max_bytes:
                    raise SourceError("too-large", f"{what} unpacks to more than {max_bytes} bytes "
                                                   f"(at {member.name[:200]!r}): refused, nothing was unpacked")
                meter.room = member.size + HEADER_ROOM  # its data, block padding and tarfile's read-ahead
                entries += sink.mkdirs(rel.parent, member.name, entries, max_entries)
                total += sink.write(tar, member, rel, max_bytes - total)
    except SourceError:
        raise
    except (tarfile.TarError, zlib.error, EOFError, OSError, UnicodeError) as e:
        raise SourceError("bad-artifact", f"{what} is not a readable {kind} ({type(e).__name__}: {str(e)[:200]}): "
                                          f"refused, nothing was unpacked") from None


class _Disk:
    """read_tar's sink that unpacks under `root`."""

    def __init__(self, root: Path, what: str):
        self.root, self.what = root, what

    def mkdirs(self, rel: PurePosixPath, member: str, used: int, limit: int) -> int:
        return _mkdirs(self.root, rel, self.what, member, used, limit)

    def write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: PurePosixPath, room: int) -> int:
        return _write(tar, member, self.root.joinpath(*rel.parts), room, self.what)


class Memory:
    """read_tar's sink that keeps the tree in memory: `files` {relative path: bytes} and
    `dirs` (relative paths), with the refusals of the disk's (a directory where a file is,
    a second entry for one path)."""

    def __init__(self, what: str):
        self.what = what
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = set()

    def mkdirs(self, rel: PurePosixPath, member: str, used: int, limit: int) -> int:
        created = 0
        for i in range(1, len(rel.parts) + 1):
            path = "/".join(rel.parts[:i])
            if path in self.files:
                raise _refuse(self.what, member, f"a directory where the file {rel.parts[i - 1]!r} is")
            if path not in self.dirs:
                self.dirs.add(path)
                created += 1
                _check_entries(used + created, limit, self.what)
        return created

    def write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: PurePosixPath, room: int) -> int:
        path = rel.as_posix()
        if path in self.files or path in self.dirs:
            raise _refuse(self.what, member.name, "a second entry for one path")
        raw = tar.extractfile(member).read(room + 1)
        if len(raw) > room:
            raise SourceError("too-large", f"{self.what} unpacks to more bytes than allowed (at {member.name[:200]!r}): "
                                           f"refused, nothing was unpacked")
        self.files[path] = raw
        return len(raw)


def _relative(name: str, what: str) -> PurePosixPath | None:
    """The member's path relative to the root; None for the root itself ("." or "./")."""
    if "\0" in name:
        raise _refuse(what, name, "a name with a NUL byte")
    if name.startswith("/"):
        raise _refuse(what, name, "an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(what, name, "a path with '..'")
    if len(parts) > MAX_DEPTH or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        raise _refuse(what, name, f"a path deeper than {MAX_DEPTH} directories or longer than {MAX_NAME} bytes")
    return PurePosixPath(*parts) if parts else None


def _check_entries(entries: int, max_entries: int, what: str) -> None:
    if entries > max_entries:
        raise SourceError("too-large", f"{what} holds more than {max_entries} entries (files and the directories "
                                       f"they need): refused, nothing was unpacked")


def _mkdirs(root: Path, rel: PurePosixPath, what: str, member: str, used: int, limit: int) -> int:
    """Create rel's directories under root (0755), each checked to be a real directory;
    how many were created. Beyond `limit` entries (`used` so far) is too-large at once."""
    path = root
    created = 0
    for part in rel.parts:
        path = path / part
        try:
            os.mkdir(path, 0o755)
            os.chmod(path, 0o755)  # whatever the umask
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise _refuse(what, member, f"a directory where the file {part!r} is") from None
            continue
        created += 1
        _check_entries(used + created, limit, what)
    return created


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, room: int, what: str) -> int:
    """Write the member's bytes to a new file `path` (0644), counting: more than `room` bytes
    is too-large at once. A name given twice is refused (O_EXCL), never overwritten."""
    src = tar.extractfile(member)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise _refuse(what, member.name, "a second entry for one path") from None
    written = 0
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o644)
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            written += len(chunk)
            if written > room:
                raise SourceError("too-large", f"{what} unpacks to more bytes than allowed (at {member.name[:200]!r}): "
                                               f"refused, nothing was unpacked")
            out.write(chunk)
    return written


def _sync(directory: Path) -> None:
    """Flush the unpacked files before they count (the metadata is written after this):
    syncfs(2) on the store's filesystem, else sync(2)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    os.sync()
