"""Who a node is to its fleet and which nodes a label selector takes: the node config's
nodeName and nodeLabels (Identity) and Kubernetes label selectors (Selector), shared by
fleet.yaml's layers and its rollout waves. Kept apart from fleet.py so that the rollout
rule (intake/rollout.py) and the fleet file's parser can both use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


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


def selector_of(sel: dict) -> Selector:
    """A checked selector mapping (schemas/fleet.json) as a Selector."""
    labels = tuple(sorted((str(k), str(v)) for k, v in (sel.get("matchLabels") or {}).items()))
    exprs = tuple(Requirement(str(e["key"]), e["operator"], tuple(str(v) for v in e.get("values") or ()))
                  for e in sel.get("matchExpressions") or ())
    return Selector(labels, exprs)
