"""`nftrec render --manifests`: a node's effective manifests, as YAML. For a fleet root,
the documents of the node's layers with its variables substituted, merged (a later
layer's object replacing an earlier one, removals applied), in merge order; for a plain
directory, its documents (intake.read_documents). Each is preceded by `# <file>:<line>`,
where it was written.
"""

from __future__ import annotations

import io
import json
from typing import TextIO

from reconciler.logs import escape


def write_manifests(docs: list, out: TextIO) -> None:
    """The documents as one YAML stream, each after a `# file:line` comment."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    for i, doc in enumerate(docs):
        text = io.StringIO()
        yaml.dump(json.loads(json.dumps(doc.data, default=str)), text)  # plain types (a YAML 1.1 boolean read as text stays text)
        out.write(("---\n" if i else "") + f"# {escape(doc.file)}:{doc.source.line}\n" + text.getvalue())
