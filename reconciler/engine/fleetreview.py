"""The offline review of a fleet for CI: `validate --fleet INVENTORY DIR` (every node's
effective manifests, each problem once with the nodes it affects) and `diff OLD NEW
--fleet INVENTORY` (per node the plan `nftrec diff` makes for that node, nodes with
identical plans grouped), as text, JSON and Markdown for a pull-request comment.

Each side is read once (intake/fleetview.py); a compile and a plan run once per distinct
(old projection, new projection, node name when an endpoint names the node).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from reconciler import logs, progress
from reconciler.engine.review import (EXIT_CHANGES, EXIT_ERROR, EXIT_OK, MARKER, NO_CHANGES, Side, _cell, _code_block,
                                      _footer, _no_color, _title, markdown_plan)
from reconciler.engine.target import CommandError
from reconciler.intake import ERROR, NOTICE, WARNING, Problem, count

MARKDOWN_LIMIT = 60000  # GitHub caps a comment at 65,536 characters; room for the tail


# --- node lists ----------------------------------------------------------------------------


def _natural(name: str) -> tuple:
    """Natural order, numbers by width then value: edge-2, edge-001, edge-002, edge-100."""
    return tuple((0, len(t), int(t)) if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t)


def compress(names) -> str:
    """Node names in natural order, runs of 3 or more consecutive numbers (same prefix,
    suffix and width) as `edge-001…edge-040`."""
    parts: list[str] = []
    run: list = []  # [(prefix, number, width, suffix, name)]

    def flush() -> None:
        if len(run) >= 3:
            parts.append(f"{run[0][4]}…{run[-1][4]}")
        else:
            parts.extend(r[4] for r in run)
        run.clear()

    for name in sorted(set(names), key=_natural):
        m = re.fullmatch(r"(.*?)(\d+)(\D*)", name)
        if m is None:
            flush()
            parts.append(name)
            continue
        cur = (m.group(1), int(m.group(2)), len(m.group(2)), m.group(3), name)
        if run and not (run[-1][0] == cur[0] and run[-1][3] == cur[3] and run[-1][1] + 1 == cur[1]
                        and (run[-1][2] == cur[2] or not m.group(2).startswith("0"))):
            flush()
        run.append(cur)
    flush()
    return logs.escape(", ".join(parts))


def nodes_label(names) -> str:
    n = len(set(names))
    return f"{compress(names)} ({n} node{'s' if n != 1 else ''})"


def _inventory(path: Path):
    from reconciler.intake import load_node_inventory

    nodes, problems = load_node_inventory(path)
    for p in problems:
        logs.problem(p)
    if not nodes:
        raise CommandError(f"{path}: no usable node inventory ({count(problems, ERROR)} error(s) above); "
                           "fix it, then run again" if problems else f"{path}: the inventory lists no node")
    return nodes


def _by_problem(views, extra=lambda v: []) -> dict[Problem, list[str]]:
    """Every distinct problem of the views, with the nodes it affects, in report order."""
    out: dict[Problem, list[str]] = {}
    for v in views:
        for p in list(v.result.problems) + extra(v):
            out.setdefault(p, []).extend(v.nodes)
    return dict(sorted(out.items(), key=lambda kv: (kv[0].file, kv[0].line, kv[0].col)))


def _problem_lines(found: dict[Problem, list[str]]) -> list[str]:
    return [f"{p.format_text()} — nodes: {nodes_label(nodes)}" for p, nodes in found.items()]


def _problems_json(found: dict[Problem, list[str]]) -> list[dict]:
    return [dict(p.to_json(), nodes=sorted(set(nodes), key=_natural)) for p, nodes in found.items()]


def _no_stdin(*roots) -> None:
    if any(str(r) == "-" for r in roots):
        raise CommandError("--fleet reads a directory (or, for diff, --git revisions), not standard input; "
                           "unpack it first (e.g. git archive HEAD | tar -x -C DIR)")


def _read(label: str, read):
    with progress.step(f"reading {label}"):
        return read()


# --- validate --fleet ----------------------------------------------------------------------


def run_validate_fleet(inventory: Path, root, *, config_path=None, strict: bool = False, fields: str | None = None,
                       output: str = "text", stream: TextIO | None = None, allow_empty: bool = False) -> int:
    """Every node of the inventory validated as `validate --node` would; each problem
    printed once with its nodes. JSON: {"valid", "nodes", "projections", "errors",
    "warnings", "notices", "problems": [{file, line, ..., "nodes": [...]}]}. 0 valid, 1 not."""
    from reconciler.intake import DEFAULT_PATH, display_root, load_node_config, no_services, read_tree

    stream = stream or sys.stdout
    _no_stdin(root)
    nodes = _inventory(inventory)
    cfg_problems: list = []
    if config_path is not None or Path(DEFAULT_PATH).is_file():
        cfg, cfg_problems = load_node_config(None if config_path is None else str(config_path), discover=False)
        fields = fields or cfg.field_validation
        allow_empty = allow_empty or cfg.allow_empty
    tree = _read(display_root(root), lambda: read_tree(root, strict=strict, fields=fields or "strict"))
    with progress.step(f"projecting {len(nodes)} nodes"):
        views = list({id(v): v for v in (tree.view(n) for n in nodes)}.values())

    def empty(v) -> list:
        p = None if allow_empty or not v.result.ok else no_services(len(v.result.inventory.services), str(root))
        return [p] if p else []

    found = _by_problem(views, empty)
    problems = list(found) + list(cfg_problems)
    errors, warnings_, notices = count(problems, ERROR), count(problems, WARNING), count(problems, NOTICE)
    if output == "json":
        json.dump({"valid": errors == 0, "nodes": len(nodes), "projections": len(views), "errors": errors,
                   "warnings": warnings_, "notices": notices,
                   "problems": _problems_json(found) + [p.to_json() for p in cfg_problems]}, stream, indent=2)
        stream.write("\n")
    else:
        for line in _problem_lines(found) + [p.format_text() for p in cfg_problems]:
            stream.write(line + "\n")
        stream.write(logs.escape(f"{root}: {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({len(views)} distinct "
                                 f"projection{'s' if len(views) != 1 else ''}), {errors} error{'s' if errors != 1 else ''}"
                                 f", {warnings_} warning{'s' if warnings_ != 1 else ''}") + "\n")
    return 0 if errors == 0 else 1


# --- diff --fleet --------------------------------------------------------------------------


class _Plans:
    """Compiles and plans, each computed once per distinct input: a ruleset per (view,
    node name when its endpoints name the node), as compile_ruleset makes it, from
    fragments shared across views (a Service's fragment is a function of the Service, its
    slices and the node name only where those name the node); a plan per pair."""

    def __init__(self, config):
        self.config = config
        self.rulesets: dict[tuple, object] = {}
        self.fragments: dict[tuple, object] = {}
        self.canonical: dict[tuple, object] = {}
        self.plans: dict[tuple, object] = {}

    def ruleset(self, view, node: str, label: str):
        from reconciler.compile import NftSyntaxError, compile_ruleset

        key = (id(view), node if node in view.node_names else None)
        if key not in self.rulesets:
            try:
                self.rulesets[key] = compile_ruleset(view.result.inventory, replace(self.config, node_name=node),
                                                     fragment=self._fragment)
            except NftSyntaxError as e:  # defence in depth: validation should have refused it
                self.rulesets[key] = Problem(label, 0, 0, "", "", "", f"refusing input that would reach nft "
                                             f"unsafely: {e}", "error")
        return key, self.rulesets[key]

    def _fragment(self, svc, slices, config, contexts):
        """compile_service's result, once per Service and slices objects (the views keep
        them alive) and node name where the slices name the node."""
        from reconciler.compile import compile_service

        node = config.node_name
        named = any(node == e.node_name or node in (e.hint_nodes or ()) for sl in slices for e in sl.endpoints)
        key = (id(svc), tuple(map(id, slices)), node if named else None)
        frag = self.fragments.get(key)
        if frag is None:
            frag = self.fragments[key] = compile_service(svc, slices, config, contexts)
        return frag

    def plan(self, old, new, node: str, labels: tuple[str, str]):
        from reconciler.compile import derived_topology_hints, relocate
        from reconciler.engine.plan import make_plan
        from reconciler.kernel import canonical

        ko, old_rs = self.ruleset(old, node, labels[0])
        kn, new_rs = self.ruleset(new, node, labels[1])
        for rs in (old_rs, new_rs):
            if isinstance(rs, Problem):
                return rs
        key = (ko, kn)
        if key not in self.plans:
            if ko not in self.canonical:
                self.canonical[ko] = canonical(old_rs)
            inv = new.result.inventory
            cfg = replace(self.config, node_name=node)
            hints = derived_topology_hints(inv.services, inv.endpoint_slices, cfg)
            self.plans[key] = make_plan(relocate(new_rs, old_rs), self.canonical[ko], {s.key: s for s in inv.services},
                                        hints)
        return self.plans[key]


def _sides(old: str, new: str, git: Path | None, merge_base: bool, strict: bool, fields: str):
    from reconciler.intake import GitError, display_root, resolve_revision
    from reconciler.intake import merge_base as git_merge_base
    from reconciler.intake import read_git, read_tree

    try:
        if git is None:
            return [(display_root(d), _read(display_root(d), lambda d=d: read_tree(d, strict=strict, fields=fields)))
                    for d in (old, new)]
        old_commit, new_commit = resolve_revision(git, old), resolve_revision(git, new)
        label_old = old
        if merge_base:
            old_commit = git_merge_base(git, old_commit, new_commit)
            old, label_old = old_commit[:12], f"merge-base({old}, {new})"
        return [(label, _read(label, lambda r=r, c=c: read_git(git, r, c, strict=strict, fields=fields)))
                for label, r, c in ((label_old, old, old_commit), (new, new, new_commit))]
    except GitError as e:
        raise CommandError(str(e)) from None


def run_diff_fleet(old: str, new: str, inventory: Path, *, git: Path | None = None, merge_base: bool = False,
                   config_path: Path | None = None, strict: bool = False, fields: str | None = None,
                   output: str = "text", detailed: bool = False, verbose: bool = False,
                   out_stream: TextIO | None = None) -> int:
    """Per node of the inventory, the plan of NEW against OLD as `nftrec diff` computes it
    for that node (the node config with nodeName set to it); nodes with identical plans
    grouped. 0, or 2 with `detailed` when some node changes; 1 when a side is invalid."""
    from reconciler.engine.plan import to_json
    from reconciler.intake import load_node_config

    out = out_stream or sys.stdout
    if git is None:
        _no_stdin(old, new)
    nodes = _inventory(inventory)
    config, config_problems = load_node_config(str(config_path) if config_path else None, discover=False)
    for p in config_problems:
        logs.problem(p)
    (old_label, old_tree), (new_label, new_tree) = _sides(old, new, git, merge_base, strict,
                                                          fields or config.field_validation)
    with progress.step(f"projecting {len(nodes)} nodes"):
        pairs = [(n, old_tree.view(n), new_tree.view(n)) for n in nodes]
    found = _by_problem(list({id(v): v for _, o, nw in pairs for v in (o, nw)}.values()))
    errors = [p for p in list(found) + list(config_problems) if p.is_error]
    plans = _Plans(config)
    groups: dict[str, list] = {}  # plan's JSON -> [plan, nodes, old view, new view]
    keys: dict[int, str] = {}  # id(plan) -> its JSON (plans are kept by `plans`)
    if not errors:
        with progress.step("comparing"):
            for n, o, nw in pairs:
                plan = plans.plan(o, nw, n.name, (old_label, new_label))
                if isinstance(plan, Problem):
                    found.setdefault(plan, []).append(n.name)
                    errors.append(plan)
                    continue
                key = keys.get(id(plan)) or keys.setdefault(id(plan), json.dumps(to_json(plan), sort_keys=True))
                groups.setdefault(key, [plan, [], o, nw])[1].append(n.name)
    if errors:
        _write_invalid(out, output, old_label, new_label, found, config_problems)
        logs.log.error(f"{len(errors)} error(s) in the input; nothing to compare. Run `nftrec validate --fleet` "
                       "on each side for the full report.")
        return EXIT_ERROR
    ordered = sorted(groups.values(), key=lambda g: (g[0].empty, _natural(min(g[1], key=_natural))))
    changed = any(not g[0].empty for g in ordered)
    if output == "json":
        doc = {"formatVersion": 1, "old": {"source": old_label}, "new": {"source": new_label}, "nodes": len(nodes),
               "changed": changed, "groups": [
                   {"nodes": sorted(g[1], key=_natural), "count": len(g[1]),
                    "plan": to_json(g[0], old=Side(old_label, g[2].result.inventory.revision).to_json(),
                                    new=Side(new_label, g[3].result.inventory.revision).to_json(),
                                    table=config.table_name)} for g in ordered]}
        json.dump(doc, out, indent=2)
        out.write("\n")
    elif output == "markdown":
        out.write(format_markdown(ordered, Side(old_label, ordered[0][2].result.inventory.revision),
                                  Side(new_label, ordered[0][3].result.inventory.revision), len(nodes)))
    else:
        out.write(format_text(ordered, len(nodes), verbose=verbose, color=out.isatty() and not _no_color()))
    return EXIT_CHANGES if detailed and changed else EXIT_OK


def format_text(groups: list, total: int, *, verbose: bool = False, color: bool = False) -> str:
    from reconciler.engine.plan import format_text as plan_text

    lines: list[str] = []
    quiet = [n for g in groups if g[0].empty for n in g[1]]
    for plan, nodes, _, _ in groups:
        if plan.empty:
            continue
        body = plan_text(plan, verbose=verbose, color=color, no_changes=NO_CHANGES).splitlines()
        if len(body) == 2 and not body[0].startswith(("+ table", "~ table", "- table", "Note: ")):
            lines.append(f"{nodes_label(nodes)}: {body[0]}")  # one Service: one line
            lines.append(f"  {body[1]}")
        else:
            lines.append(f"{nodes_label(nodes)}:")
            lines += [f"  {line}" if line else "" for line in body]
    if quiet:
        lines.append(f"No changes: {nodes_label(quiet)}")
    changed = total - len(quiet)
    lines.append(f"Fleet: {total} node{'s' if total != 1 else ''}, {changed} with changes in "
                 f"{sum(not g[0].empty for g in groups)} group{'s' if sum(not g[0].empty for g in groups) != 1 else ''}.")
    return "\n".join(lines) + "\n"


def format_markdown(groups: list, old: Side, new: Side, total: int) -> str:
    """One pull-request comment: a section per group of nodes with identical plans, cut
    (with a count of what was left out) to stay under GitHub's comment size cap."""
    quiet = [n for g in groups if g[0].empty for n in g[1]]
    changed = [g for g in groups if not g[0].empty]
    head = [MARKER, _title(old, new) + f" across {total} node{'s' if total != 1 else ''}", "",
            f"**{total - len(quiet)} of {total} nodes change, in {len(changed)} group{'s' if len(changed) != 1 else ''}.**",
            ""]
    tail = ([f"No changes: {_cell(nodes_label(quiet))}", ""] if quiet else []) + [_footer(old, new)]
    size = sum(len(s) + 1 for s in head + tail)
    body: list[str] = []
    for i, (plan, nodes, _, _) in enumerate(changed):
        section = [f"#### {_cell(nodes_label(nodes))}", ""] + markdown_plan(plan, max_ops=100)
        cost = sum(len(s) + 1 for s in section)
        if size + cost > MARKDOWN_LIMIT:
            left = changed[i:]
            body += [f"> ... and {len(left)} more group{'s' if len(left) != 1 else ''} "
                     f"({sum(len(g[1]) for g in left)} nodes) left out to fit a comment; run "
                     "`nftrec diff --fleet` locally for all", ""]
            break
        body += section
        size += cost
    return "\n".join(head + body + tail) + "\n"


