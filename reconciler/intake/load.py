"""Manifest intake (SPEC §2.1): a directory tree -> plain documents with their positions.

Pipeline position: **load** -> validate -> model -> compile -> ...

Speed: files are parsed with libyaml (ruamel.yaml's C parser) into plain dicts and lists;
nothing keeps per-field positions, because only error messages need them. `locate()`
re-parses the one file concerned with ruamel's round-trip loader, which does.

Hostile input (SPEC §8) is refused with a Problem, never a traceback:
- files over MAX_FILE_BYTES, NUL bytes, non-UTF-8 bytes;
- nesting deeper than MAX_DEPTH (checked before libyaml's recursive composer runs,
  which would otherwise overflow the C stack);
- alias bombs: aliases are allowed (people use anchors to share labels), but they may
  add at most MAX_ALIAS_EXPANSION nodes to a file; the expanded size is computed
  without expanding, so a billion-laughs file is refused in microseconds;
- symlinks that leave the (resolved) manifest tree, dangling links and link loops.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
from ruamel.yaml.parser import Parser
from ruamel.yaml.reader import Reader
from ruamel.yaml.resolver import Resolver
from ruamel.yaml.scanner import Scanner, ScannerError
from ruamel.yaml.tag import Tag

try:  # libyaml-based; falls back to the pure-Python loader (slower, same results)
    from ruamel.yaml.cyaml import CSafeLoader as _Loader
    from ruamel.yaml.main import CParser as _CParser

    if _CParser is None:  # pragma: no cover
        raise ImportError
    FAST = True
except ImportError:  # pragma: no cover
    from ruamel.yaml.loader import SafeLoader as _Loader

    FAST = False

from reconciler.intake.model import Source
from reconciler.intake.problems import ERROR, WARNING, Problem, show

MAX_FILE_BYTES = 8 * 1024 * 1024  # one manifest file; real ones are kilobytes
MAX_DEPTH = 64  # nesting of mappings/sequences; a Service is 6 deep, a Deployment ~12
MAX_ALIAS_EXPANSION = 10_000  # nodes that aliases may add to one file
# libyaml's composer recurses in C; below this bound (a proven upper bound of the
# nesting depth, see _depth_bound) it cannot overflow the stack. Above it the depth is
# measured exactly on the event stream first, which is iterative.
_SAFE_C_DEPTH = 2_000
SUFFIXES = (".yaml", ".yml", ".json")

warnings.filterwarnings("ignore", module=r"ruamel\.yaml.*")  # YAML 1.1 float chatter
_RESOLVED: dict[str, Tag] = {}  # plain scalar text -> its resolved tag (see _KubeRules.resolve)
_TAGS: dict[str, Tag] = {}  # tag text -> one shared Tag

# go-yaml v2 (sigs.k8s.io/yaml, kubectl's reader) resolves these plain scalars to
# booleans (YAML 1.1); YAML 1.2 reads them as strings. true/True/TRUE/false/... are
# booleans in both and need nothing special.
YAML11_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON"})
YAML11_FALSE = frozenset({"n", "N", "no", "No", "NO", "off", "Off", "OFF"})
_YAML11_BOOL_TAG = "tag:nftrec.invalid,2026:yaml11-bool"


class Yaml11Bool(str):
    """A plain (unquoted) y/yes/on/n/no/off...: a string, as YAML 1.2 reads it, that
    remembers kubectl would read a boolean. Validation turns it into that boolean where
    the schema wants one (with a warning); in string fields it stays the text. A quoted
    "yes" is a plain str: kubectl reads a string there too."""

    __slots__ = ()

    @property
    def boolean(self) -> bool:
        return str(self) in YAML11_TRUE


def _kube_resolvers() -> dict:
    """ruamel's implicit resolvers, adjusted to read plain scalars as kubectl does or to
    refuse to guess where YAML 1.1 (kubectl) and YAML 1.2 disagree:
    - timestamps (`2024-01-02`, `creationTimestamp: 2024-01-02T03:04:05Z`) stay strings,
      as kubectl keeps them: no date objects in the data;
    - `=` is a plain string (ruamel would resolve it to YAML 1.1's unconstructable !!value);
    - integers written with a leading zero (`010`: octal 8 to kubectl, decimal 10 to YAML
      1.2) stay strings, so a number field refuses them with a clear message."""
    table = {k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")]
             for k, v in _Loader.yaml_implicit_resolvers.items()}
    leading_zero = re.compile(r"^[-+]?0[0-9_]+$")
    for first in "-+0":
        table[first] = [("tag:yaml.org,2002:str", leading_zero)] + table.get(first, [])
    yaml11_bool = re.compile("^(?:" + "|".join(sorted(YAML11_TRUE | YAML11_FALSE)) + ")$")
    for first in "yYnNoO":
        table[first] = [(_YAML11_BOOL_TAG, yaml11_bool)] + table.get(first, [])
    return table


class _KubeRules:
    """How plain scalars resolve, shared by the C loader and the pure-Python one (the
    fallback of parse_yaml), so both give the same data."""

    yaml_implicit_resolvers = _kube_resolvers()

    if not _Loader.yaml_path_resolvers and None not in yaml_implicit_resolvers:
        def resolve(self, kind, value, implicit):
            """ruamel's resolve() (the C composer calls it for every untagged node), with
            one shared Tag per plain scalar text: the result depends on nothing else."""
            if kind is not ScalarNode:
                return self.DEFAULT_MAPPING_TAG if kind is MappingNode else self.DEFAULT_SEQUENCE_TAG
            if not implicit[0]:
                return self.DEFAULT_SCALAR_TAG
            tag = _RESOLVED.get(value)
            if tag is None:
                tag = self.DEFAULT_SCALAR_TAG
                for suffix, regexp in self.yaml_implicit_resolvers.get(value[:1], ()):
                    if regexp.match(value):
                        tag = _TAGS.setdefault(suffix, Tag(suffix=suffix))
                        break
                if len(_RESOLVED) >= 100_000:  # bounded: watch runs for days
                    _RESOLVED.clear()
                _RESOLVED[value] = tag
            return tag


class _KubeLoader(_KubeRules, _Loader):  # type: ignore[misc, valid-type]
    pass


class _PureKubeLoader(_KubeRules, Reader, Scanner, Parser, Composer, SafeConstructor, Resolver):  # type: ignore[misc]
    """ruamel's pure-Python safe loader (as ruamel.yaml.loader.SafeLoader builds it) with
    the resolvers and constructors of _KubeLoader: same data, same positions. Where it
    is more lenient than go-yaml (kubectl's reader) it is made to refuse what go-yaml
    refuses, so a file does not read differently because it took this path."""

    max_depth = 0  # ruamel's composer reads this from YAML(); depth is checked before (_parse_yaml_with)
    processing_version = (1, 2)  # the parser's YAML 1.2 rules; ruamel's plain Resolver says None

    def __init__(self, stream) -> None:
        self.comment_handling = None
        Reader.__init__(self, stream, loader=self)
        Scanner.__init__(self, loader=self)
        Parser.__init__(self, loader=self)
        Composer.__init__(self, loader=self)
        SafeConstructor.__init__(self, loader=self)
        Resolver.__init__(self, loadumper=self)

    def check_plain(self) -> bool:
        # go-yaml and libyaml start no plain scalar with ':' inside [ ] or { }: kubectl
        # refuses `[::1]`, and so does nftrec, whichever parser reads the file
        if self.flow_level and self.reader.peek() == ":":
            return False
        return Scanner.check_plain(self)

    def scan_directive(self):
        # go-yaml and libyaml refuse directives other than %YAML and %TAG; ruamel skips them
        token = Scanner.scan_directive(self)
        if token.name not in ("YAML", "TAG"):
            raise ScannerError("while scanning a directive", token.start_mark, "found unknown directive name", token.start_mark)
        return token


def _construct_yaml11_bool(loader, node) -> Yaml11Bool:
    return Yaml11Bool(loader.construct_scalar(node))


for _cls in (_KubeLoader, _PureKubeLoader):
    _cls.add_constructor(_YAML11_BOOL_TAG, _construct_yaml11_bool)

_Loader = _KubeLoader  # noqa: F811 - every parse below uses the adjusted resolvers


@dataclass
class SourceFile:
    """One file read: its display path, real path and bytes (kept for locate())."""

    display: str
    real: str
    text: str
    _rt_docs: list | None = field(default=None, repr=False)


@dataclass
class Document:
    """One Kubernetes object as plain data, with where it came from."""

    data: dict
    source: Source  # file (display path), line, col of the object
    file: str  # display path
    index: int  # YAML document index in the file (0-based)
    path: tuple = ()  # path of the object inside that YAML document: ("items", 3) in a List
    src: SourceFile | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        k = self.data.get("kind")
        return k if isinstance(k, str) else ""


@dataclass
class LoadResult:
    documents: list[Document]
    problems: list[Problem]
    revision: str  # git commit of the worktree, else "sha256:<digest>"
    digest: str  # sha256 of every file read (sorted relative path + bytes)
    files: int  # manifest files read
    root: str  # the resolved directory actually read


class Refused(Exception):
    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


# --- directory walk --------------------------------------------------------------------


def manifest_files(root: Path, display_root: str, problems: list[Problem]) -> list[tuple[str, Path]]:
    """Manifest files under root as (display path, real path), sorted by display path.

    Symlinks are followed (git-sync publishes revisions as links) but must stay inside
    root; hidden entries are skipped.
    """
    out: list[tuple[str, Path]] = []
    seen_dirs = {root}
    seen_files: set[Path] = set()
    stack: list[tuple[Path, str]] = [(root, display_root)]
    while stack:
        real_dir, shown_dir = stack.pop()
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as e:
            problems.append(_file_problem(shown_dir, f"cannot read this directory ({e.strerror}); check its permissions"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            shown = os.path.join(shown_dir, entry.name)
            real = Path(entry.path)
            if entry.is_symlink():
                try:
                    target = real.resolve(strict=True)
                except (OSError, RuntimeError):
                    problems.append(_file_problem(shown, "this symlink is dangling or loops; fix or remove it"))
                    continue
                if not target.is_relative_to(root):
                    problems.append(_file_problem(
                        shown, f"this symlink points outside the manifest tree (to {show(str(target))}); "
                        "nftrec refuses it: copy the file into the tree or remove the link"))
                    continue
                real = target
            if real.is_dir():
                resolved = real.resolve()
                if resolved in seen_dirs:
                    continue  # a second link to a directory already read
                seen_dirs.add(resolved)
                stack.append((resolved, shown))
            elif entry.name.endswith(SUFFIXES) and not real.is_file():
                problems.append(Problem(shown, 0, 0, "", "", "", "this is not a regular file (a FIFO, socket or device), "
                                        "so it was skipped; remove it from the manifest directory", WARNING))
            elif real.is_file() and entry.name.endswith(SUFFIXES):
                resolved = real.resolve()
                if resolved in seen_files:
                    continue  # the same file through a second link: read it once
                seen_files.add(resolved)
                out.append((shown, real))
    out.sort(key=lambda t: t[0])
    return out


def _file_problem(file: str, message: str, line: int = 0, col: int = 0) -> Problem:
    return Problem(file, line, col, "", "", "", message, ERROR)


# --- hostile-input guards ----------------------------------------------------------------


_CONTROL = bytes([*range(0x01, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])  # decode_text refuses these


def decode_text(raw: bytes) -> str:
    if b"\x00" in raw:
        raise Refused("this file contains NUL bytes, so it is binary, not YAML or JSON; remove it from the manifest directory")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise Refused(f"this file is not valid UTF-8 (byte {e.start}); save it as UTF-8 or remove it", line, 1) from None
    # the search only when one is there: a translate of the bytes is ~8x cheaper than
    # the regex over the text (UTF-8 encodes these characters, and only them, as these bytes)
    bad = re.search(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]", text) if len(raw.translate(None, _CONTROL)) != len(raw) \
        else None
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        col = bad.start() - text.rfind("\n", 0, bad.start())
        raise Refused(f"this file contains the control character {show(bad.group())}; it looks binary, remove it or fix the text", line, col)
    return text


def _depth_bound(text: str) -> int:
    """An upper bound of the nesting depth: flow collections open with '[' or '{'; a
    nested block collection starts at a greater column than its parent at least every
    second level, so block depth <= 2 * (longest line + 1)."""
    longest = max((len(line) for line in text.split("\n")), default=0)
    return text.count("[") + text.count("{") + 2 * (longest + 1)


def _check_depth_events(text: str, loader_class=None) -> None:
    """Exact nesting depth from the event stream (iterative, so safe at any depth)."""
    loader = (loader_class or _Loader)(text)
    depth = 0
    try:
        while loader.check_event():
            ev = loader.get_event()
            name = type(ev).__name__
            if name in ("MappingStartEvent", "SequenceStartEvent"):
                depth += 1
                if depth > MAX_DEPTH:
                    m = ev.start_mark
                    raise Refused(f"nesting is deeper than {MAX_DEPTH} levels; no Kubernetes object needs that, flatten or remove this file", m.line + 1, m.column + 1)
            elif name in ("MappingEndEvent", "SequenceEndEvent"):
                depth -= 1
    finally:
        _dispose(loader)


def _dispose(loader) -> None:
    try:
        loader.dispose()
    except Exception:  # pragma: no cover - cleanup only
        pass
    # ruamel's loader refers to itself (loader.loader, ._parser, ...): without this the
    # loader, with the file's text, would wait for the cyclic GC, which intake pauses
    vars(loader).clear()


def check_shape(data, line: int, col: int) -> None:
    """Depth, key types and alias expansion of one constructed document; removes
    mapping entries whose value is null (Kubernetes reads `field: null` as unset).

    Aliases make shared (not copied) objects, so the expanded size is computed bottom-up
    with a memo per shared object: linear in the unique nodes, however big the expansion.
    """
    unique = 0
    size: dict[int, int] = {}  # id(container) -> expanded node count
    on_path: set[int] = set()
    stack: list[tuple[object, int, bool]] = [(data, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        if done:
            on_path.discard(key)
            children = node.values() if isinstance(node, dict) else node
            size[key] = 1 + sum(size.get(id(c), 1) for c in children)
            continue
        if key in on_path:
            raise Refused("a YAML alias refers to its own ancestor (a recursive structure); remove the alias", line, col)
        if key in size:
            continue  # shared via an alias: counted once, its expanded size is memoised
        if depth > MAX_DEPTH:
            raise Refused(f"nesting is deeper than {MAX_DEPTH} levels; no Kubernetes object needs that", line, col)
        unique += 1
        on_path.add(key)
        stack.append((node, depth, True))
        if isinstance(node, dict):
            unset = []
            for k, v in node.items():
                if not isinstance(k, str):
                    raise Refused(f"the mapping key {show(k)} is not a string; Kubernetes field names are strings (quote it)", line, col)
                if v is None:
                    unset.append(k)
                else:
                    stack.append((v, depth + 1, False))
            for k in unset:  # `field: null` means unset in Kubernetes (Go's nil): drop it
                del node[k]
        else:
            for v in node:
                stack.append((v, depth + 1, False))
        # This container's scalars are written out in the file once each (a scalar alias
        # adds one node); what aliases add is what `expanded` counts beyond `unique`.
        unique += sum(1 for c in (node.values() if isinstance(node, dict) else node) if not isinstance(c, (dict, list)))
    expanded = size.get(id(data), 1)
    if expanded - unique > MAX_ALIAS_EXPANSION:
        raise Refused(
            f"YAML aliases expand this document to {expanded} nodes (limit: {MAX_ALIAS_EXPANSION} added by aliases); "
            "this looks like an alias bomb: write the data out or use fewer aliases", line, col)


# --- parsing ---------------------------------------------------------------------------


class _Slow(Exception):
    """_construct_fast met something it leaves to ruamel's constructor."""


_STR, _MAP, _SEQ = _Loader.DEFAULT_SCALAR_TAG, _Loader.DEFAULT_MAPPING_TAG, _Loader.DEFAULT_SEQUENCE_TAG
_Y = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_Y + "str": "str", _Y + "int": "int", _Y + "bool": "bool", _Y + "null": "null", _Y + "float": "float",
                _YAML11_BOOL_TAG: "yaml11-bool"}
_ASCII_INT = re.compile(r"(?:0|[1-9][0-9]*)\Z")


def _construct_fast(root, loader):
    """The plain data of a composed document, for the common case: what ruamel's
    SafeConstructor followed by check_shape() would return, built in one pass.

    Raises _Slow (or whatever else goes wrong) for anything else, and the caller then
    runs exactly those two, which produce the same data or the same error: a node
    reached twice (aliases), merge keys, tags other than str/int/float/bool/null/map/seq,
    non-string or duplicate keys, or nesting deeper than MAX_DEPTH. (Without aliases
    nothing is added by them, so check_shape's alias-expansion limit cannot trip.)"""
    seen: set[int] = set()
    bools = loader.bool_values

    def scalar(node):
        tag = node.ctag
        kind = "str" if tag is _STR else _SCALAR_TAGS.get(str(tag))
        if kind is None or type(node) is not ScalarNode:
            raise _Slow
        value = node.value
        if kind == "str":
            return value
        if kind == "int":
            return int(value) if _ASCII_INT.match(value) else loader.construct_yaml_int(node)
        if kind == "bool":
            return bools[value.lower()]
        if kind == "null":
            return None
        if kind == "yaml11-bool":
            return Yaml11Bool(value)
        return loader.construct_yaml_float(node)

    def build(node, depth):
        t = type(node)
        if t is ScalarNode:
            return scalar(node)
        if id(node) in seen or depth > MAX_DEPTH:
            raise _Slow
        seen.add(id(node))
        tag = node.ctag
        if t is MappingNode and (tag is _MAP or str(tag) == _Y + "map"):
            out = {}
            unset = False
            for key_node, value_node in node.value:
                if type(key_node) is not ScalarNode:
                    raise _Slow
                key = scalar(key_node)
                if type(key) is not str or key in out:
                    raise _Slow
                key = sys.intern(key)  # the same few keys in every document: one string each (watch keeps them all)
                value = out[key] = build(value_node, depth + 1)
                if value is None:
                    unset = True
            if unset:  # `field: null` means unset (see check_shape)
                out = {k: v for k, v in out.items() if v is not None}
            return out
        if t is SequenceNode and (tag is _SEQ or str(tag) == _Y + "seq"):
            return [build(child, depth + 1) for child in node.value]
        raise _Slow

    try:
        return build(root, 1)
    finally:
        # build's closure refers to build itself (and, through scalar, to the loader): a
        # reference cycle, which only the cyclic GC would free, and intake pauses it
        build = None  # noqa: F841 - clears the closure cell


def _parse_yaml(text: str) -> list[tuple[object, int, int, list]]:
    """[(data, line, col, item_positions)] per YAML document; item_positions holds
    (line, col) of `items[i]` for `kind: List` documents.

    libyaml 0.1.7 (inside ruamel.yaml.clib) refuses some YAML that YAML 1.2, go-yaml and
    so kubectl read, notably ':' inside a flow plain scalar (`addresses: [fd00::1]`). On
    a scanner error the file is read again with ruamel's pure-Python parser, with the same
    resolvers and constructors; what that refuses too is really broken, and its error
    (file:line, the same wording) is the one reported. Normal files stay on the C path."""
    try:
        return _parse_yaml_with(text, _Loader)
    except ScannerError as e:
        if not FAST or not _libyaml_colon_bug(e):
            raise  # every other error reads exactly as before
    return _parse_yaml_with(text, _PureKubeLoader)


def _libyaml_colon_bug(e: ScannerError) -> bool:
    """libyaml 0.1.7's refusal of ':' inside a flow plain scalar, which libyaml 0.2.1,
    go-yaml (PR #305) and ruamel's pure-Python scanner all accept."""
    return str(getattr(e, "problem", "")).startswith("found unexpected ':'") and "plain scalar" in str(getattr(e, "context", ""))


def _parse_yaml_with(text: str, loader_class) -> list[tuple[object, int, int, list]]:
    # the pure-Python composer recurses in Python: measure the depth first, always
    if loader_class is not _Loader or _depth_bound(text) > _SAFE_C_DEPTH:
        _check_depth_events(text, loader_class)
    loader = loader_class(text)
    out = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
            try:
                data = _construct_fast(node, loader)
            except Exception:  # anything unusual: ruamel's constructor and check_shape decide
                data = loader.construct_document(node)
                check_shape(data, line, col)
            items = []
            if isinstance(data, dict) and data.get("kind") == "List" and type(node).__name__ == "MappingNode":
                for k, v in node.value:
                    if k.value == "items" and type(v).__name__ == "SequenceNode":
                        items = [(n.start_mark.line + 1, n.start_mark.column + 1) for n in v.value]
            out.append((data, line, col, items))
    finally:
        _dispose(loader)
    return out


def _json_pairs(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise Refused(f"the key {show(k)} appears twice in one object; keep one")
        obj[k] = v
    return obj


def _parse_json(text: str) -> list[tuple[object, int, int, list]]:
    if not text.strip():
        return []  # an empty file holds no object, as an empty YAML file
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs)
    except Refused as r:  # a duplicate key: JSON is YAML, whose parser knows the position
        try:
            _parse_yaml(text)
        except YAMLError as e:
            if type(e).__name__ == "DuplicateKeyError":
                raise yaml_error(e, text) from None
        except (Refused, RecursionError):
            pass
        raise r from None
    except json.JSONDecodeError as e:
        raise Refused(f"this is not valid JSON: {e.msg}; fix the syntax", e.lineno, e.colno) from None
    except RecursionError:
        raise Refused(f"nesting is deeper than {MAX_DEPTH} levels; no Kubernetes object needs that") from None
    check_shape(data, 1, 1)
    return [(data, 1, 1, [])]


def yaml_error(e: YAMLError, text: str | None = None) -> Refused:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
    if text is not None and mark is not None and type(e).__name__ == "ScannerError":
        lines = text.split("\n")
        at = lines[mark.line][mark.column:mark.column + 1] if mark.line < len(lines) else ""
        if at == "\t":
            return Refused("YAML does not allow tabs for indentation; indent with spaces", line, col)
    what = (getattr(e, "problem", None) or str(e)).strip()
    context = getattr(e, "context", None)
    if type(e).__name__ == "DuplicateKeyError":
        key = re.search(r'found duplicate key "(.*?)" with value', str(e), re.S)
        name = show(key.group(1)) if key else "a key"
        return Refused(f"the key {name} appears twice in one mapping; YAML keeps only one of them silently elsewhere, so nftrec refuses it: remove one", line, col)
    if type(e).__name__ == "ConstructorError":
        return Refused(f"{what.splitlines()[0]}; manifests may only hold plain YAML data (no custom tags)", line, col)
    text = f"YAML syntax error: {what}" + (f" ({context})" if context else "")
    return Refused(" ".join(text.split()) + "; fix the syntax", line, col)


def read_file(display: str, real: Path, problems: list[Problem], docs: list[Document], hasher, parse_yaml=None) -> int:
    """`parse_yaml`: replaces _parse_yaml (the same result; watch's per-document reuse, intake/yamldocs.py)."""
    try:
        size = real.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Refused(f"this file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit for one manifest file; split it")
        raw = real.read_bytes()
        if len(raw) > MAX_FILE_BYTES:  # grew while being read
            raise Refused(f"this file is over the {MAX_FILE_BYTES}-byte limit for one manifest file; split it")
    except OSError as e:
        problems.append(_file_problem(display, f"cannot read this file ({e.strerror}); check its permissions"))
        return 0
    except Refused as r:
        problems.append(_file_problem(display, r.message))
        return 0
    hasher.update(display.encode("utf-8", "surrogateescape") + b"\0" + raw + b"\0")
    try:
        text = decode_text(raw)
        if real.name.endswith(".json"):
            parsed = _parse_json(text)
        else:
            try:
                parsed = (parse_yaml or _parse_yaml)(text)
            except YAMLError as e:
                raise yaml_error(e, text) from None
            except RecursionError:
                raise Refused(f"nesting is deeper than {MAX_DEPTH} levels; no Kubernetes object needs that") from None
    except Refused as r:
        problems.append(_file_problem(display, r.message, r.line, r.col))
        return 0
    src = SourceFile(display, str(real), text)
    n = 0
    for index, (data, line, col, items) in enumerate(parsed):
        if data is None:
            continue  # an empty document (`---` at the end, comments only)
        if not isinstance(data, dict):
            what = "a list" if isinstance(data, list) else f"a single value ({show(data)})"
            problems.append(_file_problem(display, f"this document is {what}, not a Kubernetes object (a mapping with apiVersion and kind); "
                                          "for several objects use `---` between documents or `kind: List` with `items`", line, col))
            continue
        if data.get("kind") == "List" and "items" in data:
            entries = data.get("items")
            if not isinstance(entries, list):
                problems.append(_file_problem(display, "`items` of this List must be a list of objects", line, col))
                continue
            for i, item in enumerate(entries or []):
                iline, icol = items[i] if i < len(items) else (line, col)
                if not isinstance(item, dict):
                    problems.append(_file_problem(display, f"items[{i}] of this List is not an object; each item needs apiVersion and kind", iline, icol))
                    continue
                docs.append(Document(item, Source(display, iline, icol), display, index, ("items", i), src))
                n += 1
            continue
        docs.append(Document(data, Source(display, line, col), display, index, (), src))
        n += 1
    return n


# --- revision --------------------------------------------------------------------------

_SHA_RE = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _git_commit(gitdir: Path) -> str | None:
    """HEAD's commit read from the git directory's files (no subprocess)."""
    head = _read(gitdir / "HEAD")
    if head is None:
        return None
    common = gitdir
    commondir = _read(gitdir / "commondir")  # linked worktrees share refs with the main repo
    if commondir:
        common = (gitdir / commondir).resolve()
    for _ in range(5):  # follow symbolic refs a few levels
        if _SHA_RE.fullmatch(head):
            return head
        if not head.startswith("ref:"):
            return None
        ref = head[4:].strip()
        value = _read(gitdir / ref) or _read(common / ref)
        if value is None:
            packed = _read(common / "packed-refs") or ""
            value = next((ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + ref)), None)
        if value is None:
            return None
        head = value
    return None


