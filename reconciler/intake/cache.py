"""The intake cache: parsed, validated and modelled documents per manifest file, kept in
the state directory (`<state-dir>/cache/intake/`) so that one-shot runs (`validate`,
`render`, `plan`, `apply`) re-use them across runs and across git-sync's worktree paths.

Pipeline position: load -> validate -> model, each skipped for a file whose entry exists.
On a cold read the files without an entry are shared with forked children (warm.py),
which write their entries; the main process then reads those like any other entry.

Key: `digests.file_key` = sha256 of the file's bytes, the parser (suffix) and the code
digest (nftrec version, sources, JSON Schemas). Never the path or the stat: the same bytes
under another path hit, and a file edited in place (same size, same mtime) misses.

An entry holds what the file yields on its own: load's problems, each document (data,
position, List path), its per-document checks (validate.check_document) and its model
objects. Paths are not stored: the display path of the current read is re-attached to
every problem, document and model `Source`. An entry whose result would name its path in
a message is not written (it would be wrong under another path). What depends on other
files (duplicates, cross-document checks, notices per kind, --strict) runs on every read.

Format: JSON only (no pickle or marshal: reading a cache must never run code or crash the
interpreter). One file per key, `<key[:2]>/<key>.jsonl` (JSON Lines): a header line
`{"formatVersion", "nftrec", "key", "sha256" (of the rest)}`, the summary line, then the
payload. The summary (null unless the file is clean: no problem of its own, every
document a valid object without a probe annotation) holds per document its identity, its
model objects and `validate.cross_view`, the few fields the cross-document checks read.
A warm read decodes only the summaries of clean files (no documents: a stand-in `_Stub`
holds the view); when a cross-document check has something to report about one of them
(it needs positions), every such file's payload is decoded and the tree checked again,
so problems are always the ones a cold read finds. An entry that
is unreadable, damaged (checksum), of another format or nftrec, or of the wrong shape is
ignored with a debug line (`NFTREC_LOG_LEVEL=debug`) and rewritten. Writes are atomic
(temp file + rename, `reconciler.atomic`), so concurrent nftrec processes never see half an
entry; no fsync: a damaged entry after a power loss fails its checksum.

Size: entries used by a run get their mtime refreshed; when a run wrote entries and the
cache holds more than max(MAX_ENTRIES, 3 x the files read), the least recently used ones
not used by this run are deleted, and stray temp files older than an hour.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

from reconciler import logs, progress
from reconciler.atomic import atomic_write
from reconciler.heap import no_cyclic_gc
from reconciler.intake import digests, load, model, warm
from reconciler.intake.inventory import InventoryResult, build_inventory, model_objects, read_inventory
from reconciler.intake.sources import is_stdin
from reconciler.intake.load import Document, SourceFile
from reconciler.intake.problems import Problem
from reconciler.intake.schema_errors import Obj
from reconciler.intake.validate import DocumentCheck, check_document, check_tree, cross_view

FORMAT_VERSION = 2  # 2: a summary line before the payload
MAX_ENTRIES = 4096
_TEMP_MAX_AGE = 3600.0
_MODEL_TYPES = {c.__name__: c for c in (model.Service, model.ServicePort, model.LoadBalancerIngress,
                                        model.Endpoint, model.EndpointPort, model.EndpointSlice,
                                        model.ServiceCIDR)}


def _field_kinds(cls) -> tuple[tuple[str, int, str], ...]:
    """(name, how to decode, model type) per field but `source`, from the annotations:
    0 a scalar, 1 a tuple of scalars (or None), 2 a tuple of model objects, 3 one."""
    out = []
    for f in fields(cls):
        if f.name == "source":
            continue
        ann = str(f.type).replace(" ", "")
        inner = ann[len("tuple["):].split(",")[0].rstrip("]") if ann.startswith("tuple[") else ""
        if inner in _MODEL_TYPES:
            out.append((f.name, 2, inner))
        elif ann.startswith("tuple["):
            out.append((f.name, 1, ""))
        elif ann in _MODEL_TYPES:
            out.append((f.name, 3, ann))
        else:
            out.append((f.name, 0, ""))
    return tuple(out)


_KINDS = {name: _field_kinds(c) for name, c in _MODEL_TYPES.items()}
_SOURCED = {name for name, c in _MODEL_TYPES.items() if any(f.name == "source" for f in fields(c))}
_HOWS = {name: tuple(how for _, how, _ in kinds) for name, kinds in _KINDS.items()}
_FLAT = {name for name, hows in _HOWS.items() if not any(hows)}
# Decoding builds each model object's __dict__ directly instead of calling its frozen
# dataclass __init__ (one object.__setattr__ per field): at 10,000 Services a one-edit
# run decodes ~90,000 of them from the cache, the largest share of its intake. It is the __init__'s
# result exactly when the class has no __post_init__ and `source`, if any, is its last
# field (then __dict__ has __init__'s key order); otherwise __init__ is called.
_NAMES = {name: tuple(n for n, _, _ in kinds) for name, kinds in _KINDS.items()}
_DIRECT = {name for name, c in _MODEL_TYPES.items() if not hasattr(c, "__post_init__")
           and not hasattr(c, "__slots__") and (name not in _SOURCED or fields(c)[-1].name == "source")}
_SOURCE_DIRECT = not hasattr(model.Source, "__post_init__") and not hasattr(model.Source, "__slots__") \
    and [f.name for f in fields(model.Source)] == ["file", "line", "col"]
_new = object.__new__


class _Unfit(Exception):
    """This file's result cannot be stored path-free."""


