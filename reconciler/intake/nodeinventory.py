"""A NodeInventory: the nodes of a fleet (names and labels) that CI reviews a change
against (`validate --fleet`, `diff --fleet`). One YAML document of `kind: NodeInventory`,
checked against schemas/nodeinventory.json (unknown keys are errors, `x-` keys ignored,
as the node config's); node names must be unique. Every problem carries file:line.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.intake.fleet import Identity
from reconciler.intake.load import Document, locate, read_file
from reconciler.intake.problems import Problem, safe_name

KIND = "NodeInventory"


def _problem(file: str, line: int, col: int, fld: str, message: str) -> Problem:
    return Problem(file, line, col, KIND, "", fld, message)


def load_node_inventory(path: str | Path) -> tuple[list[Identity], list[Problem]]:
    """The inventory's nodes, in file order, or [] and the problems (any error makes the
    whole inventory unusable: reviewing a change against part of a fleet would hide nodes)."""
    from reconciler.intake.schema_errors import Obj, Report, schema_problem
    from reconciler.intake.schemas import validator

    shown = str(path)
    problems: list[Problem] = []
    docs: list[Document] = []
    read_file(shown, Path(path), problems, docs)
    if problems:
        return [], [p if p.kind else Problem(p.file, p.line, p.col, KIND, p.obj, p.field, p.message + " (--fleet "
                    "names a NodeInventory file)", p.severity) for p in problems]
    if len(docs) != 1:
        what = "no document" if not docs else f"{len(docs)} documents"
        return [], [_problem(shown, 1, 1, "", f"holds {what}; a NodeInventory is one mapping (apiVersion: "
                             "nftrec/v1alpha1, kind: NodeInventory, nodes: [{name, labels}])")]
    doc = docs[0]
    rep = Report()
    o = Obj(doc, KIND, "", "")
    for err in validator(KIND).iter_errors(doc.data):
        schema_problem(rep, o, err, own=True)
    problems = [Problem(p.file, p.line, p.col, KIND, "", p.field, p.message, p.severity) for p in rep.problems]
    if any(p.is_error for p in problems):
        return [], sorted(problems, key=lambda p: (p.line, p.col))
    nodes: list[Identity] = []
    first: dict[str, int] = {}  # name -> index
    for i, node in enumerate(doc.data.get("nodes") or []):
        name = node["name"]
        if name in first:  # located only now: locate() parses the file again
            line, col = locate(doc, ("nodes", i, "name"))
            was, _ = locate(doc, ("nodes", first[name], "name"))
            problems.append(_problem(shown, line, col, f"nodes[{i}].name", f"node {safe_name(name)} is listed twice "
                                     f"(lines {was} and {line}); keep one"))
            continue
        first[name] = i
        nodes.append(Identity(name, tuple(sorted((node.get("labels") or {}).items()))))
    if any(p.is_error for p in problems):
        return [], problems
    return nodes, problems