def _gitdir_of(dot_git: Path) -> Path | None:
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git)  # a linked worktree (git-sync's): "gitdir: /repo/.git/worktrees/x"
    if text and text.startswith("gitdir:"):
        return (dot_git.parent / text[7:].strip()).resolve()
    return None


def find_revision(root: Path) -> str | None:
    """The git commit the resolved root is a checkout of, or None.

    Order: a `.git` at the root itself (git-sync worktree); a root named after a commit
    (`rev-<sha>` or `<sha>`, git-sync's worktree names); a `.git` in an ancestor."""
    if (root / ".git").exists():
        gd = _gitdir_of(root / ".git")
        commit = _git_commit(gd) if gd else None
        if commit:
            return commit
    m = re.fullmatch(r"(?:rev-)?([0-9a-f]{40}(?:[0-9a-f]{24})?)", root.name)
    if m:
        return m.group(1)
    for parent in root.parents:
        if (parent / ".git").exists():
            gd = _gitdir_of(parent / ".git")
            return _git_commit(gd) if gd else None
    return None


# --- public API --------------------------------------------------------------------------


def load_manifests(root: str | Path) -> LoadResult:
    """Read every manifest under root. Never raises for bad input: see `problems`."""
    display_root = str(root)
    problems: list[Problem] = []
    hasher = hashlib.sha256()
    try:
        resolved = Path(root).resolve(strict=True)  # one git-sync revision, read whole
    except (OSError, RuntimeError):
        problems.append(_file_problem(display_root, "this manifest directory does not exist (or is a dangling link); check the path"))
        return LoadResult([], problems, "", hasher.hexdigest(), 0, display_root)
    docs: list[Document] = []
    files = 0
    if resolved.is_file():  # a single file is accepted too
        paths = [(display_root, resolved)]
    elif resolved.is_dir():
        paths = manifest_files(resolved, display_root, problems)
    else:
        problems.append(_file_problem(display_root, "this is neither a directory nor a file; point nftrec at the manifest directory"))
        paths = []
    for display, real in paths:
        read_file(display, real, problems, docs, hasher)
        files += 1
    digest = hasher.hexdigest()
    base = resolved if resolved.is_dir() else resolved.parent
    revision = find_revision(base) or f"sha256:{digest}"
    return LoadResult(docs, problems, revision, digest, files, str(resolved))


