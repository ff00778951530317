"""The intake cache: per manifest file, its documents parsed, checked and modelled, kept
in the state directory (intake/store.py's format) so that one-shot runs re-use them across
runs and across git-sync's worktree paths. The key is the file's bytes and parser, never
its path or stat; entries are path-free (the display path of the read is re-attached, and a
result that names its path in a message is not stored).
"""

# An entry's body is two lines: a summary, then the payload (load's problems; per document
# its data, position, checks and model objects). The summary, null unless the file is clean
# (no problem, every document valid, no probe annotation), holds per document its identity,
# position, model objects and `validate.cross_view` (all the checks across documents read);
# the payload is null when there is a summary. A warm read of a clean file builds its
# documents with the cross view as their data: positions come from the file's text
# (load.locate), so every problem is a cold read's.

from __future__ import annotations

import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from multiprocessing import current_process, get_context
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler import logs
from reconciler.intake import model
from reconciler.intake.build import model_objects
from reconciler.intake.load import Document, SourceFile, chunk, read_bytes, read_file
from reconciler.intake.problems import Problem
from reconciler.intake.schema_errors import Obj
from reconciler.intake.store import Cache, Corrupt, decode, entry_key
from reconciler.intake.validate import DocumentCheck, check_document, cross_view

if TYPE_CHECKING:
    from reconciler.intake.fleet import Env

MAX_ENTRIES = 4096  # entries kept at least (the cap is 3 x the files of the tree read, if more)
MIN_PARALLEL = 8  # cache misses below which a cold read stays in one process

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
# dataclass __init__ (one object.__setattr__ per field): a warm read decodes every model
# object of the tree, the largest share of its time. It is the __init__'s result exactly when the class has no __post_init__ and `source`, if any, is its last
# field (then __dict__ has __init__'s key order); otherwise __init__ is called.
_NAMES = {name: tuple(n for n, _, _ in kinds) for name, kinds in _KINDS.items()}
_DIRECT = {name for name, c in _MODEL_TYPES.items() if not hasattr(c, "__post_init__")
           and not hasattr(c, "__slots__") and (name not in _SOURCED or fields(c)[-1].name == "source")}
_SOURCE_DIRECT = not hasattr(model.Source, "__post_init__") and not hasattr(model.Source, "__slots__") \
    and [f.name for f in fields(model.Source)] == ["file", "line", "col"]
_new = object.__new__

class _Unfit(Exception):
    """This file's result cannot be stored path-free."""


@dataclass
class FileResult:
    """One manifest file read: its chunk of the tree digest (load.chunk), load's problems,
    its documents with their per-document checks and model objects (None per document
    not valid on its own), and its cache key when the result is that of the key's bytes."""

    chunk: bytes
    problems: list[Problem]
    docs: list[Document]
    checks: list[DocumentCheck]
    models: list[list | None]
    key: str | None = None


def open_cache(directory: Path | str) -> Cache:
    return Cache(directory, "intake cache", MAX_ENTRIES)


# --- encoding: path-free -------------------------------------------------------------------


def _problem_out(p: Problem, display: str) -> list:
    if p.file != display or (display and any(display in s for s in (p.message, p.obj, p.field))):
        raise _Unfit
    return [p.line, p.col, p.kind, p.obj, p.field, p.message, p.severity, p.code]


def _problem_in(v: list, display: str) -> Problem:
    line, col, kind, obj, fld, message, severity, code = v
    if not (type(line) is int and type(col) is int and all(type(s) is str for s in (kind, obj, fld, message, severity, code))):
        raise Corrupt("a problem has the wrong shape")
    return Problem(display, line, col, kind, obj, fld, message, severity, code)


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


def _source(display: str, line, col, at: model.Source | None = None) -> model.Source:
    if at is not None and at.line == line and at.col == col:
        return at
    if not _SOURCE_DIRECT:
        return model.Source(display, line, col)
    src = _new(model.Source)
    src.__dict__.update(file=display, line=line, col=col)
    return src


# per model type: the positions of its fields (after `source`'s line and col) that hold
# a tuple of scalars, a tuple of model objects, one model object; the rest pass as they are
_CONVERT = {name: tuple(tuple(i for i, h in enumerate(hows) if h == how) for how in (1, 2, 3))
            for name, hows in _HOWS.items()}


