"""`nftrec diff OLD NEW`: the per-Service plan between two manifest trees (or two git
revisions, read without a checkout), for review before a change reaches any node.

No root, kernel, state or discovery: both sides compile with one node config and NEW is
diffed against OLD in canonical form, as the watch plans a sync against what it applied.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from reconciler import logs, progress
from reconciler.compile import NftSyntaxError, Ruleset
from reconciler.engine.plan import Plan, format_text, make_plan, to_json
from reconciler.engine.target import CommandError, short_revision
from reconciler.intake import Problem

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
NO_CHANGES = "No changes. OLD and NEW compile to the same ruleset."
MARKER = "<!-- nftrec-diff -->"  # lets a CI job find and update its earlier comment
MAX_MARKDOWN_OPS = 400  # transaction lines in a comment (GitHub caps a comment at 65,536 chars)


@dataclass
class Side:
    label: str  # what the user named: a directory, `<stdin>`, or a git revision
    revision: str = ""  # the inventory's revision: a commit, or sha256 of the files
    problems: list[Problem] = field(default_factory=list)
    ruleset: Ruleset | None = None
    inventory: object = None

    def to_json(self) -> dict:
        return {"source": self.label, "revision": self.revision}


def _load(label: str, read, config) -> Side:
    from reconciler.compile import compile_ruleset

    with progress.step(f"reading {label}"):
        res = read()
    side = Side(label, res.inventory.revision, list(res.problems), inventory=res.inventory)
    if res.ok:
        try:
            with progress.step(f"compiling {label}"):
                side.ruleset = compile_ruleset(res.inventory, config)
        except NftSyntaxError as e:  # defence in depth: validation should have refused it
            side.problems.append(Problem(label, 0, 0, "", "", "", f"refusing input that would reach nft "
                                         f"unsafely: {e}", "error"))
    return side


def run_diff(old: str, new: str, *, git: Path | None = None, merge_base: bool = False,
             config_path: Path | None = None, strict: bool = False, fields: str | None = None, output: str = "text",
             detailed: bool = False, verbose: bool = False, out_stream: TextIO | None = None) -> int:
    """Plan NEW against OLD; print it as text, json or markdown. 0, or 2 with `detailed`
    when something changes; 1 when either side (or the node config) is invalid."""
    from reconciler.compile import derived_topology_hints, relocate
    from reconciler.intake import GitError, display_root, load_node_config, read_inventory, read_revision, resolve_revision
    from reconciler.intake import identity_of
    from reconciler.intake import merge_base as git_merge_base
    from reconciler.kernel import canonical

    out_stream = out_stream or sys.stdout
    config, config_problems = load_node_config(str(config_path) if config_path else None, discover=False)
    fields = fields or config.field_validation
    identity = identity_of(config)  # a fleet root is read as this node's
    try:
        if git is not None:
            old_commit, new_commit = resolve_revision(git, old), resolve_revision(git, new)
            label_old = old
            if merge_base:  # files are named by the commit they are read from
                old_commit = git_merge_base(git, old_commit, new_commit)
                old, label_old = old_commit[:12], f"merge-base({old}, {new})"
            sides = [
                _load(label_old, lambda: read_revision(git, old, old_commit, strict=strict, fields=fields,
                                                       identity=identity), config),
                _load(new, lambda: read_revision(git, new, new_commit, strict=strict, fields=fields, identity=identity),
                      config),
            ]
        else:
            sides = [_load(display_root(d), lambda d=d: read_inventory(d, strict=strict, fields=fields,
                                                                       identity=identity), config)
                     for d in (old, new)]
    except GitError as e:
        raise CommandError(str(e)) from None
    problems = list(config_problems) + [p for s in sides for p in s.problems]
    for p in problems:
        logs.problem(p)
    errors = [p for p in problems if p.is_error]
    old_side, new_side = sides
    if errors or old_side.ruleset is None or new_side.ruleset is None:
        _write_invalid(out_stream, output, old_side, new_side, problems)
        logs.log.error(f"{len(errors)} error(s) in the input; nothing to compare. Run `nftrec validate` "
                       "on each side for the full report.")
        return EXIT_ERROR
    services = {s.key: s for s in new_side.inventory.services}
    inv = new_side.inventory
    hints = derived_topology_hints(inv.services, inv.endpoint_slices, config)
    with progress.step("comparing"):
        # layout "sharded": the new side keeps the old side's index ranges where they fit,
        # as apply keeps the kernel's (compile.relocate)
        new_side.ruleset = relocate(new_side.ruleset, old_side.ruleset)
        plan = make_plan(new_side.ruleset, canonical(old_side.ruleset), services, hints)
    if output == "json":
        doc = to_json(plan, old=old_side.to_json(), new=new_side.to_json(), table=config.table_name)
        json.dump(doc, out_stream, indent=2)
        out_stream.write("\n")
    elif output == "markdown":
        out_stream.write(format_markdown(plan, old_side, new_side))
    else:
        color = out_stream.isatty() and not _no_color()
        out_stream.write(format_text(plan, verbose=verbose, color=color, no_changes=NO_CHANGES))
    return EXIT_CHANGES if detailed and not plan.empty else EXIT_OK


def _no_color() -> bool:
    import os

    return bool(os.environ.get("NO_COLOR"))


# --- markdown --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text safe in a GitHub-flavoured markdown table cell: one line, no HTML, no `|`."""
    import html

    return html.escape(logs.escape(text), quote=False).replace("|", "\\|").replace("`", "\\`")


