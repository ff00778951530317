"""A fleet node's documents: variables substituted in each document's string scalars,
each checked as validate.check_document checks it (a bad substituted value names where
it came from), removal stubs (`fleet.nftrec.io/remove: "true"`) kept apart, and the
layers merged by (kind, namespace, name), a later layer's object replacing an earlier one.

Pipeline position: load -> **fleet documents** (check_fleet_document, merge) -> check_tree.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.intake.fleet import _VARIABLE, REMOVE_ANNOTATION, Env, Substituted, Undefined, substitute_text, undefined_message
from reconciler.intake.load import Document, locate
from reconciler.intake.problems import ERROR, WARNING, Problem, field_path, safe_name, show
from reconciler.intake.schema_errors import Obj
from reconciler.intake.validate import ACCEPTED, DocumentCheck, check_document


def _annotation(doc: Document) -> object:
    """The remove annotation's value as written, or None when absent."""
    meta = doc.data.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, dict) else None
    return notes.get(REMOVE_ANNOTATION) if isinstance(notes, dict) else None


def is_removal(doc: Document) -> bool:
    """Whether the document is a removal stub: annotation fleet.nftrec.io/remove "true"."""
    return _annotation(doc) == "true"


def _names(doc: Document) -> tuple[object, object, object]:
    """kind, namespace ("default" when unset, as kubectl has it) and name, as written."""
    meta = doc.data.get("metadata") if isinstance(doc.data.get("metadata"), dict) else {}
    return doc.data.get("kind"), meta.get("namespace") or "default", meta.get("name")


def identity(doc: Document) -> tuple[str, str, str] | None:
    """(kind, namespace, name) as validate's Obj has it: namespace "default" when unset,
    "" for the cluster-scoped ServiceCIDR; None without an accepted kind and a name."""
    kind, ns, name = _names(doc)
    if kind not in ACCEPTED or not isinstance(name, str) or not name or not isinstance(ns, str):
        return None
    return str(kind), "" if kind == "ServiceCIDR" else ns, name


def _label(ident: tuple[str, str, str]) -> str:
    return Obj(None, *ident).label  # type: ignore[arg-type]


def _who(doc: Document) -> tuple[str, str]:
    """(kind, object) of a document for a Problem, as far as it can be told."""
    kind, ns, name = _names(doc)
    kind = safe_name(kind) if isinstance(kind, str) and kind else ""
    if not isinstance(name, str) or not name:
        return kind, ""
    return kind, Obj(doc, kind, str(ns), name).label


def _problem(doc: Document, path: tuple, message: str, severity: str = ERROR, *, key: bool = False) -> Problem:
    line, col = locate(doc, path, key=key)
    kind, obj = _who(doc)
    return Problem(doc.file, line, col, kind, obj, field_path(path), message, severity)


def variables_used(doc: Document) -> frozenset[str] | None:
    """The `${name}` names in `doc`'s string scalars; None when no string holds `${` at
    all (an escape `$${` counts as holding one). A document with none is checked alike
    for every node (check_fleet_document with any Env), and one whose names have the same
    values for two nodes alike for both: commands projecting many nodes from one parse
    check it once per distinct value."""
    names: set[str] = set()
    found = False
    stack = [doc.data]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "${" in node:
                found = True
                names.update(m.group(1) for m in _VARIABLE.finditer(node) if m.group(1) is not None)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(names) if found else None


def uses_variables(doc: Document) -> bool:
    """Whether a string scalar of `doc` holds `${` (a variable, or an escape)."""
    return variables_used(doc) is not None


def annotated(doc: Document) -> bool:
    """Whether the document carries the removal annotation with any value (a bad one is
    check_fleet_document's to report): its check depends on the fleet mode."""
    return _annotation(doc) is not None


def substitute_document(doc: Document, env: Env) -> tuple[Document, dict[str, tuple[Substituted, ...]], list[Problem]]:
    """`doc` with `${...}` substituted in every string scalar (never in keys): a new
    Document when anything changed (unchanged containers shared), else `doc` itself; the
    substitutions by field path (problems.field_path's spelling); an error at
    file:line:col (load.locate) for each undefined variable. A string with an undefined
    variable is left as written."""
    if not uses_variables(doc):  # most documents: no path is built for them
        return doc, {}, []
    subs: dict[str, tuple[Substituted, ...]] = {}
    undefined: list[tuple[tuple, str]] = []

    def walk(node, path: tuple):
        if isinstance(node, str):
            if "${" not in node:  # `$${` holds `${` too
                return node
            try:
                text, used = substitute_text(node, env)
            except Undefined as u:
                undefined.append((path, u.name))
                return node
            if used:
                subs[field_path(path)] = used
            return text
        if isinstance(node, dict):
            out = None
            for k, v in node.items():
                new = walk(v, path + (k,))
                if new is not v:
                    if out is None:
                        out = dict(node)
                    out[k] = new
            return node if out is None else out
        if isinstance(node, list):
            items = None
            for i, v in enumerate(node):
                new = walk(v, path + (i,))
                if new is not v:
                    if items is None:
                        items = list(node)
                    items[i] = new
            return node if items is None else items
        return node

    data = walk(doc.data, ())
    new = doc if data is doc.data else replace(doc, data=data)
    advice = "add the label to its node config (nodeLabels), or move this object to a layer whose selector requires it"
    return new, subs, [_problem(new, path, undefined_message(name, env, advice)) for path, name in undefined]


