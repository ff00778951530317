"""The state store: what nftrec last applied, per network namespace and table.

    <root>/host/lock                                  # the namespace lock (lock.py)
    <root>/host/tables/<table>/status.json
    <root>/host/tables/<table>/history/000007-3f2a9c01b2de.jsonl   # recorded.py's lines
    <root>/netns/<name>/...                           # same, for `--netns NAME`

Every write is atomic (reconciler/atomic.py). Nothing read is trusted: a damaged file
raises `StateCorrupt`, and `reset()` moves it aside so the caller rebuilds from the
kernel. Writers hold the namespace `Lock`; readers need not. Fields: state/README.md.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reconciler import logs
from reconciler.atomic import atomic_write, fsync_dir  # noqa: F401 - planfile and tests use them from here
from reconciler.compile import Ruleset, digest_pieces, form_parts, parts_digest
from reconciler.engine.recorded import read_ruleset, ruleset_lines
from reconciler.kernel import canonical
from reconciler.kernel import fingerprint as fingerprint_of

FORMAT_VERSION = 1
HISTORY_KEEP = 5
# How the host namespace is named in status.json and saved plans. '@' cannot appear in
# an `ip netns` name, so a namespace created as `ip netns add host` never passes for it.
HOST = "@host"
HOST_DIR = "host"
SYSTEM_STATE_DIR = Path("/var/lib/nftrec")

_REPO = Path(__file__).resolve().parents[2]
# `ip netns` names become file names under /run/netns: no '/', not '.' or '..'.
_NETNS_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")
# Table names reach this module already checked by ruleset.check_name, which allows '/';
# as a directory name we need one path component.
_TABLE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,255}")
_HISTORY_RE = re.compile(r"(\d+)-([0-9a-f]{12})\.jsonl")
_TEMP_RE = re.compile(r"\..+\.tmp-[A-Za-z0-9_]+")


class StateCorrupt(Exception):
    """A state file nftrec cannot trust. `path` is the file; `reason` says what is wrong."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"state file {self.path} cannot be trusted: {reason}. nftrec will not use it; move it "
                         f"aside (nftrec does this itself and rebuilds the state from the kernel on the next apply) or delete it.")


# --- paths, time, version ----------------------------------------------------------------


def default_state_dir(env: dict[str, str] | None = None, repo: Path | None = None) -> Path:
    """`$NFTREC_STATE_DIR`; else `<repo>/state` when running from a checkout; else /var/lib/nftrec.

    "A checkout" = the package sits next to pyproject.toml and state/README.md, which a
    wheel install never has. `env` and `repo` are for tests.
    """
    env = os.environ if env is None else env
    if env.get("NFTREC_STATE_DIR"):
        return Path(env["NFTREC_STATE_DIR"])
    repo = _REPO if repo is None else repo
    if (repo / "pyproject.toml").is_file() and (repo / "state" / "README.md").is_file():
        return repo / "state"
    return SYSTEM_STATE_DIR


def namespace_dir(root: Path, netns: str | None) -> Path:
    """`<root>/host` for the host (netns None or HOST), `<root>/netns/<name>` otherwise.

    Named namespaces live one level down so that `ip netns add host` cannot collide
    with the host's own state.
    """
    if netns is None or netns == HOST:
        return Path(root) / HOST_DIR
    if not _NETNS_RE.fullmatch(netns):
        raise ValueError(f"network namespace name {netns!r} cannot name a state directory: use letters, "
                         f"digits, '_', '.', '-' (as `ip netns add` does), not starting with '.'")
    return Path(root) / "netns" / netns


def utc_now() -> str:
    """RFC 3339, UTC, whole seconds: 2026-05-09T07:35:25Z."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def nftrec_version() -> str:
    """The version `nftrec --version` prints."""
    from reconciler import __version__

    return __version__


# --- JSON files --------------------------------------------------------------------------


def _dump(doc: dict) -> bytes:
    # Indented: these files are for operators to read, too.
    return (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode("utf-8")


def _read_json(path: Path) -> Any:
    """The parsed file, `FileNotFoundError` when absent, `StateCorrupt` when unreadable."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StateCorrupt(path, f"cannot be read ({e.strerror or e})") from e
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateCorrupt(path, f"is not valid JSON ({e})") from e


# --- status.json ------------------------------------------------------------------------

