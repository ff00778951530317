"""The on-disk format of every intake cache (the per-file results of intake/cache.py, the
node config's settings): one file per key, `<dir>/<key[:2]>/<key>.jsonl`, a header line
(format, nftrec version, key, sha256 of the rest) and then the body, one JSON value per
line. JSON only: reading a cache never runs code. A bad entry is ignored (debug log) and
rewritten; writes are atomic. Keys cover `code_digest()`: nftrec, Python and libraries.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

from reconciler import logs
from reconciler.atomic import atomic_write

FORMAT = 3
_TEMP_MAX_AGE = 3600.0  # seconds before a temp file of an interrupted write is removed
# the distributions whose code decides what a manifest or a node config reads as
LIBRARIES = ("ruamel.yaml", "ruamel.yaml.clib", "jsonschema", "referencing")
_PACKAGE = Path(__file__).resolve().parents[1]  # reconciler/


def library_versions() -> dict[str, str]:
    """Python's version and each of LIBRARIES' ("" when not installed), from the names of
    the installed distributions' metadata directories: one listing per sys.path entry, not
    importlib.metadata's search per name (which costs as much as a no-op `plan`)."""
    wanted = {_normalized(name): name for name in LIBRARIES}
    out = {"python": f"{sys.implementation.name} {sys.version}"}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for f in names:
            if f.endswith((".dist-info", ".egg-info")):
                name, _, version = f.rsplit(".", 1)[0].partition("-")
                lib = wanted.get(_normalized(name))
                if lib is not None and lib not in out:  # the first on sys.path, as import finds it
                    out[lib] = version
    return {**{name: "" for name in LIBRARIES}, **out}


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


@lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over every module of the package, the JSON Schemas and library_versions()
    (the modules' bytes include nftrec's version)."""
    from reconciler.intake.schema_files import schema_dir

    h = hashlib.sha256(json.dumps(library_versions(), sort_keys=True).encode() + b"\0")
    files = sorted(_PACKAGE.rglob("*.py"))
    try:
        files += sorted(schema_dir().glob("*.json"))
    except FileNotFoundError:
        pass
    for f in files:
        try:
            data = f.read_bytes()
        except OSError:
            data = b"<unreadable>"
        h.update(f"{f.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def entry_key(kind: str, raw: bytes) -> str:
    """The key of a cache entry: what it caches (`kind`, with whatever besides the bytes
    the result depends on), the input's bytes, and the code digest."""
    h = hashlib.sha256(f"nftrec-{kind}\0{FORMAT}\0{code_digest()}\0".encode())
    h.update(raw)
    return h.hexdigest()


class Corrupt(Exception):
    """An entry that cannot be trusted."""


class Cache:
    """One cache directory; safe against other processes using it. `name`: for logs."""

    def __init__(self, directory: Path | str, name: str, keep: int):
        self.dir = Path(directory)
        self.name = name
        self.keep = keep  # entries kept at least, when pruning
        self.used: list[Path] = []
        self.written = 0
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.jsonl"

    def get(self, key: str) -> list[bytes] | None:
        """The entry's body lines (checked, not decoded), or None."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            logs.log.debug(f"{self.name}: cannot read {path} ({e.strerror or e}); computing it instead")
            return None
        try:
            lines = _check_entry(raw, key)
        except Corrupt as e:
            self.ignore(key, str(e))
            return None
        self.used.append(path)
        return lines

    def ignore(self, key: str, why: str) -> None:
        logs.log.debug(f"{self.name}: ignoring {self.path(key)}: {why}; computing it and rewriting the entry")

    def put(self, key: str, body: list) -> None:
        """Store one entry whose body lines are the JSON values in `body`."""
        from reconciler import __version__

        try:
            data = b"\n".join(json.dumps(v, ensure_ascii=True, separators=(",", ":"), allow_nan=True).encode("ascii")
                              for v in body)
        except (TypeError, ValueError, RecursionError) as e:  # a value JSON cannot hold
            logs.log.debug(f"{self.name}: not caching an entry ({e})")
            return
        header = json.dumps({"format": FORMAT, "nftrec": str(__version__), "key": key,
                             "sha256": hashlib.sha256(data).hexdigest()}, separators=(",", ":")).encode()
        path = self.path(key)
        try:
            atomic_write(path, header + b"\n" + data, 0o600, durable=False)
        except OSError as e:  # a read-only or full state directory: run without the cache
            logs.log.debug(f"{self.name}: cannot write {path} ({e.strerror or e}); continuing without it")
            return
        self.used.append(path)
        self.written += 1

    def finish(self, files_read: int = 0) -> None:
        """Refresh the mtime of the entries this run used; when it wrote any, delete the
        least recently used others beyond max(keep, 3 x files_read), and stale temp files."""
        now = time.time()
        for p in self.used:
            try:
                os.utime(p, (now, now))
            except OSError:
                pass
        if self.hits or self.misses:
            logs.log.debug(f"{self.name} {self.dir}: {self.hits} hit(s), {self.misses} miss(es), "
                           f"{self.written} written")
        if not self.written:
            return
        used = set(self.used)
        entries: list[tuple[float, Path]] = []
        try:
            subdirs = list(os.scandir(self.dir))
        except OSError:
            return
        for d in subdirs:
            if not d.is_dir(follow_symlinks=False):
                continue
            try:
                for e in os.scandir(d.path):
                    try:
                        mtime = e.stat(follow_symlinks=False).st_mtime
                    except OSError:
                        continue
                    if e.name.startswith("."):  # a temp file of an interrupted write
                        if now - mtime > _TEMP_MAX_AGE:
                            _unlink(Path(e.path))
                    elif Path(e.path) not in used:
                        entries.append((mtime, Path(e.path)))
            except OSError:
                continue
        excess = len(entries) + len(used) - max(self.keep, 3 * files_read)
        for _, p in sorted(entries)[:max(excess, 0)]:
            _unlink(p)


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _check_entry(raw: bytes, key: str) -> list[bytes]:
    from reconciler import __version__

    head, sep, body = raw.partition(b"\n")
    if not sep:
        raise Corrupt("no header line (truncated?)")
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        raise Corrupt("the header is not JSON") from None
    if not isinstance(header, dict):
        raise Corrupt("the header is not a JSON object")
    if header.get("format") != FORMAT:
        raise Corrupt(f"format {header.get('format')!r}, this nftrec reads {FORMAT}")
    if header.get("nftrec") != str(__version__):
        raise Corrupt(f"written by nftrec {header.get('nftrec')!r}, this is {__version__}")
    if header.get("key") != key:
        raise Corrupt("it belongs to another key (a foreign or moved file)")
    if header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise Corrupt("its checksum does not match (damaged)")
    return body.split(b"\n")


def decode(line: bytes, kind: type):
    """One body line decoded, of JSON type `kind` (dict or list) or null; Corrupt if not."""
    try:
        v = json.loads(line)
    except (ValueError, RecursionError):
        raise Corrupt("a line is not JSON") from None
    if v is not None and type(v) is not kind:
        raise Corrupt(f"a line is not a JSON {'object' if kind is dict else 'array'}")
    return v