class _Corrupt(Exception):
    """An entry that cannot be trusted."""


class _NeedFull(Exception):
    """A check asked a summarized document for more than its cross view (a position)."""


class _Stub:
    """A summarized document in the tree check: only `data` (validate.cross_view of the
    document); anything else (file, source, index: what a problem's position needs)
    raises _NeedFull, and _assemble decodes the payloads and checks again."""

    __slots__ = ("data",)

    def __init__(self, data: dict) -> None:
        self.data = data

    def __getattr__(self, name):
        raise _NeedFull(name)


@dataclass
class _FileResult:
    problems: list[Problem]  # load's problems for this file
    docs: list[Document]
    checks: list[DocumentCheck]
    models: list[list | None]  # per document: its model objects, None when not valid on its own
    # a summarized result (docs are _Stub): how to get the whole one (_decode of the payload)
    full: Callable[[], "_FileResult"] | None = None


class Cache:
    """One cache directory; every method is safe against other processes using it."""

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        self.used: list[Path] = []
        self.written = 0
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.jsonl"

    def get(self, key: str) -> tuple[bytes, bytes] | None:
        """The entry's summary line and payload (checked, not decoded), or None."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            logs.log.debug(f"intake cache: cannot read {path} ({e.strerror or e}); parsing the file instead")
            return None
        try:
            payload = _check_entry(raw, key)
        except _Corrupt as e:
            logs.log.debug(f"intake cache: ignoring {path}: {e}; parsing the file and rewriting the entry")
            return None
        self.used.append(path)
        return payload

    def writable(self) -> bool:
        """Whether entries can be written here (children are useful only then)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            return False
        return os.access(self.dir, os.W_OK)

    def put(self, key: str, payload: dict) -> None:
        why = self.write(key, payload)
        if why is not None:
            logs.log.debug(f"intake cache: {why}")

    def write(self, key: str, payload: dict) -> str | None:
        """Store one entry; why not, or None. Logs nothing (a forked child calls it)."""
        from reconciler import __version__

        try:
            # summary line, payload; ensure_ascii and no indent: neither holds a newline
            body = b"\n".join(json.dumps(part, ensure_ascii=True, separators=(",", ":"), allow_nan=True).encode("ascii")
                              for part in (payload.get("summary"), {k: v for k, v in payload.items() if k != "summary"}))
        except (TypeError, ValueError, RecursionError) as e:  # a value JSON cannot hold
            return f"not caching an entry ({e})"
        header = json.dumps({"formatVersion": FORMAT_VERSION, "nftrec": str(__version__), "key": key,
                             "sha256": hashlib.sha256(body).hexdigest()}, separators=(",", ":")).encode()
        path = self.path(key)
        try:
            atomic_write(path, header + b"\n" + body, durable=False)
        except OSError as e:  # a read-only or full state directory: run without the cache
            return f"cannot write {path} ({e.strerror or e}); continuing without it"
        self.used.append(path)
        self.written += 1
        return None

    def touch_and_prune(self, files_read: int) -> None:
        """Refresh the mtime of the entries this run used; prune when this run wrote."""
        now = time.time()
        for p in self.used:
            try:
                os.utime(p, (now, now))
            except OSError:
                pass
        if not self.written:
            return
        cap = max(MAX_ENTRIES, 3 * files_read)
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
                        continue
                    if Path(e.path) not in used:
                        entries.append((mtime, Path(e.path)))
            except OSError:
                continue
        excess = len(entries) + len(used) - cap
        if excess > 0:
            for _, p in sorted(entries)[:excess]:
                _unlink(p)


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _check_entry(raw: bytes, key: str) -> tuple[bytes, bytes]:
    from reconciler import __version__

    head, sep, body = raw.partition(b"\n")
    if not sep:
        raise _Corrupt("no header line (truncated?)")
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        raise _Corrupt("the header is not JSON") from None
    if not isinstance(header, dict):
        raise _Corrupt("the header is not a JSON object")
    if header.get("formatVersion") != FORMAT_VERSION:
        raise _Corrupt(f"format {header.get('formatVersion')!r}, this nftrec reads {FORMAT_VERSION}")
    if header.get("nftrec") != str(__version__):
        raise _Corrupt(f"written by nftrec {header.get('nftrec')!r}, this is {__version__}")
    if header.get("key") != key:
        raise _Corrupt("it belongs to another key (a foreign or moved file)")
    if header.get("sha256") != hashlib.sha256(body).hexdigest():
        raise _Corrupt("its checksum does not match (damaged)")
    summary, sep, payload = body.partition(b"\n")
    if not sep:
        raise _Corrupt("wrong shape (no summary line)")
    return summary, payload


