"""The readiness probe annotation of a Service: `probe.nftrec.io/readiness`
holds a Kubernetes Probe in YAML. Parsed and checked against schemas/probe.json like any
other field; every problem points into the annotation (file:line of the annotation,
plus the line inside a `|` block), and becomes a model.Probe with the kubelet's defaults.

No `exec`: manifests come from a repository and may not run commands on the node.
"""

from __future__ import annotations

import io
from functools import lru_cache

from reconciler.intake.load import Document, locate, plain_data
from reconciler.intake.parse import Refused, check_shape
from reconciler.intake.model import Probe
from reconciler.intake.problems import ERROR, Problem, field_path, show

ANNOTATION = PROBE_ANNOTATION = "probe.nftrec.io/readiness"
MAX_TEXT = 16 * 1024  # a probe is a few lines; Kubernetes caps all annotations at 256 KiB
HANDLERS = ("httpGet", "tcpSocket", "grpc")
DEFAULTS = {"initialDelaySeconds": 0, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
            "failureThreshold": 3}  # the kubelet's
EXEC_MESSAGE = ("an exec probe is not allowed: manifests come from a repository and nftrec does not let them "
                "run commands on the node; use httpGet, tcpSocket or grpc against the endpoint")
_ANN_PATH = ("metadata", "annotations", ANNOTATION)


@lru_cache(maxsize=1)
def _validator():
    import json

    from reconciler.intake.schemas import FORMATS, _Validator, schema_dir

    with open(schema_dir() / "probe.json", encoding="utf-8") as f:
        return _Validator(json.load(f), format_checker=FORMATS)


def annotation_text(data: dict) -> object:
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    return ann.get(ANNOTATION)


def _parse(text: str):
    """(plain data, the "rt" tree for positions); Refused on bad YAML."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from reconciler.intake.parse import yaml_error

    if len(text) > MAX_TEXT:
        raise Refused(f"the probe is {len(text)} characters long; at most {MAX_TEXT} are accepted")
    yaml = YAML(typ="rt")
    yaml.version = (1, 2)
    try:
        tree = yaml.load(io.StringIO(text))
    except YAMLError as e:
        raise yaml_error(e, text) from None
    except RecursionError:
        raise Refused("the probe is nested too deeply") from None
    data = plain_data(tree)
    check_shape(data, 1, 1)
    return data, tree


def _inner_position(tree, path: tuple) -> tuple[int, int]:
    """0-based (line, col) of `path` inside the parsed annotation text (best effort)."""
    best = (0, 0)
    node = tree
    for part in path:
        lc = getattr(node, "lc", None)
        if lc is None:
            break
        try:
            if isinstance(node, dict) and part in node:
                child = node[part]
                best = lc.key(part) if isinstance(child, (dict, list)) else lc.value(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                child = node[part]
                best = lc.item(part)
            else:
                break
        except (KeyError, IndexError, TypeError, AttributeError):
            break
        node = child
    return best


class _Where:
    """Maps a position inside the annotation text to file:line:col. A literal block
    (`|`, `|-`, `|+`) keeps its lines: line i of the text is line i+1 after the `|`. Any
    other form (quoted, folded) points at the annotation's value."""

    def __init__(self, doc: Document):
        self.doc = doc
        self.line, self.col = locate(doc, _ANN_PATH)
        self.block = False
        self.indent = self.col
        src = doc.src
        if src is not None and self.line > 0:
            lines = src.text.split("\n")
            if self.line - 1 < len(lines):
                rest = lines[self.line - 1][self.col - 1:] if self.col > 0 else ""
                self.block = rest.startswith("|")
                if self.block and self.line < len(lines):
                    nxt = lines[self.line]
                    self.indent = len(nxt) - len(nxt.lstrip(" ")) + 1

    def at(self, inner: tuple[int, int]) -> tuple[int, int]:
        if self.block:
            return self.line + 1 + inner[0], self.indent + inner[1]
        return self.line, self.col


