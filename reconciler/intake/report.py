"""The `validate` command: every problem of the manifests and the node config, then a
one-line summary. Needs no root and no kernel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from reconciler import logs
from reconciler.intake.config import DEFAULT_PATH, load_node_config
from reconciler.intake.fleetread import identity_of
from reconciler.intake.inventory import read_inventory
from reconciler.intake.problems import ERROR, NOTICE, WARNING, count


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def run_validate(root, *, config_path=None, strict: bool = False, fields: str | None = None, output: str = "text",
                 stream: TextIO | None = None, cache_dir=None, allow_empty: bool = False, identity=None) -> int:
    """`nftrec validate`: print every problem; 0 valid, 1 invalid. Needs no root or kernel.

    JSON output (`output="json"`) is one document:
    {"valid": bool, "objects": N, "errors": N, "warnings": N, "notices": N,
     "revision": str, "problems": [{file, line, col, kind, obj, field, message, severity}]}

    `cache_dir`: the intake cache (intake/cache.py) to use; None reads without one.
    `fields`: --field-validation; None: the node config's fieldValidation (default strict).
    No Service at all is an error (validate.no_services) unless `allow_empty` or allowEmpty.
    A fleet root is read as the node config's node, or as `identity` (--node, --labels:
    a function of the node config, intake/nodeidentity.py) makes it.
    """
    from reconciler.intake.sources import display_root
    from reconciler.intake.validate import no_services

    stream = stream or sys.stdout
    cfg_problems: list = []
    cfg = None
    if config_path is not None or Path(DEFAULT_PATH).is_file():
        cfg, cfg_problems = load_node_config(None if config_path is None else str(config_path), discover=False)
        fields = fields or cfg.field_validation
        allow_empty = allow_empty or cfg.allow_empty
    if identity is not None:
        cfg = identity(cfg if cfg is not None else load_node_config(None, discover=False)[0])
    res = read_inventory(root, strict=strict, fields=fields or "strict", cache_dir=cache_dir,
                         identity=None if cfg is None else identity_of(cfg))
    root = display_root(root)  # `-`: <stdin>
    problems = list(res.problems) + list(cfg_problems)
    empty = None if allow_empty or not res.ok else no_services(len(res.inventory.services), root)
    problems.extend([empty] if empty else [])
    errors, warnings_, notices = count(problems, ERROR), count(problems, WARNING), count(problems, NOTICE)
    if output == "json":
        json.dump({"valid": errors == 0, "objects": res.documents, "errors": errors, "warnings": warnings_,
                   "notices": notices, "revision": res.inventory.revision,
                   "problems": [p.to_json() for p in problems]}, stream, indent=2)
        stream.write("\n")
    else:
        for p in problems:
            stream.write(p.format_text() + "\n")
        if res.documents == 0 and errors == 0:
            summary = f"{root}: 0 objects (empty directory)" if res.files == 0 else f"{root}: 0 objects"
        else:
            summary = f"{root}: {_plural(res.documents, 'object')}, {_plural(errors, 'error')}, {_plural(warnings_, 'warning')}"
            if notices:
                summary += f", {_plural(notices, 'notice')}"
        stream.write(logs.escape(summary) + "\n")
    return 0 if errors == 0 else 1
