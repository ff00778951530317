"""A fleet node's documents: variables substituted in each document's string scalars,
each checked as validate.check_document checks it (a bad substituted value names where
it came from), removal stubs (`fleet.nftrec.io/remove: "true"`) kept apart, and the
layers merged by (kind, namespace, name), a later layer's object replacing an earlier one.

Pipeline position: load -> **fleet documents** (check_fleet_document, merge) -> check_tree.
"""

from __future__ import annotations

from reconciler.intake.fleet import Env, Substituted
from reconciler.intake.load import Document
from reconciler.intake.problems import Problem
from reconciler.intake.validate import DocumentCheck


def is_removal(doc: Document) -> bool:
    """Whether the document is a removal stub: annotation fleet.nftrec.io/remove "true"."""
    raise NotImplementedError


def substitute_document(doc: Document, env: Env) -> tuple[Document, dict[str, tuple[Substituted, ...]], list[Problem]]:
    """`doc` with `${...}` substituted in every string scalar (never in keys): a new
    Document when anything changed (unchanged containers shared), else `doc` itself; the
    substitutions by field path (problems.field_path's spelling); an error at
    file:line:col (load.locate) for each undefined variable."""
    raise NotImplementedError


def name_substitutions(problems: list[Problem], subs: dict[str, tuple[Substituted, ...]]) -> list[Problem]:
    """Each problem about a substituted field says where the value came from: `... (the
    value comes from ${labels.site} = 'x y', the node's label site)`."""
    raise NotImplementedError


def check_fleet_document(doc: Document, env: Env) -> tuple[Document, DocumentCheck]:
    """What a read path runs per document of a fleet root instead of check_document:
    a removal stub is checked (an accepted kind and a metadata.name) and never validated
    as an object; any other document is substituted, checked and its problems named."""
    raise NotImplementedError


def merge(documents: list[Document], checks: list[DocumentCheck], layers: list[int]
          ) -> tuple[list[Document], list[DocumentCheck], list[Problem]]:
    """The node's effective documents, in order: `layers[i]` is the layer index of
    documents[i]. A later layer's object (kind, namespace, name) replaces an earlier one
    whole; a removal stub drops the earlier one (a warning when it drops nothing). Two of
    one identity in one layer are both kept, for check_tree's duplicate error."""
    raise NotImplementedError