def _json_object(b: bytes, what: str):
    """A summary (a JSON array or null) or payload (an object) decoded; _Corrupt if not."""
    try:
        v = json.loads(b)
    except (ValueError, RecursionError):
        raise _Corrupt(f"the {what} is not JSON") from None
    if not (type(v) is dict if what == "payload" else v is None or type(v) is list):
        raise _Corrupt(f"the {what} is not a JSON {'object' if what == 'payload' else 'array'}")
    return v


# --- encoding: path-free -------------------------------------------------------------------


def _problem_out(p: Problem, display: str) -> list:
    if p.file != display or (display and any(display in s for s in (p.message, p.obj, p.field))):
        raise _Unfit
    return [p.line, p.col, p.kind, p.obj, p.field, p.message, p.severity]


def _problem_in(v: list, display: str) -> Problem:
    line, col, kind, obj, fld, message, severity = v
    if not (type(line) is int and type(col) is int and all(type(s) is str for s in (kind, obj, fld, message, severity))):
        raise _Corrupt("a problem has the wrong shape")
    return Problem(display, line, col, kind, obj, fld, message, severity)


def _model_out(v, display: str) -> list:
    """[type, (line, col,) field values...]: positional, in dataclass field order."""
    name = type(v).__name__
    if _MODEL_TYPES.get(name) is not type(v):
        raise _Unfit
    out: list = [name]
    if name in _SOURCED:
        if v.source.file != display:
            raise _Unfit
        out += [v.source.line, v.source.col]
    for fname, how, _ in _KINDS[name]:
        x = getattr(v, fname)
        if how == 0:
            if x is not None and type(x) not in (str, int, bool, float):
                raise _Unfit
            out.append(x)
        elif how == 1:
            if x is not None and any(type(y) not in (str, int, bool, float) for y in x):
                raise _Unfit
            out.append(None if x is None else list(x))
        elif how == 2:
            out.append([_model_out(y, display) for y in x])
        else:
            out.append(None if x is None else _model_out(x, display))
    return out


def _source(display: str, line, col) -> model.Source:
    if not _SOURCE_DIRECT:
        return model.Source(display, line, col)
    src = _new(model.Source)
    src.__dict__.update(file=display, line=line, col=col)
    return src


# per model type: the positions of its fields (after `source`'s line and col) that hold
# a tuple of scalars, a tuple of model objects, one model object; the rest pass as they are
_CONVERT = {name: tuple(tuple(i for i, h in enumerate(hows) if h == how) for how in (1, 2, 3))
            for name, hows in _HOWS.items()}