def _fence(lines: list[str]) -> str:
    """A code fence longer than any backtick run inside (CommonMark)."""
    import re

    return "`" * max(3, max((len(r) for line in lines for r in re.findall(r"`+", line)), default=0) + 1)


def _code_block(lines: list[str]) -> list[str]:
    fence = _fence(lines)
    return [fence, *lines, fence]


def _title(old: Side, new: Side) -> str:
    return f"### nftrec diff `{_cell(old.label)}` → `{_cell(new.label)}`"


def _footer(old: Side, new: Side) -> str:
    from reconciler import __version__

    return (f"<sub>old: `{_cell(old.label)}` ({_cell(short_revision(old.revision))}) · new: `{_cell(new.label)}` "
            f"({_cell(short_revision(new.revision))}) · nftrec {__version__}</sub>")


def format_markdown(plan: Plan, old: Side, new: Side) -> str:
    """A pull-request comment: title, the plan (markdown_plan), footer."""
    return "\n".join([MARKER, _title(old, new), "", *markdown_plan(plan), _footer(old, new)]) + "\n"


def markdown_plan(plan: Plan, max_ops: int = MAX_MARKDOWN_OPS) -> list[str]:
    """A plan's lines of a comment: the summary line, one table row per Service, the
    shared objects, and the exact transaction (at most `max_ops` lines) in <details>."""
    text = format_text(plan, no_changes=NO_CHANGES).splitlines()
    summary = text[-1] if text else NO_CHANGES
    out = [f"**{_cell(summary)}**", ""]
    if plan.services:
        out += ["| | Service | Change |", "|:-:|---|---|"]
        for sc in plan.services:
            what = "removed" if sc.action == "-" else sc.summary
            if sc.action != "-" and sc.service in plan.derived_hints:
                what += f" (topology hints derived: {plan.derived_hints[sc.service][0]})"
            out.append(f"| `{sc.action}` | `{_cell(sc.service)}` | {_cell(what)} |")
        out.append("")
    shared = [line for line in text if line[:8] in ("+ table ", "~ table ", "- table ")]
    if shared:
        out.append("Objects of no Service (base chains, static sets and maps):")
        out += [f"- `{_cell(line)}`" for line in shared]
        out.append("")
    notes = [line for line in text if line.startswith("Note: ")]
    out += [f"> {_cell(n)}" for n in notes] + ([""] if notes else [])
    if not plan.empty:
        ops = [str(op) for op in plan.transaction]
        shown = ops[:max_ops]
        if len(ops) > len(shown):
            shown.append(f"# ... and {len(ops) - len(shown)} more; run `nftrec diff` locally with -v for all")
        n = len(ops)
        out += [f"<details><summary>Transaction: {n} nft operation{'s' if n != 1 else ''}, one atomic "
                "commit on each node</summary>", ""]
        out += _code_block([logs.escape(op) for op in shown])
        out += ["", "</details>", ""]
    return out


def _write_invalid(stream: TextIO, output: str, old: Side, new: Side, problems: list[Problem]) -> None:
    """The invalid-input report on stdout for the machine formats (the CI job posts it);
    text output has the problems on stderr only, as `plan` does."""
    errors = sum(p.is_error for p in problems)
    if output == "json":
        json.dump({"formatVersion": 1, "valid": False, "old": old.to_json(), "new": new.to_json(),
                   "errors": errors, "problems": [p.to_json() for p in problems]}, stream, indent=2)
        stream.write("\n")
    elif output == "markdown":
        lines = [p.format_text() for p in problems]
        out = [MARKER, _title(old, new) + ": invalid input", "",
               f"**{errors} error{'s' if errors != 1 else ''}**: nftrec refuses to apply this revision; "
               "fix these first (`nftrec validate DIR` shows the same list):", ""]
        out += _code_block(lines) + ["", _footer(old, new)]
        stream.write("\n".join(out) + "\n")