def check_annotation(doc: Document, kind: str, label: str) -> list[Problem]:
    """The problems of a Service's probe annotation ([] when it has none or it is valid)."""
    text = annotation_text(doc.data)
    if text is None:
        return []
    where = _Where(doc)
    base = field_path(_ANN_PATH)
    out: list[Problem] = []

    def add(inner_path: tuple, message: str, pos: tuple[int, int] | None = None) -> None:
        line, col = where.at(pos if pos is not None else _inner_position(tree, inner_path))
        field = base + ("." + field_path(inner_path) if inner_path else "")
        out.append(Problem(doc.file, line, col, kind, label, field, message, ERROR))

    tree = None
    if not isinstance(text, str):
        return []  # the Service schema already says annotations are strings
    try:
        data, tree = _parse(text)
    except Refused as r:
        inner = (max(r.line - 1, 0), max(r.col - 1, 0))
        line, col = where.at(inner)
        out.append(Problem(doc.file, line, col, kind, label, base, f"the probe is not valid YAML: {r.message}", ERROR))
        return out
    if not isinstance(data, dict):
        add((), f"must be a Kubernetes Probe (a mapping like `httpGet: {{path: /healthz, port: 8080}}`), "
                f"not {show(data)}")
        return out
    if "exec" in data:
        add(("exec",), EXEC_MESSAGE, _key_position(tree, "exec"))
    rest = {k: v for k, v in data.items() if k != "exec"}
    for h in ("httpGet", "tcpSocket"):
        if isinstance(rest.get(h), dict) and "host" in rest[h]:
            add((h, "host"), "host is not supported: nftrec probes every endpoint at its own address; remove it "
                "(to send a Host header, use httpGet.httpHeaders)", _key_position(tree[h], "host"))
            rest[h] = {k: v for k, v in rest[h].items() if k != "host"}
    from reconciler.intake.schema_errors import Obj, schema_problem

    rep = _InnerReport(add)
    for err in _validator().iter_errors(rest):
        schema_problem(rep, Obj(doc, kind, "", ""), err, own=True)
    handlers = [h for h in HANDLERS if h in data]
    if not handlers and "exec" not in data:
        add((), "a probe needs one handler: httpGet, tcpSocket or grpc (e.g. `tcpSocket: {port: 8080}`)")
    elif len(handlers) > 1:
        add((handlers[1],), f"a probe has exactly one handler but this one has {', '.join(handlers)}; keep one")
    return out


def _key_position(tree, key: str) -> tuple[int, int] | None:
    try:
        return tree.lc.key(key)
    except (AttributeError, KeyError, TypeError):
        return None


class _InnerReport:
    """schema_errors.Report's interface, placing each problem inside the annotation."""

    def __init__(self, add):
        self._add = add
        self.problems: list[Problem] = []

    def add(self, _o, path: tuple, message: str, severity: str = ERROR, *, key: bool = False) -> None:
        self._add(tuple(path), message)


def probe_from(data: dict) -> Probe | None:
    """The model.Probe of a valid Service document (None without the annotation)."""
    text = annotation_text(data)
    if not isinstance(text, str):
        return None
    spec, _ = _parse(text)
    t = {**DEFAULTS, **{k: v for k, v in spec.items() if k in DEFAULTS}}
    timing = dict(initial_delay_seconds=t["initialDelaySeconds"], timeout_seconds=t["timeoutSeconds"],
                  period_seconds=t["periodSeconds"], success_threshold=t["successThreshold"],
                  failure_threshold=t["failureThreshold"])
    if "httpGet" in spec:
        h = spec["httpGet"]
        path = h.get("path") or "/"
        return Probe("httpGet", h["port"], path=path if path.startswith("/") else "/" + path,
                     scheme=h.get("scheme") or "HTTP",
                     headers=tuple((x["name"], x["value"]) for x in h.get("httpHeaders") or ()), **timing)
    if "tcpSocket" in spec:
        return Probe("tcpSocket", spec["tcpSocket"]["port"], **timing)
    g = spec["grpc"]
    return Probe("grpc", g["port"], grpc_service=g.get("service") or "", **timing)


def check_ports(services: dict, slice_ports: dict[str, set[tuple[str, str]]]) -> list[Problem]:
    """Across documents: a probe's named port must be a port name of the Service's slices
    (else every probe would fail and take every endpoint out). Services without slices
    have nothing to probe."""
    out: list[Problem] = []
    for key, o in services.items():
        text = annotation_text(o.doc.data)
        if not isinstance(text, str) or key not in slice_ports:
            continue
        try:
            spec, tree = _parse(text)
        except Refused:
            continue  # already reported by check_annotation
        names = {n for n, _ in slice_ports[key] if n}
        for h in ("httpGet", "tcpSocket"):
            port = spec.get(h, {}).get("port") if isinstance(spec, dict) and isinstance(spec.get(h), dict) else None
            if isinstance(port, str) and port not in names:
                line, col = _Where(o.doc).at(_inner_position(tree, (h, "port")))
                out.append(Problem(o.doc.file, line, col, o.kind, o.label, field_path(_ANN_PATH + (h, "port")),
                                   f"the probe's port {show(port)} is not a port name of any EndpointSlice of this "
                                   f"Service (names: {', '.join(sorted(names)) or 'none'}); name a slice port so, or "
                                   f"give the port number", ERROR))
    return out