def _model_in(v: list, display: str):
    name = v[0]
    cls = _MODEL_TYPES.get(name) if type(name) is str else None
    if cls is None:
        raise _Corrupt(f"unknown model type {name!r}")
    sourced = name in _SOURCED
    args = v[3:] if sourced else v[1:]  # a copy: converted in place below
    if len(args) != len(_HOWS[name]):
        raise _Corrupt(f"a {name} has {len(args)} fields, not {len(_HOWS[name])}")
    if name not in _FLAT:
        scalars, many, one = _CONVERT[name]
        for i in scalars:
            if args[i] is not None:
                args[i] = tuple(args[i])
        for i in many:
            args[i] = tuple([_model_in(y, display) for y in args[i]])
        for i in one:
            if args[i] is not None:
                args[i] = _model_in(args[i], display)
    if name not in _DIRECT:
        return cls(*args, source=model.Source(display, v[1], v[2])) if sourced else cls(*args)
    obj = _new(cls)
    d = obj.__dict__
    d.update(zip(_NAMES[name], args))
    if sourced:
        d["source"] = _source(display, v[1], v[2])
    return obj


def _summary(res: _FileResult, display: str) -> list | None:
    """Per document [kind, namespace, name, cross view, model objects] when the file is
    clean (see the module doc), else None."""
    if res.problems:
        return None
    out = []
    for doc, chk, models in zip(res.docs, res.checks, res.models):
        o = chk.obj
        if o is None or not o.valid or chk.problems or chk.unknown_kind is not None or models is None:
            return None
        view = cross_view(o.kind, doc.data)
        if view is None:
            return None
        out.append([o.kind, o.namespace, o.name, view, [_model_out(m, display) for m in models]])
    return out


def _encode(res: _FileResult, display: str) -> dict:
    summary = _summary(res, display)
    docs = []
    for doc, chk, models in zip(res.docs, res.checks, res.models):
        o = chk.obj
        docs.append({
            "data": doc.data, "line": doc.source.line, "col": doc.source.col, "index": doc.index,
            "path": list(doc.path),
            "obj": None if o is None else [o.kind, o.namespace, o.name, o.valid],
            "problems": [_problem_out(p, display) for p in chk.problems],
            "unknown": chk.unknown_kind,
            # with a summary, the models are there only (read from it in either case)
            "models": None if models is None or summary is not None else [_model_out(m, display) for m in models],
        })
    return {"summary": summary, "problems": [_problem_out(p, display) for p in res.problems], "docs": docs}


def _decode(payload: dict, display: str, real: Path, raw: bytes) -> _FileResult:
    src = SourceFile(display, str(real), raw.decode("utf-8-sig"))
    problems = [_problem_in(p, display) for p in payload["problems"]]
    docs, checks, models = [], [], []
    for d in payload["docs"]:
        data, line, col, index = d["data"], d["line"], d["col"], d["index"]
        if not (type(data) is dict and type(line) is int and type(col) is int and type(index) is int):
            raise _Corrupt("a document has the wrong shape")
        doc = Document(data, _source(display, line, col), display, index, tuple(d["path"]), src)
        o = d["obj"]
        obj = None
        if o is not None:
            kind, ns, name, valid = o
            obj = Obj(doc, kind, ns, name, bool(valid))
        unknown = d["unknown"]
        if unknown is not None and type(unknown) is not str:
            raise _Corrupt("a document has the wrong shape")
        docs.append(doc)
        checks.append(DocumentCheck(obj, tuple(_problem_in(p, display) for p in d["problems"]), unknown))
        m = d["models"]
        models.append(None if m is None else [_model_in(x, display) for x in m])
    return _FileResult(problems, docs, checks, models)