def name_substitutions(problems: list[Problem], subs: dict[str, tuple[Substituted, ...]]) -> list[Problem]:
    """Each problem about a substituted field says where the value came from: `... (the
    value comes from ${labels.site} = 'x y', the node's label site)`."""
    if not subs:
        return list(problems)
    out = []
    for p in problems:
        used = subs.get(p.field)
        if used:
            came = "; ".join(f"${{{u.variable}}} = {show(u.value)}, {u.what}" for u in used)
            p = replace(p, message=f"{p.message} (the value comes from {came})")
        out.append(p)
    return out


def check_fleet_document(doc: Document, env: Env) -> tuple[Document, DocumentCheck]:
    """What a read path runs per document of a fleet root instead of check_document:
    a removal stub is checked (an accepted kind and a metadata.name) and never validated
    as an object; any other document is substituted, checked and its problems named.
    The Document returned is the substituted one: merge and check_tree take it."""
    new, subs, problems = substitute_document(doc, env)
    note = _annotation(new)
    path = ("metadata", "annotations", REMOVE_ANNOTATION)
    if is_removal(new):
        if identity(new) is None:
            problems.append(_problem(new, ("metadata", "name") if new.data.get("kind") in ACCEPTED else ("kind",),
                                     f"a removal stub ({REMOVE_ANNOTATION}: \"true\") needs the kind ({', '.join(ACCEPTED)}), "
                                     "metadata.name and, unless it is default, metadata.namespace of the object it removes"))
        return new, DocumentCheck(None, tuple(name_substitutions(problems, subs)), None)
    if note is not None and note != "false":
        quote = ", quoted (plain true or yes is a boolean to YAML)" if type(note) is not str else ""
        problems.append(_problem(new, path, f"{show(note)} is not allowed; write \"true\" to remove the object an "
                                 f"earlier layer defines{quote}, or leave the annotation out"))
        return new, DocumentCheck(None, tuple(name_substitutions(problems, subs)), None)
    check = check_document(new)
    undefined = {p.field for p in problems}
    own = [p for p in check.problems if p.field not in undefined]  # an undefined one is reported, not its text
    return new, DocumentCheck(check.obj, tuple(problems + name_substitutions(own, subs)), check.unknown_kind)


def merge(documents: list[Document], checks: list[DocumentCheck], layers: list[int]
          ) -> tuple[list[Document], list[DocumentCheck], list[Problem]]:
    """The node's effective documents, in order: `layers[i]` is the layer index of
    documents[i]. A later layer's object (kind, namespace, name) replaces an earlier one
    whole; a removal stub drops the earlier one (a warning when it drops nothing). Two of
    one identity in one layer are both kept, for check_tree's duplicate error. The
    problems returned are those of every document left out (a replaced object's errors
    still count, as do a stub's) and the merge's own: pass them to check_tree."""
    kept: dict[tuple, list[int]] = {}  # identity -> indexes of the documents that hold it now
    removed_in: dict[tuple, tuple[int, int]] = {}  # identity -> (layer, index of the stub) that removed it last
    out: list[bool] = [False] * len(documents)
    problems: list[Problem] = []
    for i, (doc, check, layer) in enumerate(zip(documents, checks, layers)):
        stub = check.obj is None and is_removal(doc)
        ident = identity(doc) if stub else (check.obj.kind, check.obj.namespace, check.obj.name) \
            if check.obj is not None and check.obj.name else None
        if ident is None:
            out[i] = not stub
            if stub:
                problems.extend(check.problems)
            continue
        earlier = [j for j in kept.get(ident, ()) if layers[j] < layer]
        same = [j for j in kept.get(ident, ()) if layers[j] == layer]
        for j in earlier:
            out[j] = False
            problems.extend(checks[j].problems)
            first = next(k for k in earlier if layers[k] == layers[j])
            if first != j:  # check_tree would have said so, had it seen both
                problems.append(_problem(documents[j], ("metadata", "name"), f"{ident[0]} {_label(ident)} is defined "
                                         f"twice; the first is at {documents[first].file}:{documents[first].source.line}; "
                                         "keep one"))
        kept[ident] = same
        if stub:
            problems.extend(check.problems)
            if same:
                problems.append(_conflict(doc, documents[same[0]], ident))
            elif not earlier and not check.problems:
                problems.append(_problem(doc, ("metadata", "name"), f"removes nothing: no earlier layer has {ident[0]} "
                                         f"{_label(ident)}; remove this stub", WARNING))
            removed_in[ident] = (layer, i)
            continue
        gone = removed_in.get(ident)
        if gone is not None and gone[0] == layer:
            problems.append(_conflict(documents[gone[1]], doc, ident))
        kept[ident].append(i)
        out[i] = True
    docs = [d for d, keep in zip(documents, out) if keep]
    results = [c for c, keep in zip(checks, out) if keep]
    return docs, results, problems


def _conflict(stub: Document, obj: Document, ident: tuple[str, str, str]) -> Problem:
    return _problem(stub, ("metadata", "name"), f"{ident[0]} {_label(ident)} is both removed here and defined in the "
                    f"same layer ({obj.file}:{obj.source.line}); a removal applies to earlier layers only: keep one")
