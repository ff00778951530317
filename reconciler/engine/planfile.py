"""Saved plans: `nftrec plan --out FILE` writes one, `nftrec apply --plan FILE` reads it.

Pipeline position: diff → transaction → **planfile** (save) … **planfile** (load) → apply.

A plan file is JSON (formatVersion 1, mode 0600, written atomically)::

    {"kind": "nftrec-plan", "formatVersion": 1,
     "planId": "<uuid4 hex>", "createdAt": "2026-05-09T07:35:25Z", "nftrecVersion": "0.1.0",
     "netns": "@host", "table": "nftrec", "revision": "<git commit>" | null,
     "desiredDigest": "<serialize.digest of desired>",
     "liveFingerprint": "<fingerprint of the live tables the plan was made against>",
     "kernelGeneration": 42 | null,
     "transaction": ["add element ip nftrec …", …],    # exactly what apply sends
     "desired": {…serialize.ruleset_to_json…},
     "summary": {…},                                  # the orchestrator's, opaque here
     "checksum": "<sha256 of the canonical JSON of all other fields>"}

The checksum catches truncation and hand edits (it is not a signature: whoever can write
the file can recompute it; the 0600 mode is the access control). `load` also checks that
`desired` hashes to `desiredDigest`.

When is a plan refused? (The orchestrator applies these; the rules live here.)
- stale: the live tables' fingerprint differs from the one the plan was made against,
  so its transaction was computed for another kernel state (`is_stale`);
- already applied: the state's `lastAppliedPlanId` is this plan's id (`already_applied`).
  The fingerprint check alone misses a plan whose transaction leaves the fingerprint as
  it was (a no-op plan, or a kernel returned to the same state); the id closes that gap.
  A plan applied long ago whose base state has come back is not refused: its transaction
  is valid for the kernel as it is now.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.compile import Ruleset
from reconciler.compile import SerializeError, canonical_json, digest, ruleset_from_json, ruleset_to_json
from reconciler.engine.state import Status, atomic_write, nftrec_version, utc_now

FORMAT_VERSION = 1
KIND = "nftrec-plan"


class PlanFileError(Exception):
    """A plan file that cannot be used; the message says what to do."""

    def __init__(self, path: Path, message: str):
        self.path = Path(path)
        super().__init__(message)


@dataclass
class SavedPlan:
    netns: str
    table: str
    revision: str | None
    desired_digest: str
    live_fingerprint: str
    kernel_generation: int | None
    transaction: list[str]  # the nft command texts, in order
    desired: dict  # serialize.ruleset_to_json form
    summary: dict
    plan_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = field(default_factory=utc_now)
    nftrec_version: str = field(default_factory=nftrec_version)
    format_version: int = FORMAT_VERSION

    @classmethod
    def create(
        cls,
        *,
        netns: str,
        table: str,
        revision: str | None,
        desired: Ruleset,
        live_fingerprint: str,
        kernel_generation: int | None,
        transaction: list[str],
        summary: dict,
    ) -> "SavedPlan":
        """A new plan with a fresh id; the digest and JSON form are taken from `desired`."""
        return cls(
            netns=netns,
            table=table,
            revision=revision,
            desired_digest=digest(desired),
            live_fingerprint=live_fingerprint,
            kernel_generation=kernel_generation,
            transaction=list(transaction),
            desired=ruleset_to_json(desired),
            summary=summary,
        )

    def desired_ruleset(self) -> Ruleset:
        return ruleset_from_json(self.desired)


# (JSON key, attribute, types, nullable)
_FIELDS: tuple[tuple[str, str, tuple[type, ...], bool], ...] = (
    ("planId", "plan_id", (str,), False),
    ("createdAt", "created_at", (str,), False),
    ("nftrecVersion", "nftrec_version", (str,), False),
    ("netns", "netns", (str,), False),
    ("table", "table", (str,), False),
    ("revision", "revision", (str,), True),
    ("desiredDigest", "desired_digest", (str,), False),
    ("liveFingerprint", "live_fingerprint", (str,), False),
    ("kernelGeneration", "kernel_generation", (int,), True),
    ("transaction", "transaction", (list,), False),
    ("desired", "desired", (dict,), False),
    ("summary", "summary", (dict,), False),
)


def _checksum(doc: dict) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in doc.items() if k != "checksum"})).hexdigest()


def save(plan: SavedPlan, path: Path) -> None:
    """Write `plan` to `path` atomically, readable by its owner only (0600)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise PlanFileError(path, f"cannot save the plan to {path}: directory {path.parent} does not exist; create it or choose another --out path")
    doc: dict[str, Any] = {"kind": KIND, "formatVersion": plan.format_version}
    for key, attr, _, _ in _FIELDS:
        doc[key] = getattr(plan, attr)
    doc["checksum"] = _checksum(doc)
    data = (json.dumps(doc, indent=1) + "\n").encode("utf-8")
    try:
        atomic_write(path, data, mode=0o600)
    except OSError as e:
        raise PlanFileError(path, f"cannot save the plan to {path}: {e.strerror or e}; check the path and permissions") from e


def load(path: Path) -> SavedPlan:
    """Read and check a plan file; every problem is a PlanFileError saying what to do."""
    path = Path(path)
    remake = f"make a new plan with `nftrec plan --out {path}`"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PlanFileError(path, f"no plan file at {path}: {remake} first") from None
    except OSError as e:
        raise PlanFileError(path, f"cannot read plan file {path}: {e.strerror or e}; check the path and permissions") from e
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanFileError(path, f"{path} is not a valid plan file (not JSON: {e}); {remake}") from e
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise PlanFileError(path, f"{path} is not an nftrec plan file (no \"kind\": \"{KIND}\"); pass a file written by `nftrec plan --out`")
    version = doc.get("formatVersion")
    if version != FORMAT_VERSION:
        raise PlanFileError(path, f"{path} is a plan of format version {version!r}, this nftrec ({nftrec_version()}) reads version {FORMAT_VERSION}; {remake}")
    if doc.get("checksum") != _checksum(doc):
        raise PlanFileError(path, f"{path} was changed or damaged after nftrec wrote it (checksum mismatch); {remake}")
    values: dict[str, Any] = {"format_version": version}
    for key, attr, types, nullable in _FIELDS:
        v = doc.get(key)
        if not ((v is None and nullable) or (isinstance(v, types) and not isinstance(v, bool))):
            raise PlanFileError(path, f"{path}: field {key!r} is missing or has the wrong type; {remake}")
        values[attr] = v
    if not all(isinstance(cmd, str) for cmd in values["transaction"]):
        raise PlanFileError(path, f"{path}: 'transaction' must be a list of nft command strings; {remake}")
    plan = SavedPlan(**values)
    try:
        desired = plan.desired_ruleset()
    except SerializeError as e:
        raise PlanFileError(path, f"{path}: the desired ruleset in it is damaged ({e}); {remake}") from e
    if digest(desired) != plan.desired_digest:
        raise PlanFileError(path, f"{path}: the desired ruleset does not match its desiredDigest; {remake}")
    return plan


def is_stale(plan: SavedPlan, live_fingerprint: str) -> bool:
    """True when the kernel's tables are no longer those the plan was computed against."""
    return plan.live_fingerprint != live_fingerprint


def already_applied(plan: SavedPlan, status: Status) -> bool:
    """True when the last apply recorded in the state was this very plan."""
    return status.last_applied_plan_id is not None and status.last_applied_plan_id == plan.plan_id
