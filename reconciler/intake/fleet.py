"""A fleet repository: `fleet.yaml` at the manifest root names ordered layers (directories),
each taken by the nodes its label selector matches; a node's manifests are its layers'
objects merged by (kind, namespace, name), a later layer's object replacing an earlier one
whole. `${nodeName}`, `${labels.KEY}` and `${vars.NAME}` are substituted in layer paths and
in manifests' string scalars (never keys); `$${` escapes; an undefined one is an error.

Pipeline position: load (fleet.yaml) -> **projection** (node_layers, substitute, merge) ->
validate the node's documents -> model. Nothing here touches the disk or git: the read
paths (intake/inventory.py, intake/incremental.py) list and read each layer themselves.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from reconciler.intake.problems import Problem, safe_name, show
from reconciler.intake.selectors import Identity, Requirement, Selector, selector_of  # noqa: F401 (fleet's names)

FLEET_FILE = "fleet.yaml"
REMOVE_ANNOTATION = "fleet.nftrec.io/remove"
_VARIABLE = re.compile(r"\$\$\{|\$\{([^}]*)\}")


@dataclass(frozen=True)
class Layer:
    """One `layers` entry of fleet.yaml, as written (its path may hold variables)."""

    path: str
    selector: Selector | None = None  # None: every node
    optional: bool = False  # a missing directory is skipped rather than an error
    line: int = 0  # where in fleet.yaml, for messages


@dataclass(frozen=True)
class Fleet:
    """fleet.yaml, checked against schemas/fleet.json."""

    file: str  # display path of fleet.yaml
    layers: tuple[Layer, ...]
    variables: tuple[tuple[str, str], ...] = ()  # `variables`, sorted pairs
    rollout: Rollout | None = None  # `rollout` (intake/rollout.py); None: every node takes a revision at once


@dataclass(frozen=True)
class Env:
    """What `${...}` resolves to for one node."""

    node: str
    labels: tuple[tuple[str, str], ...]
    variables: tuple[tuple[str, str], ...]

    def lookup(self, name: str) -> tuple[str, str] | None:
        """(value, what it is for messages) of `nodeName`, `labels.KEY` or `vars.NAME`;
        None when undefined."""
        if name == "nodeName":
            return self.node, "the node's name"
        scope, _, key = name.partition(".")
        table = {"labels": self.labels, "vars": self.variables}.get(scope)
        if not key or table is None:
            return None
        value = dict(table).get(key)
        if value is None:
            return None
        return value, (f"the node's label {key}" if scope == "labels" else f"fleet.yaml's variable {key}")

    @property
    def digest(self) -> str:
        """Keys a cache entry of a file whose substitution depends on this environment."""
        text = repr((self.node, self.labels, self.variables)).encode()
        return hashlib.sha256(text).hexdigest()


@dataclass(frozen=True)
class Substituted:
    """One `${...}` replaced in a string: for a schema error on that field to name it."""

    variable: str  # as written: labels.site
    value: str
    what: str  # Env.lookup's description


class Undefined(Exception):
    """`${name}` has no value for this node."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def env_for(fleet: Fleet, identity: Identity) -> Env:
    return Env(identity.name, identity.labels, fleet.variables)


def substitute_text(text: str, env: Env) -> tuple[str, tuple[Substituted, ...]]:
    """`text` with every `${name}` replaced and `$${` turned into `${`; Undefined on the
    first name with no value (an empty `${}` included)."""
    if "${" not in text:
        return text, ()
    used: list[Substituted] = []

    def one(m: re.Match) -> str:
        if m.group(0) == "$${":
            return "${"
        name = m.group(1)
        found = env.lookup(name)
        if found is None:
            raise Undefined(name)
        used.append(Substituted(name, found[0], found[1]))
        return found[0]

    return _VARIABLE.sub(one, text), tuple(used)


@dataclass(frozen=True)
class ResolvedLayer:
    """One layer a node takes: its index in fleet.yaml and its directory, relative to the
    fleet root, normalized (no `.`, `..`, leading `/` or hidden component)."""

    index: int
    rel: str
    optional: bool
    line: int = 0


@dataclass(frozen=True)
class Projection:
    """One node's view of a fleet root: its layers in order and its variables, or the
    problems that make the revision invalid for it (fleet.yaml's own, a selector or path
    that cannot be resolved)."""

    fleet: Fleet | None
    layers: tuple[ResolvedLayer, ...] = ()
    env: Env | None = None
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.fleet is not None and not any(p.is_error for p in self.problems)