def _rt_docs(src: SourceFile) -> list:
    if src._rt_docs is None:
        try:
            yaml = YAML(typ="rt")
            yaml.allow_duplicate_keys = True  # only positions are wanted here
            src._rt_docs = list(yaml.load_all(src.text))
        except Exception:  # positions are best effort; the document's own line remains
            src._rt_docs = []
    return src._rt_docs


def locate(doc: Document, path: tuple | list, *, key: bool = False) -> tuple[int, int]:
    """1-based (line, col) of a field path inside a document (the deepest part of the
    path that exists). key=True gives the key's position rather than the value's."""
    best = (doc.source.line, doc.source.col)
    if doc.src is None:
        return best
    docs = _rt_docs(doc.src)
    if doc.index >= len(docs):
        return best
    node = docs[doc.index]
    full = list(doc.path) + list(path)
    n_own = len(doc.path)
    for i, part in enumerate(full):
        lc = getattr(node, "lc", None)
        if lc is None:
            break
        last = i == len(full) - 1
        try:
            if isinstance(node, dict) and part in node:
                child = node[part]
                kl, kc = lc.key(part)
                if isinstance(child, (dict, list)) or key and last:
                    pos = (kl, kc)
                else:
                    pos = lc.value(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                child = node[part]
                pos = lc.item(part)
            else:
                break
        except (KeyError, IndexError, TypeError, AttributeError):
            break
        if i >= n_own - 1 or not path:
            best = (pos[0] + 1, pos[1] + 1)
        node = child
    return best


def plain_data(node):
    """ruamel's round-trip data (CommentedMap/Seq, scalar subclasses) -> plain Python data,
    for small files read with positions (the node config, probe annotations). Keys become
    plain strings."""
    if isinstance(node, dict):
        return {str(k): plain_data(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain_data(v) for v in node]
    if isinstance(node, bool) or type(node).__name__ == "ScalarBoolean":
        return bool(node)
    for t in (int, float, str):
        if isinstance(node, t):
            return t(node)
    return node
