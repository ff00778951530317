"""`--node NAME` and `--labels k=v,...` of the offline commands (render, validate): who the
node is to a fleet repository, overriding the node config's nodeName and nodeLabels
(labels replace nodeLabels wholly). Both are checked with the node config schema's own
patterns, so a name or label the config would refuse is refused here too.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Callable


def _schema() -> dict:
    from reconciler.intake.schema_files import schema_dir

    return json.loads((schema_dir() / "nodeconfig.json").read_text())["properties"]


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2` -> sorted pairs, each key and value checked as nodeLabels' are; a
    ValueError says which one is wrong and what a label looks like."""
    spec = _schema()["nodeLabels"]
    keys, values = spec["propertyNames"], spec["additionalProperties"]
    out: dict[str, str] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--labels: {item!r} is not KEY=VALUE; write --labels site=lyon,ring=canary")
        if len(key) > keys["maxLength"] or not re.match(keys["pattern"], key):
            raise ValueError(f"--labels: {key!r} is not a label key: {keys['description']}")
        if len(value) > values["maxLength"] or not re.match(values["pattern"], value):
            raise ValueError(f"--labels: the value {value!r} of {key} is not a label value: {values['description']}")
        if key in out:
            raise ValueError(f"--labels: {key} is given twice")
        out[key] = value
    return tuple(sorted(out.items()))


def check_node_name(name: str) -> str:
    spec = _schema()["nodeName"]
    if len(name) > spec["maxLength"] or not re.match(spec["pattern"], name):
        raise ValueError(f"--node: {name!r} is not a node name: {spec['description']}")
    return name


def identity_override(node: str | None, labels: str | None) -> Callable | None:
    """--node and --labels, checked now (ValueError), as a function from the node config
    (model.NodeConfig) to the node config they make; None when neither is given."""
    if node is None and labels is None:
        return None
    changes = {}
    if node is not None:
        changes["node_name"] = check_node_name(node)
    if labels is not None:
        changes["node_labels"] = parse_labels(labels)
    return lambda config: replace(config, **changes)