def _model_in(v: list, display: str, at: model.Source | None = None):
    """A model object from _model_out's list; `at`: its document's Source, shared when the
    object's position is the document's (it is for every top-level object)."""
    name = v[0]
    cls = _MODEL_TYPES.get(name) if type(name) is str else None
    if cls is None:
        raise Corrupt(f"unknown model type {name!r}")
    sourced = name in _SOURCED
    args = v[3:] if sourced else v[1:]  # a copy: converted in place below
    if len(args) != len(_HOWS[name]):
        raise Corrupt(f"a {name} has {len(args)} fields, not {len(_HOWS[name])}")
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
        return cls(*args, source=_source(display, v[1], v[2], at)) if sourced else cls(*args)
    obj = _new(cls)
    d = obj.__dict__
    d.update(zip(_NAMES[name], args))
    if sourced:
        d["source"] = _source(display, v[1], v[2], at)
    return obj


def _summary(res: FileResult, display: str) -> list | None:
    """Per document [kind, namespace, name, cross view, model objects, line, col, index,
    path] when the file is clean (see the module doc), else None. (A fleet's removal stub
    has no object: its file is never clean; fleetmerge.merge identifies the others by
    their object, which the summary keeps.)"""
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
        out.append([o.kind, o.namespace, o.name, view, [_model_out(m, display) for m in models],
                    doc.source.line, doc.source.col, doc.index, list(doc.path)])
    return out


def _encode(res: FileResult, display: str) -> list:
    """The entry's body: [summary, payload]; the payload is null when there is a summary."""
    summary = _summary(res, display)
    if summary is not None:
        return [summary, None]
    docs = []
    for doc, chk, models in zip(res.docs, res.checks, res.models):
        o = chk.obj
        docs.append({
            "data": doc.data, "line": doc.source.line, "col": doc.source.col, "index": doc.index,
            "path": list(doc.path),
            "obj": None if o is None else [o.kind, o.namespace, o.name, o.valid],
            "problems": [_problem_out(p, display) for p in chk.problems],
            "unknown": chk.unknown_kind,
            "models": None if models is None else [_model_out(m, display) for m in models],
        })
    return [None, {"problems": [_problem_out(p, display) for p in res.problems], "docs": docs}]


def _document(data, display: str, line, col, index, path, src: SourceFile) -> Document:
    if not (type(data) is dict and type(line) is int and type(col) is int and type(index) is int
            and type(path) is list):
        raise Corrupt("a document has the wrong shape")
    return Document(data, _source(display, line, col), display, index, tuple(path), src)


def _decode(body: list[bytes], display: str, real: Path, raw: bytes) -> FileResult:
    if len(body) != 2:
        raise Corrupt("wrong number of lines")
    src = SourceFile(display, str(real), raw.decode("utf-8-sig"))
    summary = decode(body[0], list)
    docs, checks, models = [], [], []
    if summary is not None:
        for kind, ns, name, view, ms, line, col, index, path in summary:
            if not (type(kind) is str and type(ns) is str and type(name) is str and type(ms) is list):
                raise Corrupt("a summarized document has the wrong shape")
            doc = _document(view, display, line, col, index, path, src)
            docs.append(doc)
            checks.append(DocumentCheck(Obj(doc, kind, ns, name, True), (), None))
            models.append([_model_in(x, display, doc.source) for x in ms])
        return FileResult(chunk(display, raw), [], docs, checks, models)
    payload = decode(body[1], dict)
    if payload is None:
        raise Corrupt("neither a summary nor a payload")
    problems = [_problem_in(p, display) for p in payload["problems"]]
    for d in payload["docs"]:
        doc = _document(d["data"], display, d["line"], d["col"], d["index"], d["path"], src)
        o = d["obj"]
        obj = None
        if o is not None:
            kind, ns, name, valid = o
            obj = Obj(doc, kind, ns, name, bool(valid))
        unknown = d["unknown"]
        if unknown is not None and type(unknown) is not str:
            raise Corrupt("a document has the wrong shape")
        docs.append(doc)
        checks.append(DocumentCheck(obj, tuple(_problem_in(p, display) for p in d["problems"]), unknown))
        m = d["models"]
        models.append(None if m is None else [_model_in(x, display, doc.source) for x in m])
    return FileResult(chunk(display, raw), problems, docs, checks, models)


# --- one file ----------------------------------------------------------------------------------