def _decode_summary(summary: list, display: str, real: Path, raw: bytes, payload: bytes) -> _FileResult:
    """A clean file's result from its summary: _Stub documents (their cross view), their
    objects and models; `full` decodes the payload into the whole result, with these
    same model objects (Inventory.origins and compile's identity checks see no change)."""
    if type(summary) is not list:
        raise _Corrupt("the summary has the wrong shape")
    docs, checks, models = [], [], []
    for d in summary:
        kind, ns, name, view, ms = d
        if not (type(kind) is str and type(ns) is str and type(name) is str and type(view) is dict and type(ms) is list):
            raise _Corrupt("a summarized document has the wrong shape")
        stub = _Stub(view)
        docs.append(stub)
        checks.append(DocumentCheck(Obj(stub, kind, ns, name, True), (), None))
        models.append([_model_in(x, display) for x in ms])

    def full() -> _FileResult:
        try:
            res = _decode(_json_object(payload, "payload"), display, real, raw)
            if len(res.docs) != len(models):
                raise _Corrupt("the payload and the summary disagree")
        except (_Corrupt, KeyError, TypeError, ValueError, AttributeError, RecursionError, UnicodeDecodeError) as e:
            # its checksum held, so a foreign writer's entry: parse the file (as read
            # again now; the digest was taken from `raw`, as for any file edited after)
            logs.log.debug(f"intake cache: ignoring the payload of {display}'s entry ({type(e).__name__}: {e}); "
                           "parsing the file")
            return _parse_file(display, real, raw, encode=False)[0]
        res.models = models
        return res

    return _FileResult([], docs, checks, models, full)


# --- one file, one tree ----------------------------------------------------------------------


class _Recorder:
    """Stands in for load's hasher: keeps the bytes it is fed (display path + raw)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, b: bytes) -> None:
        self.parts.append(b)


def _parse(display: str, real: Path, hasher) -> _FileResult:
    problems: list[Problem] = []
    docs: list[Document] = []
    load.read_file(display, real, problems, docs, hasher)
    checks = [check_document(d) for d in docs]
    models = [model_objects(c.obj) if c.obj is not None and c.obj.valid else None for c in checks]
    return _FileResult(problems, docs, checks, models)


def _key(raw: bytes, real: Path) -> str:
    return digests.file_key(raw, "json" if real.name.endswith(".json") else "yaml")


def _parse_file(display: str, real: Path, raw: bytes, *, quiet: bool = False,
                encode: bool = True) -> tuple[_FileResult, list[bytes], dict | None]:
    """Parse one file whose bytes were read as `raw`: its result, what it feeds the
    hasher, and its cache payload (None when it must not be stored). `quiet`: log
    nothing (a forked child; the main process logs when it parses the file again).
    encode=False: the payload is {} when the result may be stored (_encode then runs in
    the writer child, which skips it if the result names its path)."""
    rec = _Recorder()
    res = _parse(display, real, rec)
    # Store only what was parsed from exactly the bytes the key was made of (the file may
    # have changed between our read and load's).
    if rec.parts != [digests.chunk(display, raw)]:
        return res, rec.parts, None
    if not encode:
        return res, rec.parts, {}
    try:
        return res, rec.parts, _encode(res, display)
    except _Unfit:
        if not quiet:
            logs.log.debug(f"intake cache: {display}: its result names its path; not cached")
        return res, rec.parts, None


def _warm(cache: Cache, job: warm.Job) -> None:
    """A forked child's work for one file: parse it and store the entry (warm.py)."""
    display, real, raw, key = job
    try:
        _, _, payload = _parse_file(display, real, raw, quiet=True)
    except Exception:  # the main process parses it again and reports what goes wrong
        return
    if payload is not None:
        cache.write(key, payload)


Deferred = tuple[str, _FileResult, str]  # cache key, result, display path


def _write_deferred(cache: Cache, item: Deferred) -> None:
    """The writer child's work for one file the main process parsed: encode and store."""
    key, res, display = item
    try:
        payload = _encode(res, display)
    except _Unfit:  # names its path: not cached (the main process logs nothing here)
        return
    cache.write(key, payload)