def _write_invalid(stream: TextIO, output: str, old: str, new: str, found: dict[Problem, list[str]],
                   config_problems: list[Problem]) -> None:
    """Every problem of either side once, with its nodes (text too: the nodes are the news)."""
    problems = list(found) + list(config_problems)
    errors = count(problems, ERROR)
    if output == "json":
        json.dump({"formatVersion": 1, "valid": False, "old": {"source": old}, "new": {"source": new},
                   "errors": errors, "problems": _problems_json(found) + [p.to_json() for p in config_problems]},
                  stream, indent=2)
        stream.write("\n")
        return
    lines = _problem_lines(found) + [p.format_text() for p in config_problems]
    if output == "markdown":
        kept, size = [], 0
        for i, line in enumerate(lines):
            size += len(line) + 1
            if size > MARKDOWN_LIMIT:
                kept.append(f"... and {len(lines) - i} more; run `nftrec validate --fleet` locally for all")
                break
            kept.append(line)
        lines = kept
        o, n = Side(old), Side(new)
        out = [MARKER, _title(o, n) + ": invalid input", "",
               f"**{errors} error{'s' if errors != 1 else ''}**: nftrec refuses to apply this revision on the "
               "nodes named; fix these first (`nftrec validate --fleet INVENTORY DIR` shows the same list):", ""]
        stream.write("\n".join(out + _code_block(lines) + ["", _footer(o, n)]) + "\n")
    else:
        stream.write("\n".join(lines) + "\n")