# (JSON key, Python attribute, accepted types, nullable)
_STATUS_FIELDS: tuple[tuple[str, str, tuple[type, ...], bool], ...] = (
    ("netns", "netns", (str,), False),
    ("table", "table", (str,), False),
    ("lastAppliedRevision", "last_applied_revision", (str,), True),
    ("lastAppliedAt", "last_applied_at", (str,), True),
    ("lastAppliedPlanId", "last_applied_plan_id", (str,), True),
    ("lastAttemptedRevision", "last_attempted_revision", (str,), True),
    ("lastAttemptedAt", "last_attempted_at", (str,), True),
    ("lastError", "last_error", (str,), True),
    ("desiredDigest", "desired_digest", (str,), True),
    ("liveFingerprint", "live_fingerprint", (str,), True),
    ("kernelGeneration", "kernel_generation", (int,), True),
    ("nftrecVersion", "nftrec_version", (str,), True),
    ("inputDigest", "input_digest", (str,), True),
    ("configDigest", "config_digest", (str,), True),
    ("commitSequence", "commit_sequence", (int,), True),
    ("lastAppliedRevisionTime", "last_applied_revision_time", (int,), True),
    ("lastAppliedTrust", "last_applied_trust", (str,), True),
    ("cleanedUpAt", "cleaned_up_at", (str,), True),
)
# may be absent (older nftrecs): read as null
_ADDED = {"commitSequence", "lastAppliedRevisionTime", "lastAppliedTrust", "cleanedUpAt"}


@dataclass
class Status:
    """status.json as data. A fresh store (nothing recorded yet) has every field None."""

    netns: str
    table: str
    last_applied_revision: str | None = None
    last_applied_at: str | None = None
    last_applied_plan_id: str | None = None  # id of the saved plan of the last apply, if any
    last_attempted_revision: str | None = None
    last_attempted_at: str | None = None
    last_error: str | None = None  # None: the last attempt succeeded (or none was made)
    desired_digest: str | None = None  # serialize.digest of the last applied ruleset
    live_fingerprint: str | None = None  # fingerprint of the live tables right after that apply
    kernel_generation: int | None = None  # nftables ruleset generation after that apply
    nftrec_version: str | None = None
    input_digest: str | None = None  # content digest of the manifest tree of the last apply
    config_digest: str | None = None  # effective node config + options + code of that apply
    commit_sequence: int | None = None  # the commit record's entry of that apply (commits.py)
    last_applied_revision_time: int | None = None  # its signed time (Verdict.time), with `verify`
    last_applied_trust: str | None = None  # with `verify`: signed, first-use or allow-rollback
    cleaned_up_at: str | None = None  # `cleanup` removed the tables since the last apply, on purpose
    format_version: int = FORMAT_VERSION

    @property
    def ever_applied(self) -> bool:
        return self.last_applied_at is not None

    def to_json(self) -> dict:
        doc: dict[str, Any] = {"formatVersion": self.format_version}
        for key, attr, _, _ in _STATUS_FIELDS:
            doc[key] = getattr(self, attr)
        return doc

    @classmethod
    def from_json(cls, doc: Any, path: Path) -> "Status":
        if not isinstance(doc, dict):
            raise StateCorrupt(path, f"holds a JSON {type(doc).__name__}, not an object")
        version = doc.get("formatVersion")
        if type(version) is not int:
            raise StateCorrupt(path, "has no integer formatVersion field")
        if version != FORMAT_VERSION:
            newer = " (written by a newer nftrec?)" if version > FORMAT_VERSION else ""
            raise StateCorrupt(path, f"has formatVersion {version}{newer}; this nftrec reads {FORMAT_VERSION}")
        values: dict[str, Any] = {}
        for key, attr, types, nullable in _STATUS_FIELDS:
            if key not in doc and key not in _ADDED:
                raise StateCorrupt(path, f"lacks the field {key!r}")
            v = doc.get(key)
            ok = (v is None and nullable) or (isinstance(v, types) and not isinstance(v, bool))
            if not ok:
                raise StateCorrupt(path, f"field {key!r} has the wrong type ({type(v).__name__})")
            values[attr] = v
        return cls(**values)  # unknown extra keys are ignored: same version, additive fields


# --- history ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryEntry:
    """One applied ruleset in `history/`; the ruleset itself is read by `load_ruleset`."""

    sequence: int  # increases by one per recorded apply; never reused while entries remain
    revision: str | None
    applied_at: str
    digest: str
    plan_id: str | None
    path: Path