def read_file_cached(display: str, real: Path, cache: Cache | None, hasher, raw: bytes | None = None,
                     defer: list[Deferred] | None = None) -> _FileResult:
    """One file's load + per-document checks + models, from the cache when its bytes'
    entry exists; feeds `hasher` what load.read_file would. `raw`: the bytes, if read.
    `defer`: on a miss, append what to store there instead of storing it (_read_files
    hands those to a writer child)."""
    if raw is None and cache is not None:
        raw = digests.read_bytes(real)
    if raw is None or cache is None:
        return _parse(display, real, hasher)
    key = _key(raw, real)
    entry = cache.get(key)
    if entry is not None:
        try:
            summary = _json_object(entry[0], "summary")
            if summary is not None:
                res = _decode_summary(summary, display, real, raw, entry[1])
            else:
                res = _decode(_json_object(entry[1], "payload"), display, real, raw)
        except _Corrupt as e:
            logs.log.debug(f"intake cache: ignoring {cache.path(key)}: {e}; parsing the file and rewriting the entry")
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError, UnicodeDecodeError) as e:
            logs.log.debug(f"intake cache: ignoring {cache.path(key)}: wrong shape ({type(e).__name__}: {e}); "
                           "parsing the file and rewriting the entry")
        else:
            cache.hits += 1
            hasher.update(digests.chunk(display, raw))
            return res
    cache.misses += 1
    res, parts, payload = _parse_file(display, real, raw, encode=defer is None)
    for part in parts:
        hasher.update(part)
    if payload is not None and defer is not None:
        defer.append((key, res, display))
        cache.used.append(cache.path(key))  # kept by touch_and_prune, counted as written
        cache.written += 1
    elif payload is not None:
        cache.put(key, payload)
    return res


def read_inventory_cached(root: str | Path, cache_dir: Path | str | None, *, strict: bool = False,
                          workers: int | None = None, meanwhile: Callable[[], None] | None = None) -> InventoryResult:
    """What inventory.read_inventory returns (same problems, same model), with per-file
    results from the cache in `cache_dir` (None: no cache, the same code path).
    `workers`: processes for the files missing from the cache (None: one per core, when
    there are enough of them; see warm.py). `meanwhile`: other work for the main process
    (engine: the node config), run once the children parse, before it reads files itself;
    always run, exactly once, children or not (its exceptions propagate)."""
    if is_stdin(root):  # read once, nothing to key a cache on
        if meanwhile is not None:
            meanwhile()
        return read_inventory(root, strict=strict)
    with progress.step(f"reading manifests from {root}"), no_cyclic_gc():
        return _read_inventory_cached(root, cache_dir, strict=strict, workers=workers, meanwhile=meanwhile)


def _read_files(paths: list[tuple[str, Path]], cache: Cache | None, workers: int | None,
                writers: list[int], meanwhile: Callable[[], None] | None = None) -> list[tuple[_FileResult, list[bytes], str | None]]:
    """(result, what it feeds the hasher, its cache key or None) per file, in `paths` order. Files missing from
    the cache are shared with forked children (warm.py) when that pays: each process
    takes the next one from a warm.Pull. The entries of the files the main process
    parsed are then written by one more child (its pid goes to `writers`, for the caller
    to wait for). `meanwhile`: run by the main process once the children are started."""
    raws: list[bytes | None] = [None] * len(paths)
    keys: list[str | None] = [None] * len(paths)
    jobs: list[warm.Job] = []
    where: list[int] = []  # job number -> path index
    pids: list[int] = []
    pull = None
    if cache is not None:
        for i, (display, real) in enumerate(paths):
            raw = raws[i] = digests.read_bytes(real)
            if raw is not None:
                key = keys[i] = _key(raw, real)
                if not cache.path(key).exists():
                    jobs.append((display, real, raw, key))
                    where.append(i)
        n = warm.children(jobs, workers) if jobs and cache.writable() else 0
        if n:
            try:
                pull = warm.Pull([len(job[2]) for job in jobs])
            except OSError as e:
                logs.log.debug(f"intake: reading {len(jobs)} files in one process ({e})")
        if pull is not None:
            pids = warm.start([lambda: _warm_pulled(cache, jobs, pull)] * n)
            if not pids:
                pull.close()
                pull = None
    out: list = [None] * len(paths)
    # Forking was safe for the children (warm.children checked), so it is for the writer
    # unless `meanwhile` started a thread (checked again below).
    deferred: list[Deferred] | None = [] if pids else None
    try:
        if meanwhile is not None:
            meanwhile()
        if pull is not None:
            while (k := pull.take()) is not None:  # the main process takes files too
                i = where[k]
                rec = _Recorder()
                out[i] = (read_file_cached(*paths[i], cache, rec, raws[i], deferred), rec.parts)
        else:
            for i in range(len(paths)):  # no children: every file here, in order
                rec = _Recorder()
                out[i] = (read_file_cached(*paths[i], cache, rec, raws[i]), rec.parts)
        if deferred:
            # Encoding and writing the main process' entries (~10 % of parsing them) runs
            # beside what is left here: the children's entries and the cross-document
            # checks. The child inherits the results as they are in memory: no copy.
            if warm.fork_is_safe():
                writers += warm.start([lambda: [_write_deferred(cache, item) for item in deferred]])
            if not writers:  # no fork: write them here
                for item in deferred:
                    _write_deferred(cache, item)
    finally:
        if pull is not None:
            pull.close()
        warm.wait(pids)
    for i in range(len(paths)):  # then the rest: cache hits (the children's), or misses parsed here
        if out[i] is None:
            rec = _Recorder()
            out[i] = (read_file_cached(*paths[i], cache, rec, raws[i]), rec.parts)
    # a file's key names its result only when that was parsed from exactly the bytes the
    # key was made of (the file may have changed between our read and load's)
    return [(res, parts, key if key is not None and parts == [digests.chunk(paths[i][0], raws[i])] else None)
            for i, ((res, parts), key) in enumerate(zip(out, keys))]


