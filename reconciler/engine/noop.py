"""The no-op fast path of `plan` and `apply`: "No changes" without reading the manifests'
YAML, compiling or listing the kernel's tables. It holds when the manifests' digest
(`intake.input_digest`), the effective node config's (`intake.config_digest`, after node
address discovery, with --strict and the code) and the kernel's generation token all equal
what the last apply of a directory recorded. `--refresh` and `--out` never take it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reconciler import logs
from reconciler.engine.state import read_status
from reconciler.engine.target import Target, short_revision
from reconciler.kernel import kernel_token

# Only what the check needs is imported here: every import it pays shows in a no-op's time.


@dataclass(frozen=True)
class Noop:
    revision: str


def config_cache_dir(state_root: Path) -> Path | None:
    """Where the node config's checked settings are kept (intake.read_settings): the
    state directory's cache, beside the intake cache; NFTREC_INTAKE_CACHE=off reads without."""
    if os.environ.get("NFTREC_INTAKE_CACHE", "").lower() in ("0", "off", "no", "false"):
        return None
    return Path(state_root) / "cache" / "nodeconfig"


def _why_not(target: Target, directory: Path, config_path: Path | None, *, strict: bool,
             fields: str | None) -> tuple[Noop | None, str]:
    from reconciler.engine.desired import load_config
    from reconciler.intake import config_digest, input_digest, is_fleet_root, is_stdin

    if is_stdin(directory):
        return None, "the manifests come from standard input"

    st = read_status(target.store())
    if not st.input_digest or not st.config_digest or st.kernel_generation is None:
        return None, "the last apply recorded no input and config digests"
    nft = target.nft()
    try:
        if kernel_token(nft) != st.kernel_generation:
            return None, "the kernel's ruleset generation changed since the last apply"
        config = None  # a fleet root's files depend on the node's identity: the config first

        def load() -> tuple:
            return load_config(config_path, target.netns,  # as load_desired reads it
                               cache_dir=config_cache_dir(target.state_root), nft=nft, fields=fields)
        if is_fleet_root(directory):
            config = load()
        if config is not None:
            from reconciler.intake import identity_of
        d = input_digest(directory, (st.input_digest, st.last_applied_revision),
                         None if config is None else identity_of(config[0]))
        if d.problems:
            return None, "reading the manifest directory found problems"
        if d.digest != st.input_digest:
            return None, "the manifests changed since the last apply"
        cfg, problems = config or load()
        if problems:
            return None, "the node config has problems"
        if cfg.verify is not None:
            return None, "verify is set: every run checks the revision's signature"
        if config_digest(cfg, strict=strict) != st.config_digest:
            return None, "the effective node config (or --strict, --field-validation, or nftrec) changed since the last apply"
    finally:
        nft.close()
    return Noop(d.revision), ""


def check_noop(target: Target, directory: Path, config_path: Path | None, *, strict: bool,
               fields: str | None = None) -> Noop | None:
    """A Noop when input, config and kernel are unchanged since the last apply, else None."""
    noop, why = _why_not(target, directory, config_path, strict=strict, fields=fields)
    if noop is None:
        logs.log.debug(f"no-op fast path not taken: {why}")
    else:
        logs.log.debug("no-op fast path: manifests, effective node config and kernel generation are unchanged "
                       "since the last apply; not compiling or listing")
    return noop


def _empty_plan():
    from reconciler.compile import Ruleset
    from reconciler.engine.changes import Changes
    from reconciler.engine.plan import Plan
    from reconciler.kernel import Transaction

    return Plan(Ruleset(), Changes(), Transaction(), [], [])


def run_plan_noop(target: Target, directory: Path, config_path: Path | None, *, strict: bool, output: str,
                  fields: str | None = None, out_stream: TextIO = sys.stdout) -> int | None:
    """`plan` through the fast path: the exit code, or None when it does not hold."""
    noop = check_noop(target, directory, config_path, strict=strict, fields=fields)
    if noop is None:
        return None
    from reconciler.engine.plan import format_text, to_json

    plan = _empty_plan()
    if output == "json":
        import json

        doc = to_json(plan, netns=target.netns, table=target.table, revision=noop.revision, fastPath=True)
        json.dump(doc, out_stream, indent=2)
        out_stream.write("\n")
    else:
        out_stream.write(format_text(plan))
    return 0


def run_apply_noop(target: Target, directory: Path, config_path: Path | None, *, strict: bool,
                   fields: str | None = None, out_stream: TextIO = sys.stdout) -> int | None:
    """`apply` through the fast path (under the lock): records the revision, or None."""
    lock = target.hold_lock()
    try:
        noop = check_noop(target, directory, config_path, strict=strict, fields=fields)
        if noop is None:
            return None
        target.store().record_noop(noop.revision)
        from reconciler.engine import applystatus

        applystatus.report("applied", noop.revision)
        from reconciler.engine.plan import format_text

        out_stream.write(format_text(_empty_plan()))
        print(f"Apply complete: 0 operations; revision {short_revision(noop.revision)} is live in "
              f"{target.where} (unchanged since the last apply).", file=out_stream)
        return 0
    finally:
        lock.release()