def parse_fleet(display: str, raw: bytes) -> tuple[Fleet | None, list[Problem]]:
    """fleet.yaml's bytes -> Fleet, checked against schemas/fleet.json (unknown keys are
    errors, `x-` keys ignored, as the node config's), or None and the problems."""
    from reconciler.intake.load import Document, locate, read_file
    from reconciler.intake.parse import Yaml11Bool
    from reconciler.intake.rollout import check_rollout, parse_rollout
    from reconciler.intake.schema_errors import Obj, Report, schema_problem
    from reconciler.intake.schemas import validator
    from reconciler.intake.sources import Blob

    problems: list[Problem] = []
    docs: list[Document] = []
    read_file(display, Blob(FLEET_FILE, raw), problems, docs)  # type: ignore[arg-type]
    if not problems and len(docs) != 1 or any(d.path for d in docs):
        what = "is empty" if not docs else "is a List" if any(d.path for d in docs) else f"holds {len(docs)} YAML documents"
        problems.append(Problem(display, 0, 0, "", "", "", f"{what}; fleet.yaml is one mapping with apiVersion: "
                                "nftrec/v1alpha1, kind: Fleet and layers"))
    if problems:
        return None, [_fleet_problem(p) for p in problems]
    doc = docs[0]
    rep = Report()
    o = Obj(doc, "Fleet", "", "")
    for err in validator("Fleet").iter_errors(doc.data):
        if err.validator == "type" and isinstance(err.instance, Yaml11Bool) and err.validator_value == "boolean":
            word = "true" if err.instance.boolean else "false"
            rep.add(o, tuple(err.absolute_path), f"{show(str(err.instance))} is a boolean only to YAML 1.1; write {word}")
        else:
            schema_problem(rep, o, err, own=True)
    _check_requirements(rep, o)
    for path, message in check_rollout(doc.data.get("rollout")):
        rep.add(o, path, message)
    if rep.problems:
        return None, sorted((_fleet_problem(p) for p in rep.problems), key=lambda p: (p.line, p.col))
    layers = []
    for i, item in enumerate(doc.data["layers"]):
        line, _ = locate(doc, ("layers", i))
        sel = item.get("selector")
        layers.append(Layer(str(item["path"]), None if sel is None else selector_of(sel), item.get("optional", False), line))
    variables = tuple(sorted((str(k), str(v)) for k, v in (doc.data.get("variables") or {}).items()))
    rollout = doc.data.get("rollout")
    return Fleet(display, tuple(layers), variables, None if rollout is None else parse_rollout(rollout)), []


def _fleet_problem(p: Problem) -> Problem:
    return Problem(p.file, p.line, p.col, "Fleet", "", p.field, p.message, p.severity)


def _check_requirements(rep, o) -> None:
    """In and NotIn need values, Exists and DoesNotExist take none: Kubernetes'
    ValidateLabelSelectorRequirement, which a JSON Schema could say only obscurely. Runs
    beside the schema (so every problem is reported at once): tolerates any shape."""
    layers, rollout = o.doc.data.get("layers"), o.doc.data.get("rollout")
    waves = rollout.get("waves") if isinstance(rollout, dict) else None
    selectors = [(("layers", i), item) for i, item in enumerate(layers if isinstance(layers, list) else ())] + \
        [(("rollout", "waves", i), item) for i, item in enumerate(waves if isinstance(waves, list) else ())]
    for where, item in selectors:
        sel = item.get("selector") if isinstance(item, dict) else None
        exprs = sel.get("matchExpressions") if isinstance(sel, dict) else None
        for j, e in enumerate(exprs if isinstance(exprs, list) else ()):
            if not isinstance(e, dict):
                continue
            path = where + ("selector", "matchExpressions", j)
            op, values = e.get("operator"), e.get("values")
            if op in ("In", "NotIn") and not values:
                rep.add(o, path, f"operator {op} needs at least one value (as in Kubernetes); list them under values, "
                        f"or use {'Exists' if op == 'In' else 'DoesNotExist'} to test the key alone")
            elif op in ("Exists", "DoesNotExist") and values:
                rep.add(o, path + ("values",), f"operator {op} takes no values (as in Kubernetes); remove values, "
                        f"or use {'In' if op == 'Exists' else 'NotIn'} to test them")