def _history_entry(path: Path, doc: Any) -> HistoryEntry:
    m = _HISTORY_RE.fullmatch(path.name)
    if not isinstance(doc, dict) or not m:
        raise StateCorrupt(path, "is not a history entry (wrong name or not a JSON object)")
    if doc.get("formatVersion") != FORMAT_VERSION:
        raise StateCorrupt(path, f"has formatVersion {doc.get('formatVersion')!r}; this nftrec reads {FORMAT_VERSION}")
    try:
        entry = HistoryEntry(
            sequence=int(m.group(1)),
            revision=doc["revision"],
            applied_at=doc["appliedAt"],
            digest=doc["digest"],
            plan_id=doc["planId"],
            path=path,
        )
    except KeyError as e:
        raise StateCorrupt(path, f"lacks the field {e.args[0]!r}") from None
    for name in ("revision", "plan_id"):
        if getattr(entry, name) is not None and not isinstance(getattr(entry, name), str):
            raise StateCorrupt(path, f"field {name!r} is not a string")
    if not isinstance(entry.applied_at, str) or not isinstance(entry.digest, str):
        raise StateCorrupt(path, "fields 'appliedAt' and 'digest' must be strings")
    if doc.get("sequence") != entry.sequence or not entry.digest.startswith(m.group(2)):
        raise StateCorrupt(path, "its name does not match its sequence and digest fields")
    return entry


