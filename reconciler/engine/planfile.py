"""Saved plans: `nftrec plan --out FILE` writes one, `nftrec apply --plan FILE` reads it.

A plan file is JSON (mode 0600, written atomically): the transaction exactly as apply
sends it, the desired ruleset, the fingerprint of the live tables it was made against and
a checksum of the rest (catches truncation and hand edits; not a signature). A plan is
refused when stale (the live fingerprint changed) or already applied (its id is the
state's `lastAppliedPlanId`: a plan that left the fingerprint as it was). Made under
`verify`, it names the source and the verified revision (`verification`), which
`apply --plan` verifies there again.
"""

from __future__ import annotations

import hashlib
import json
import shlex
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
    # under `verify`: {source, revision, signer, key, time} of the Verdict; None without
    verification: dict | None = None
    # {fleet: fleet.yaml's text or None, revisionTime, timeError}: apply --plan's rollout
    # decision (engine/rollout.py saved_rollout); None in plans of older nftrecs
    rollout: dict | None = None

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
        verification: dict | None = None,
        rollout: dict | None = None,
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
            verification=verification,
            rollout=rollout,
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
    ("verification", "verification", (dict,), True),  # absent in plans of older nftrecs: null
    ("rollout", "rollout", (dict,), True),  # absent in plans of older nftrecs: null
)
# the verification's fields: (key, types, nullable)
_VERIFICATION = (("source", str, False), ("revision", str, False), ("signer", str, False), ("key", str, False),
                 ("time", int, True), ("oci", bool, True))


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


def _document(path: Path) -> dict:
    """The plan file's JSON, its kind, version, checksum and `rollout` checked."""
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
    made = doc.get("rollout")
    if made is not None and not (isinstance(made, dict) and all(
            made.get(k) is None or isinstance(made.get(k), t) and not isinstance(made.get(k), bool)
            for k, t in (("fleet", str), ("revisionTime", (int, float)), ("timeError", str)))):
        raise PlanFileError(path, f"{path}: field 'rollout' lacks a field or has one of the wrong type; {remake}")
    return doc


def rollout_of(path: Path) -> tuple[str | None, dict | None]:
    """(the plan's revision, its `rollout` or None) without reading its ruleset back
    (apply --plan decides the rollout first); PlanFileError as `load`."""
    doc = _document(Path(path))
    revision = doc.get("revision")
    return (revision if isinstance(revision, str) else None), doc.get("rollout")


def load(path: Path) -> SavedPlan:
    """Read and check a plan file; every problem is a PlanFileError saying what to do."""
    path = Path(path)
    remake = f"make a new plan with `nftrec plan --out {path}`"
    doc = _document(path)
    version = doc["formatVersion"]
    values: dict[str, Any] = {"format_version": version}
    for key, attr, types, nullable in _FIELDS:
        v = doc.get(key)
        if not ((v is None and nullable) or (isinstance(v, types) and not isinstance(v, bool))):
            raise PlanFileError(path, f"{path}: field {key!r} is missing or has the wrong type; {remake}")
        values[attr] = v
    if not all(isinstance(cmd, str) for cmd in values["transaction"]):
        raise PlanFileError(path, f"{path}: 'transaction' must be a list of nft command strings; {remake}")
    made = values["verification"]
    if made is not None and not all((made.get(k) is None and nullable) or (isinstance(made.get(k), t) and
                                    (t is bool or not isinstance(made.get(k), bool))) for k, t, nullable in _VERIFICATION):
        raise PlanFileError(path, f"{path}: field 'verification' lacks a field or has one of the wrong type; {remake}")
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


def apply_command(path: Path, *, state_dir: Path, netns: str | None, config: Path | None) -> str:
    """The shell command that applies the plan at `path` where it was made: the same state
    directory (a global option, so before the command), namespace and node config, every
    path absolute and every word quoted, so pasting it elsewhere cannot aim at the host or
    at another state."""
    words = ["nftrec", "--state-dir", str(Path(state_dir).absolute()), "apply", "--plan", str(Path(path).absolute())]
    if netns is not None:
        words += ["--netns", netns]
    if config is not None:
        words += ["--config", str(Path(config).absolute())]
    return " ".join(shlex.quote(w) for w in words)