def undefined_message(name: str, env: Env, advice: str) -> str:
    """Why `${name}` has no value for env's node, and what to do; `advice` is what to do
    about a missing label (it depends on where the variable is written)."""
    node = safe_name(env.node)
    scope, _, key = name.partition(".")
    if scope == "labels" and key:
        why, do = f"it has no label {show(key)}", advice
    elif scope == "vars" and key:
        why, do = f"fleet.yaml has no variable {show(key)}", "add it under variables in fleet.yaml"
    else:
        why, do = "no such variable", "use ${nodeName}, ${labels.KEY} or ${vars.NAME} (write $${ for a literal ${)"
    return f"${{{show(name)[1:-1]}}} is undefined for node {node} ({why}); {do}"


def node_layers(fleet: Fleet, identity: Identity) -> Projection:
    """The layers `identity` takes, in order: selectors matched against its labels, paths
    substituted and checked (inside the root, no hidden component, no two layers nested or
    equal). Existence is the caller's to check (a listing): a missing non-optional layer is
    an error, a missing optional one is skipped. A value with `/` may add directory levels
    (`sites/${vars.region}` with region `eu/west`) as long as the result is clean; an empty
    value is refused (it would widen the layer to its parent directory)."""
    env = env_for(fleet, identity)
    labels = identity.label_map
    problems: list[Problem] = []
    layers: list[ResolvedLayer] = []
    for i, layer in enumerate(fleet.layers):
        if layer.selector is not None and not layer.selector.matches(labels):
            continue
        where = f"layers[{i}].path"
        try:
            text, used = substitute_text(layer.path, env)
        except Undefined as u:
            key = u.name.partition(".")[2]
            problems.append(Problem(fleet.file, layer.line, 0, "Fleet", "", where, undefined_message(
                u.name, env, "add the label to its node config (nodeLabels), or give the layer a selector that requires "
                f"it (matchExpressions: [{{key: {key}, operator: Exists}}])")))
            continue
        odd = next((u for u in used if not u.value or "//" in f"/{u.value}/"), None)
        if odd is not None:  # `sites/${labels.site}` with site "" would be all of sites/
            problems.append(Problem(fleet.file, layer.line, 0, "Fleet", "", where, (
                f"${{{odd.variable}}} is {show(odd.value)} for node {safe_name(identity.name)} ({odd.what}); a value "
                "in a layer path must name a directory: not empty, no leading, trailing or double '/'")))
            continue
        rel, why = _clean(text)
        if why:
            came = "" if text == layer.path else f" ({show(layer.path)} for node {safe_name(identity.name)})"
            problems.append(Problem(fleet.file, layer.line, 0, "Fleet", "", where, f"{show(text)}{came} {why}"))
            continue
        clash = next((other for other in layers if _nested(other.rel, rel)), None)
        if clash is not None:
            how = "is the same directory as" if clash.rel == rel else "is nested with"
            problems.append(Problem(fleet.file, layer.line, 0, "Fleet", "", where,
                                    f"{show(rel)} {how} layers[{clash.index}] ({show(clash.rel)}, line {clash.line}) for "
                                    f"node {safe_name(identity.name)}; a file may belong to one layer only: move one of "
                                    "the directories beside the other"))
            continue
        layers.append(ResolvedLayer(i, rel, layer.optional, layer.line))
    return Projection(fleet, tuple(layers), env, tuple(problems))


def _clean(path: str) -> tuple[str, str]:
    """(the path normalized, "") or ("", why it is refused). Empty components (`a//b`, a
    trailing `/`) are dropped; an absolute path, `.` and `..`, hidden components and
    control characters are refused: a layer is a visible directory under the root."""
    if path.startswith("/"):
        return "", "is an absolute path; a layer's path is relative to the fleet root (drop the leading /)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return "", "contains a control character; name the directory plainly"
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "", "names no directory; give a directory under the fleet root"
    if any(p == ".." for p in parts):
        return "", "leaves its directory with '..'; a layer is a directory under the fleet root"
    if any(p.startswith(".") for p in parts):
        return "", ("has a component starting with '.', which the manifest walk skips as hidden; "
                    "rename the directory (and write no '.' component)")
    return "/".join(parts), ""


def _nested(a: str, b: str) -> bool:
    return a == b or b.startswith(a + "/") or a.startswith(b + "/")


def project(display: str, raw: bytes, identity: Identity) -> Projection:
    """parse_fleet then node_layers: what a read path calls with fleet.yaml's bytes."""
    fleet, problems = parse_fleet(display, raw)
    if fleet is None:
        return Projection(None, problems=tuple(problems))
    p = node_layers(fleet, identity)
    return Projection(p.fleet, p.layers, p.env, tuple(problems) + p.problems)