def _read_header(path: Path, text: bytes | None = None) -> Any:
    """A history file's first line (`text`, else read from it), parsed. FileNotFoundError
    when absent, StateCorrupt when unreadable."""
    try:
        if text is None:
            with open(path, "rb") as f:
                text = f.readline()
        return json.loads(text)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise StateCorrupt(path, f"cannot be read ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateCorrupt(path, f"has no JSON header line ({e})") from e


# --- the store --------------------------------------------------------------------------


class StateStore:
    """State of one (network namespace, table name) under a state directory `root`.

    `table` is the configured tableName; it covers both families' tables (ip and ip6).
    """

    def __init__(
        self,
        root: Path,
        netns: str | None = HOST,
        table: str = "nftrec",
        keep: int = HISTORY_KEEP,
        clock: Callable[[], str] = utc_now,
    ):
        if not _TABLE_RE.fullmatch(table):
            raise ValueError(f"table name {table!r} cannot name a state directory (one path component, starting with a letter)")
        if keep < 2:
            raise ValueError("keep at least 2 history entries, or apply --rollback has nothing to go back to")
        self.root = Path(root)
        self.netns = HOST if netns is None else netns
        self.table = table
        self.keep = keep
        self._clock = clock
        self.namespace_dir = namespace_dir(self.root, self.netns)
        self.dir = self.namespace_dir / "tables" / table
        self.status_path = self.dir / "status.json"
        self.history_dir = self.dir / "history"

    @property
    def lock_path(self) -> Path:
        """The namespace lock file (see lock.Lock); shared by all tables of the namespace."""
        return self.namespace_dir / "lock"

    # -- status --

    def status(self) -> Status:
        """The recorded status; a fresh Status when nothing was recorded; StateCorrupt if damaged."""
        try:
            doc = _read_json(self.status_path)
        except FileNotFoundError:
            return Status(netns=self.netns, table=self.table)
        st = Status.from_json(doc, self.status_path)
        if (st.netns, st.table) != (self.netns, self.table):
            # A copied or moved directory: its contents describe another namespace/table.
            raise StateCorrupt(
                self.status_path,
                f"describes netns {st.netns!r} table {st.table!r}, not netns {self.netns!r} table {self.table!r}",
            )
        return st

    def write_status(self, st: Status) -> None:
        atomic_write(self.status_path, _dump(st.to_json()))

    def record_attempt(self, revision: str | None, error: str | None) -> Status:
        """Record that `revision` was tried; `error` None means it went through (or was a no-op)."""
        st = self.status()
        st.last_attempted_revision = revision
        st.last_attempted_at = self._clock()
        st.last_error = error
        self.write_status(st)
        return st

    def record_cleanup(self) -> None:
        """Record that `cleanup` deleted the tables on purpose: not drift, nothing applied."""
        st = self.status()
        st.cleaned_up_at = self._clock()
        self.write_status(st)

    def record_applied(
        self,
        revision: str | None,
        ruleset: Ruleset,
        fingerprint: str | None,
        generation: int | None,
        plan_id: str | None = None,
        *,
        input_digest: str | None = None,
        config_digest: str | None = None,
        compiled: dict | None = None,
        commit: int | None = None,
        applied_at: str | None = None,
        listed: bool = False,
        revision_time: int | None = None,
        trust: str | None = None,
    ) -> Status:
        """Record a successful apply: a history entry unless the ruleset is unchanged (first,
        so status never names a ruleset not on disk), status, and `compiled` (compile_memo)
        as compiled.json. `input_digest`/`config_digest` name the manifests and effective
        node config compiled; None (a saved plan, a rollback, watch) disables the no-op
        fast path until the next apply of a directory. `commit`: its commit record entry
        (commits.py); `listed`: `ruleset` is a listing of the kernel (commits.adopt_commit).
        `revision_time`, `trust`: with `verify`, the revision's signed time and how it was
        accepted (the rollback baseline, commits.rollback_baseline)."""
        st = self.status()
        now = applied_at or self._clock()
        pieces = digest_pieces(ruleset)  # once: the digest and the history file
        d = parts_digest(form_parts(*pieces))
        # Sequence numbers come from file names only, so a damaged entry (which history()
        # reports) never blocks recording an apply that already reached the kernel.
        files = self._history_files()
        # Re-applying the same ruleset (drift repair, a revision that changed no rule)
        # adds no history entry: history is for going back to something different.
        if not files or self._entry_digest(files[-1][1]) != d:
            seq = files[-1][0] + 1 if files else 1
            header = {"formatVersion": FORMAT_VERSION, "sequence": seq, "revision": revision,
                      "appliedAt": now, "digest": d, "planId": plan_id}
            if listed:
                header.update(listed=True, fingerprint=fingerprint)
            atomic_write(self.history_dir / f"{seq:06d}-{d[:12]}.jsonl",
                         itertools.chain((json.dumps(header).encode("utf-8") + b"\n",), ruleset_lines(*pieces)))
            if files and not listed:
                self._drop_listed_twin(files[-1][1], ruleset)
        del pieces
        st.last_applied_revision = st.last_attempted_revision = revision
        st.last_applied_at = st.last_attempted_at = now
        st.last_applied_plan_id = plan_id
        st.last_error = None
        st.desired_digest = d
        st.live_fingerprint = fingerprint
        st.kernel_generation = generation
        st.nftrec_version = nftrec_version()
        st.input_digest = input_digest
        st.config_digest = config_digest
        st.commit_sequence = commit if commit is not None else st.commit_sequence
        st.last_applied_revision_time, st.last_applied_trust, st.cleaned_up_at = revision_time, trust, None
        self.write_status(st)
        if compiled is not None:
            self.write_compiled(d, compiled)
        self._prune()
        self._sweep_temp_files()
        return st

    def record_noop(self, revision: str | None) -> Status:
        """Record an apply that found nothing to do without compiling (the no-op fast
        path): the revision and times move on, the ruleset, digests and token stay."""
        st = self.status()
        now = self._clock()
        st.last_applied_revision = st.last_attempted_revision = revision
        st.last_applied_at = st.last_attempted_at = now
        st.last_applied_plan_id = None
        st.last_error = None
        st.nftrec_version = nftrec_version()
        st.last_applied_revision_time = st.last_applied_trust = st.cleaned_up_at = None  # never taken with `verify`
        self.write_status(st)
        return st

    def _drop_listed_twin(self, path: Path, ruleset: Ruleset) -> None:
        """A listed entry (kept from the kernel after a crash) holding the ruleset just
        recorded in compiled form is deleted: rollback must not go back to the same rules."""
        try:
            header = _read_header(path)
        except (OSError, StateCorrupt):
            return
        if isinstance(header, dict) and header.get("listed") and \
                header.get("fingerprint") == fingerprint_of(canonical(ruleset)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            fsync_dir(self.history_dir)

    # -- history --

    def _history_files(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.history_dir)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            m = _HISTORY_RE.fullmatch(name)
            if m:  # temp files and files moved aside by reset() do not match
                found.append((int(m.group(1)), self.history_dir / name))
        return sorted(found)

    def _entry_digest(self, path: Path) -> str | None:
        """The digest recorded in a history file, None when it cannot be read."""
        try:
            return _history_entry(path, _read_header(path)).digest
        except (OSError, StateCorrupt):
            return None

    def history(self) -> list[HistoryEntry]:
        """Applied rulesets, oldest first. A damaged entry raises StateCorrupt (reset(path) moves it)."""
        entries = []
        for _, path in self._history_files():
            try:
                doc = _read_header(path)  # the ruleset is read (and checked) by load_ruleset
            except FileNotFoundError:  # pruned by another reader's writer meanwhile
                continue
            entries.append(_history_entry(path, doc))
        return entries

    def previous(self) -> HistoryEntry | None:
        """The rollback target: the newest entry whose ruleset differs from the current one.

        "Current" is the status' desiredDigest (what was applied last), or the newest
        entry when status.json is gone. Rolling back records a new apply, so a second
        rollback returns to where the first one started (like `cd -`).
        """
        entries = self.history()
        if not entries:
            return None
        try:
            current = self.status().desired_digest
        except StateCorrupt:
            current = None
        if current is None:
            current = entries[-1].digest
        for entry in reversed(entries):
            if entry.digest != current:
                return entry
        return None

    def load_ruleset(self, entry: HistoryEntry, *, lazy: bool = False) -> Ruleset:
        """The ruleset of `entry`, checked against its recorded digest (recorded.py).
        `lazy`: chains and sets are decoded when first read."""
        path = entry.path
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise StateCorrupt(path, f"cannot be read ({e.strerror or e})") from e
        body = raw.find(b"\n") + 1
        if _history_entry(path, _read_header(path, raw[:body])).digest != entry.digest:
            raise StateCorrupt(path, "changed since its history was listed")
        try:
            return read_ruleset(raw, body, entry.digest, lazy=lazy)
        except ValueError as e:  # SerializeError and json's errors
            raise StateCorrupt(path, f"holds a damaged ruleset ({e})") from e

    # -- compiled.json: what the last applied ruleset was compiled from --

    @property
    def compiled_path(self) -> Path:
        return self.dir / "compiled.json"

    def write_compiled(self, desired_digest: str, memo: dict) -> None:
        """compiled.json: `memo` (compile.compile_memo) for the ruleset of `desired_digest`.
        Compact: one line per run, written after status.json (a crash in between leaves
        a memo of another digest, which is ignored)."""
        doc = {"formatVersion": FORMAT_VERSION, "desiredDigest": desired_digest, **memo}
        atomic_write(self.compiled_path, json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n")

    def read_compiled(self, desired_digest: str | None) -> dict | None:
        """The memo written with the ruleset of `desired_digest`, or None (absent, of
        another ruleset, or unreadable: the caller compiles everything, as without one)."""
        if desired_digest is None:
            return None
        try:
            doc = json.loads(self.compiled_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            logs.log.debug(f"ignoring {self.compiled_path}: {e}")
            return None
        if not isinstance(doc, dict) or doc.get("formatVersion") != FORMAT_VERSION \
                or doc.get("desiredDigest") != desired_digest:
            return None
        return doc

    def _prune(self) -> None:
        files = self._history_files()
        for _, path in files[: max(0, len(files) - self.keep)]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if len(files) > self.keep:
            fsync_dir(self.history_dir)

    def _sweep_temp_files(self) -> None:
        """Remove temp files an interrupted write left behind (writers hold the lock)."""
        for d in (self.dir, self.history_dir):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(d):
                    if _TEMP_RE.fullmatch(name):
                        with contextlib.suppress(OSError):
                            (d / name).unlink()

    # -- recovery --

    def reset(self, path: Path | None = None) -> Path | None:
        """Move a corrupt file (default: status.json) aside as `<name>.corrupt-<time>`.

        Returns the new path, or None when the file is already gone. Only files inside
        this store's directory are moved. The next `status()` is fresh, so the caller
        rebuilds from the kernel.
        """
        path = self.status_path if path is None else Path(path)
        if path.resolve().parent not in (self.dir.resolve(), self.history_dir.resolve()):
            raise ValueError(f"{path} is not a file of the state store at {self.dir}")
        stamp = self._clock().replace("-", "").replace(":", "")
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():  # two resets within one second
            n += 1
            target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return None
        fsync_dir(path.parent)
        return target


# --- reading with damaged files set aside ---------------------------------------------------


def _set_aside(store: StateStore, e: StateCorrupt) -> None:
    moved = store.reset(e.path)
    logs.log.warning(f"{str(e).rstrip('.')}; moved it to {moved} and continuing from the kernel's state "
                     f"(a successful apply records a fresh one)", extra={"fields": {"path": str(e.path)}})


def read_status(store: StateStore):
    """The recorded status; a corrupt file is reported, moved aside and rebuilt later."""
    try:
        return store.status()
    except StateCorrupt as e:
        _set_aside(store, e)
        return store.status()


def read_history(store: StateStore):
    """The applied-ruleset history, with every damaged entry reported and moved aside
    (bounded: each pass removes one file)."""
    for _ in range(store.keep + 16):
        try:
            return store.history()
        except StateCorrupt as e:
            _set_aside(store, e)
    return store.history()
