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
from typing import Mapping

from reconciler.intake.problems import Problem

FLEET_FILE = "fleet.yaml"
REMOVE_ANNOTATION = "fleet.nftrec.io/remove"
_VARIABLE = re.compile(r"\$\$\{|\$\{([^}]*)\}")


@dataclass(frozen=True)
class Identity:
    """Who a node is to its fleet: the node config's nodeName and nodeLabels (sorted pairs)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True)
class Requirement:
    """One matchExpressions entry: operator In, NotIn, Exists or DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selector:
    """A Kubernetes label selector. Every term must hold (AND); an empty selector matches
    every node, as in Kubernetes (metav1.LabelSelectorAsSelector)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for r in self.expressions:
            has = r.key in labels
            if r.operator == "In" and not (has and labels[r.key] in r.values):
                return False
            if r.operator == "NotIn" and has and labels[r.key] in r.values:
                return False  # NotIn matches a node without the key, as in Kubernetes
            if r.operator == "Exists" and not has:
                return False
            if r.operator == "DoesNotExist" and has:
                return False
        return True


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
    raise NotImplementedError


def node_layers(fleet: Fleet, identity: Identity) -> Projection:
    """The layers `identity` takes, in order: selectors matched against its labels, paths
    substituted and checked (inside the root, no hidden component, no two layers nested or
    equal). Existence is the caller's to check (a listing): a missing non-optional layer is
    an error, a missing optional one is skipped."""
    raise NotImplementedError


def project(display: str, raw: bytes, identity: Identity) -> Projection:
    """parse_fleet then node_layers: what a read path calls with fleet.yaml's bytes."""
    fleet, problems = parse_fleet(display, raw)
    if fleet is None:
        return Projection(None, problems=tuple(problems))
    p = node_layers(fleet, identity)
    return Projection(p.fleet, p.layers, p.env, tuple(problems) + p.problems)