def _warm_pulled(cache: Cache, jobs: list[warm.Job], pull: warm.Pull) -> None:
    """A forked child: parse and store the files it takes until none are left."""
    while (k := pull.take()) is not None:
        _warm(cache, jobs[k])


def _read_inventory_cached(root: str | Path, cache_dir: Path | str | None, *, strict: bool,
                           workers: int | None = None, meanwhile: Callable[[], None] | None = None) -> InventoryResult:
    cache = Cache(cache_dir) if cache_dir is not None else None
    resolved, paths, problems = digests.walk(root)
    writers: list[int] = []
    try:
        result = _assemble(resolved, len(paths), problems, _read_files(paths, cache, workers, writers, meanwhile),
                           strict=strict)
    finally:
        warm.wait(writers)  # the writer's entries exist when the read returns
    if cache is not None:
        cache.touch_and_prune(len(paths))
        logs.log.debug(f"intake cache {cache.dir}: {cache.hits} hit(s), {cache.misses} miss(es), "
                       f"{cache.written} written")
    return result


def _assemble(resolved, files: int, problems: list[Problem], results, *, strict: bool) -> InventoryResult:
    """The per-file results in path order → the tree's digest, checks and inventory.
    When a cross-document check needs more of a summarized document than its cross view
    (it reports a problem about it, with a position), the summarized files' whole
    results are decoded and the tree checked again: the same problems as a cold read."""
    try:
        return _assemble_once(resolved, files, list(problems), results, strict=strict)
    except _NeedFull:
        logs.log.debug("intake cache: a cross-document problem involves unchanged files; decoding their documents")
        whole = [(res.full() if res.full is not None else res, parts, key) for res, parts, key in results]
        return _assemble_once(resolved, files, problems, whole, strict=strict)


def _assemble_once(resolved, files: int, problems: list[Problem], results, *, strict: bool) -> InventoryResult:
    hasher = hashlib.sha256()
    docs: list[Document] = []
    checks: list[DocumentCheck] = []
    models: dict[int, list] = {}
    origins: dict[int, tuple] = {}  # model.Inventory.origins
    for res, parts, key in results:
        for part in parts:
            hasher.update(part)
        problems.extend(res.problems)
        docs.extend(res.docs)
        checks.extend(res.checks)
        for i, (doc, m) in enumerate(zip(res.docs, res.models)):
            if m is not None:
                models[id(doc)] = m
                if key is not None:
                    for j, obj in enumerate(m):
                        origins[id(obj)] = (obj, key, i, j)  # the file's key shared, not copied
    digest = hasher.hexdigest()
    revision = digests.revision_of(resolved, digest)
    checked = check_tree(problems, docs, checks, strict=strict)
    inventory = build_inventory(checked.objects, revision, make=lambda o: models[id(o.doc)])
    if origins:
        inventory = replace(inventory, origins=origins)
    return InventoryResult(inventory, checked.problems, checked.documents, files, digest)
