"""One manifest file's text -> plain data with positions: YAML (libyaml through ruamel.yaml's
C loader, else ruamel's pure-Python one) or JSON, read as kubectl reads it.

Hostile input is refused with `Refused` (a message and a position), never a traceback:
NUL and control bytes, non-UTF-8 text, nesting deeper than MAX_DEPTH (checked before
libyaml's recursive composer could overflow the C stack), and alias bombs (the expanded
size is computed without expanding). Only ruamel's loaders are subclassed here:
`check_ruamel` names the internals this relies on.
"""

from __future__ import annotations

import json
import re
import sys
import warnings

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

from reconciler.intake.problems import show

MAX_FILE_BYTES = 8 * 1024 * 1024  # one manifest file; real ones are kilobytes
MAX_DEPTH = 64  # nesting of mappings/sequences; a Service is 6 deep, a Deployment ~12
MAX_ALIAS_EXPANSION = 10_000  # nodes that aliases may add to one file
# libyaml's composer recurses in C; below this bound (a proven upper bound of the
# nesting depth, see _depth_bound) it cannot overflow the stack. Above it the depth is
# measured exactly on the event stream first, which is iterative.
_SAFE_C_DEPTH = 2_000

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
             for k, v in Resolver.yaml_implicit_resolvers.items()}  # what CSafeLoader and _PureKubeLoader use
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

    max_depth = 0  # ruamel's pure composer reads this from YAML(); depth is checked before (_parse_yaml_with)
    yaml_implicit_resolvers = _kube_resolvers()

    if not Resolver.yaml_path_resolvers and None not in yaml_implicit_resolvers:
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

_Loader = _KubeLoader if FAST else _PureKubeLoader  # noqa: F811 - the adjusted resolvers; without libyaml, the loader made to read as go-yaml

# What this module uses of ruamel.yaml beyond its public API (YAML()): the loader classes'
# internals. pyproject.toml bounds ruamel.yaml to the versions tested; check_ruamel()
# refuses a version where any of these is gone instead of parsing differently.
_RUAMEL_INTERNALS = {
    _Loader: ("yaml_implicit_resolvers", "yaml_path_resolvers", "DEFAULT_SCALAR_TAG", "DEFAULT_MAPPING_TAG",
              "DEFAULT_SEQUENCE_TAG", "bool_values", "construct_yaml_int", "construct_yaml_float",
              "construct_scalar", "construct_document", "add_constructor", "check_node", "get_node",
              "check_event", "get_event", "dispose"),
    Scanner: ("check_plain", "scan_directive"),
    ScalarNode: ("ctag", "start_mark"),
}


def check_ruamel() -> None:
    """Raise RuntimeError when the installed ruamel.yaml lacks an internal this parser uses."""
    import ruamel.yaml

    missing = [f"{cls.__name__}.{name}" for cls, names in _RUAMEL_INTERNALS.items() for name in names
               if not hasattr(cls, name) and name not in getattr(cls, "__slots__", ())]
    if missing:
        raise RuntimeError(f"ruamel.yaml {ruamel.yaml.__version__} lacks {', '.join(missing)}, which nftrec's "
                           "manifest parser relies on; install a ruamel.yaml within nftrec's tested bounds")


check_ruamel()


class Refused(Exception):
    """Input that nftrec will not read: the message and where (1-based; 0 for the whole file)."""

    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


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
    # the regex only when one is there: deleting these bytes is much cheaper than the
    # search over the text (UTF-8 encodes these characters, and only them, as these bytes)
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
    SafeConstructor followed by check_shape() would return, built in one pass. Raises
    _Slow (or anything else) for aliases, merge keys, other tags, non-string or duplicate
    keys, or nesting deeper than MAX_DEPTH; the caller then runs those two, which give the
    same data or the same error."""
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


def parse_yaml(text: str) -> list[tuple[object, int, int, list]]:
    """[(data, line, col, item_positions)] per YAML document; item_positions holds
    (line, col) of `items[i]` for `kind: List` documents. On libyaml's refusal of ':'
    inside a flow plain scalar (`addresses: [fd00::1]`), which YAML 1.2, go-yaml and so
    kubectl accept, the file is read again with ruamel's pure-Python parser (the same
    resolvers and constructors); its error, if any, is the one reported."""
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


def parse_json(text: str) -> list[tuple[object, int, int, list]]:
    if not text.strip():
        return []  # an empty file holds no object, as an empty YAML file
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs)
    except Refused as r:  # a duplicate key: JSON is YAML, whose parser knows the position
        try:
            parse_yaml(text)
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