def parse_file(display: str, real: Path, env: Env | None = None) -> FileResult:
    """One file read, checked and modelled, without the cache. `env`: a fleet node's (each
    document substituted and checked by fleetmerge.check_fleet_document)."""
    problems: list[Problem] = []
    docs: list[Document] = []
    read = read_file(display, real, problems, docs)
    if env is None:
        checks = [check_document(d) for d in docs]
    else:
        from reconciler.intake.fleetmerge import check_fleet_document  # substitutes, then checks

        pairs = [check_fleet_document(d, env) for d in docs]
        docs, checks = [d for d, _ in pairs], [c for _, c in pairs]
    models = [model_objects(c.obj) if c.obj is not None and c.obj.valid else None for c in checks]
    return FileResult(read, problems, docs, checks, models)


def _key(real: Path, raw: bytes, env: Env | None) -> str:
    """The entry of these bytes, read as the file's suffix says, for `env` (a fleet node's)."""
    kind = "json" if real.name.endswith(".json") else "yaml"
    return entry_key(kind if env is None else f"fleet-{kind}-{env.digest}", raw)


def read_cached(display: str, real: Path, cache: Cache, env: Env | None = None) -> FileResult:
    """parse_file's result, from the cache when the entry of the file's bytes (and `env`)
    is there; stored there when it was parsed from exactly those bytes (the file may
    change between this read and load's)."""
    raw = read_bytes(real)
    if raw is None:  # unreadable or too big: load reports it
        return parse_file(display, real, env)
    key = _key(real, raw, env)
    body = cache.get(key)
    if body is not None:
        try:
            res = _decode(body, display, real, raw)
        except Corrupt as e:
            cache.ignore(key, str(e))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError, UnicodeDecodeError) as e:
            cache.ignore(key, f"wrong shape ({type(e).__name__}: {e})")
        else:
            cache.hits += 1
            res.key = key
            return res
    cache.misses += 1
    res = parse_file(display, real, env)
    if res.chunk != chunk(display, raw):
        return res
    res.key = key
    try:
        cache.put(key, _encode(res, display))
    except _Unfit:
        logs.log.debug(f"intake cache: {display}: its result names its path; not cached")
    return res


def read_all(paths: list[tuple[str, Path]], cache: Cache, env: Env | None = None) -> list[FileResult]:
    """read_cached for every file, in order (`env`: a fleet node's). Cache misses are shared with a pool of forked
    workers (one per further core), which store their entries for this process to read;
    a fork starts with the parser and validators loaded, a spawned worker would import
    them first. Only with enough misses, not in a daemonic process (which may not have
    children), and with no thread besides the progress line's: a forked worker must not
    need a lock another thread held. With no POSIX semaphores (no /dev/shm) the pool
    cannot start: one warning, then the serial read."""
    cores = len(os.sched_getaffinity(0))
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.name != "nftrec-progress"]
    forkable = cores > 1 and not others and not current_process().daemon
    missing = [p for p in paths if _missing(p[1], cache, env)] if forkable else []
    if len(missing) < MIN_PARALLEL:
        return [read_cached(*p, cache, env) for p in paths]
    try:
        pool = ProcessPoolExecutor(cores - 1, mp_context=get_context("fork"))
    except OSError as e:  # its queues need POSIX semaphores: no usable /dev/shm (a minimal container)
        logs.log.warning(f"reading the manifests in one process: cannot start worker processes ({e}; "
                         "is /dev/shm a writable tmpfs?)")
        return [read_cached(*p, cache, env) for p in paths]
    theirs = {p for i, p in enumerate(missing) if i % cores}  # this process keeps every cores-th
    with pool:
        stored = pool.map(_fill, theirs, [cache] * len(theirs), *([[env] * len(theirs)] if env is not None else []))
        mine = {p: read_cached(*p, cache, env) for p in paths if p not in theirs}
        try:
            n = sum(stored)
        except BrokenProcessPool:  # a worker died (OOM killer): what it did not store is parsed below
            n = 0
    results = [mine[p] if p in mine else read_cached(*p, cache, env) for p in paths]
    cache.misses += n
    cache.hits -= n  # counted again by the read that found what a worker stored
    return results


def _missing(real: Path, cache: Cache, env: Env | None) -> bool:
    raw = read_bytes(real)
    return raw is not None and not cache.path(_key(real, raw, env)).exists()


def _fill(path: tuple[str, Path], cache: Cache, env: Env | None = None) -> int:
    return int(read_cached(*path, cache, env).key is not None)
