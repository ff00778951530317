"""`nftrec watch`: the reconcile daemon (SPEC §6), kube-proxy's sync loop without an API server.

    watchdog events ─► debounce ─► Runner (BoundedFrequencyRunner) ─► Daemon.sync()
                                          ▲ timer: fullSyncPeriod / syncPeriod after a failure

Intake. The manifest directory is watched recursively, and its parent non-recursively:
git-sync publishes a revision by swapping a symlink (`current -> rev-<sha>`), which is an
event in the parent. Every read resolves the link once and reads all files from that one
directory; if the link moved during the read, the read is repeated, so a sync never mixes
two revisions. An editor's write-temp-then-rename save is a burst of events; bursts are
debounced (DEBOUNCE seconds of quiet, at most DEBOUNCE_MAX of delay) into one trigger.

Incremental work per sync (what makes a one-Service edit cheap):
- files: parsed documents are cached per file, keyed by its stat (path, inode, size,
  mtime, ctime) and, when the stat changed, by the hash of its bytes (a git-sync revision
  re-uses the parse of every file it did not change). Files modified within RACY_SECONDS
  of a read are re-hashed next time (mtime granularity, as git's "racy" files);
- validation: per-document checks are cached per parsed document; only the checks across
  documents (`validate._cross`) run over everything;
- model and compile: model objects are cached per document; a Service is recompiled
  (`compile.compile_service`) only when it or its slices changed, then `compile.assemble`;
- diff: when the kernel's generation token is the one our last commit produced, the
  kernel holds exactly the ruleset in memory, so the new ruleset is diffed against that,
  restricted to the changed Services' objects and the shared skeleton (`project`), with
  no listing; the commit is verified by the token advancing by exactly one (nobody else
  committed in between, and the transaction is atomic). A full sync (first one, every
  fullSyncPeriod, after a failure, after SIGHUP, or whenever the token is not ours) lists
  the tables, reports what drifted from the last applied ruleset and repairs it.

Lock: the namespace lock (lock.py) is held for the daemon's lifetime, so a concurrent
`nftrec apply` fails fast and names the watch process. The daemon waits for the lock at
start when someone else holds it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from reconciler import logs
from reconciler.engine.apply import CommandError, Target, kernel_token, read_history, read_status, short_revision, verify_applied
from reconciler.engine.diff import diff
from reconciler.kernel.live import canonical, fingerprint, read_live
from reconciler.engine.lock import LockHeld
from reconciler.intake.model import Inventory, NodeConfig
from reconciler.kernel.nft import NftError
from reconciler.engine.plan import make_plan
from reconciler.intake.problems import ERROR, Problem
from reconciler.compile.ruleset import NftSyntaxError, Ruleset, Table, chain_id, element_id, set_id
from reconciler.engine.state import StateCorrupt

DEBOUNCE = 0.2  # seconds of quiet after the last file event before a sync is triggered
DEBOUNCE_MAX = 2.0  # a continuous stream of events triggers at least this often
RACY_SECONDS = 2.0  # files modified this recently are re-hashed on the next read
LOCK_RETRY = 1.0  # seconds between attempts to take the namespace lock at start


# --- the runner -----------------------------------------------------------------------------


class SyncFailed(Exception):
    """A sync that failed; the runner retries after syncPeriod (already logged)."""


class Fatal(SyncFailed):
    """The daemon cannot go on (its network namespace is gone): it exits 1 (already logged)."""


class Runner:
    """kube-proxy's BoundedFrequencyRunner (pkg/proxy/runner): `fn` runs when `run()` was
    called (coalesced: any number of calls before the run is one run) or when its timer
    fires, never sooner than `min_interval` after the previous run ended. The timer is
    `max_interval` after a run, or `min(retry_interval, max_interval)` after a failed one
    (fn raised). fn may return a number of seconds to shorten the next timer (the daemon
    uses it to keep full syncs `fullSyncPeriod` apart even when partial syncs happen).

    `clock` is injectable: `delay(now)` and `run_once()` are the whole logic, `loop()` only
    sleeps between them, so the logic is testable with a fake clock.
    """

    def __init__(self, fn: Callable[[], float | None], min_interval: float, retry_interval: float,
                 max_interval: float, clock: Callable[[], float] = time.monotonic):
        self._fn = fn
        self._clock = clock
        self._cond = threading.Condition()  # an RLock: signal handlers may call run()/stop()
        self._pending = False
        self._stopped = False
        self._last_end: float | None = None
        self._timer: float | None = None
        self.runs = 0
        self.set_intervals(min_interval, retry_interval, max_interval)

    def set_intervals(self, min_interval: float, retry_interval: float, max_interval: float) -> None:
        if max_interval < min_interval:
            raise ValueError(f"fullSyncPeriod ({max_interval}s) must not be shorter than minSyncPeriod ({min_interval}s)")
        with self._cond:
            self.min_interval, self.retry_interval, self.max_interval = min_interval, retry_interval, max_interval
            self._cond.notify_all()

    def run(self) -> None:
        """Ask for a run (non-blocking; coalesces with a pending one)."""
        with self._cond:
            self._pending = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def delay(self, now: float) -> float | None:
        """Seconds until the next run is due (<= 0: due now); None: nothing is scheduled."""
        due = None
        if self._pending:
            due = now
        if self._timer is not None:
            due = self._timer if due is None else min(due, self._timer)
        if due is None:
            return None
        if self._last_end is not None:
            due = max(due, self._last_end + self.min_interval)
        return due - now

    def run_once(self) -> bool:
        """Run fn now; schedule the timer. True when fn succeeded."""
        with self._cond:
            self._pending = False
            self._timer = None
        ok, hint = True, None
        try:
            hint = self._fn()
        except Exception as e:  # crash-protected like kube-proxy's runner
            ok = False
            if not isinstance(e, SyncFailed):
                logs.log.exception(f"sync crashed: {e}; retrying after syncPeriod")
        end = self._clock()
        with self._cond:
            self.runs += 1
            self._last_end = end
            wait = self.max_interval if ok else min(self.retry_interval, self.max_interval)
            if ok and hint is not None:
                wait = min(wait, max(hint, 0.0))
            self._timer = end + wait
        return ok

    def loop(self) -> None:
        """Run until stop(). Waits are bounded so signals and clock jumps are noticed."""
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    d = self.delay(self._clock())
                    if d is not None and d <= 0:
                        break
                    self._cond.wait(1.0 if d is None else min(d, 1.0))
            self.run_once()


# --- intake: one revision of the tree, re-parsing only changed files ------------------------


class _Recorder:
    """Stands in for load's hasher: keeps the bytes it is fed (display path + raw)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, b: bytes) -> None:
        self.parts.append(b)


@dataclass
class _FileEntry:
    stat: tuple
    sha: str  # of `chunk`
    chunk: bytes  # what load_manifests feeds its digest for this file
    docs: list
    problems: list
    racy: bool


@dataclass
class Snapshot:
    """One complete read of the manifest directory, validated and modelled."""

    inventory: Inventory
    problems: list[Problem]
    revision: str
    digest: str
    files: int
    root: str  # the resolved directory actually read

    @property
    def errors(self) -> int:
        return sum(p.severity == ERROR for p in self.problems)

    @property
    def ok(self) -> bool:
        return self.errors == 0


class Intake:
    """Reads the manifest directory like `load.read_inventory`, with caches (module doc).
    `read()` returns what read_inventory would: the oracle in tests/test_watch.py."""

    def __init__(self, directory: Path | str, *, strict: bool = False):
        self.shown = str(directory)
        self.path = Path(os.path.abspath(directory))
        self.strict = strict
        self._files: dict[str, _FileEntry] = {}
        self._checked: dict[int, tuple] = {}  # id(doc) -> (doc, obj or None, problems, unknown kind)
        self._models: dict[int, tuple] = {}  # id(doc) -> (doc, [model objects])
        self.parsed = 0  # files parsed by the last read (for logs and tests)

    def read(self) -> Snapshot:
        for _ in range(5):
            try:
                resolved = self.path.resolve(strict=True)
            except (OSError, RuntimeError):
                p = Problem(self.shown, 0, 0, "", "", "", "this manifest directory does not exist (or is a dangling "
                            "link); check the path", ERROR)
                return Snapshot(Inventory(), [p], "", hashlib.sha256().hexdigest(), 0, self.shown)
            snap = self._read(resolved)
            try:
                again = self.path.resolve(strict=True)
            except (OSError, RuntimeError):
                again = None
            if again == resolved:
                return snap
            # git-sync swapped the link while we read: read the new revision whole.
        return snap

    def _file(self, display: str, real: Path) -> _FileEntry:
        from reconciler.intake import load

        e = self._files.get(display)
        try:
            st = real.stat()
            key = (str(real), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        if e is not None and key is not None and e.stat == key and not e.racy:
            return e
        if e is not None and key is not None and st.st_size <= load.MAX_FILE_BYTES:
            try:
                raw = real.read_bytes()
            except OSError:
                raw = None
            if raw is not None:
                chunk = display.encode("utf-8", "surrogateescape") + b"\0" + raw + b"\0"
                if hashlib.sha256(chunk).hexdigest() == e.sha:
                    e.stat, e.racy = key, self._racy(st)
                    return e
        problems: list = []
        docs: list = []
        rec = _Recorder()
        load.read_file(display, real, problems, docs, rec)
        chunk = b"".join(rec.parts)
        self.parsed += 1
        e = _FileEntry(key or (), hashlib.sha256(chunk).hexdigest(), chunk, docs, problems,
                       key is None or self._racy(st))
        self._files[display] = e
        return e

    @staticmethod
    def _racy(st: os.stat_result) -> bool:
        return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_SECONDS * 1e9

    def _read(self, resolved: Path) -> Snapshot:
        from reconciler.intake import load

        self.parsed = 0
        problems: list[Problem] = []
        if resolved.is_file():
            paths = [(self.shown, resolved)]
        elif resolved.is_dir():
            paths = load.manifest_files(resolved, self.shown, problems)
        else:
            problems.append(Problem(self.shown, 0, 0, "", "", "", "this is neither a directory nor a file; point "
                                    "nftrec at the manifest directory", ERROR))
            paths = []
        hasher = hashlib.sha256()
        docs: list = []
        seen: set[str] = set()
        for display, real in paths:
            e = self._file(display, real)
            seen.add(display)
            hasher.update(e.chunk)
            problems.extend(e.problems)
            docs.extend(e.docs)
        for gone in set(self._files) - seen:
            del self._files[gone]
        digest = hasher.hexdigest()
        base = resolved if resolved.is_dir() else resolved.parent
        revision = load.find_revision(base) or f"sha256:{digest}"
        checked_problems, objs = self._check(problems, docs)
        inventory = self._inventory(objs, revision)
        return Snapshot(inventory, checked_problems, revision, digest, len(paths), str(resolved))

    def _check(self, load_problems: list[Problem], documents: list) -> tuple[list[Problem], list]:
        """validate.check, with the per-document part cached per parsed document."""
        from reconciler.intake.validate import check_document, check_tree

        cache: dict[int, tuple] = {}
        results = []
        for doc in documents:
            entry = self._checked.get(id(doc))
            if entry is None or entry[0] is not doc:
                entry = (doc, check_document(doc))
            cache[id(doc)] = entry
            results.append(entry[1])
        self._checked = cache
        checked = check_tree(load_problems, documents, results, strict=self.strict)
        return checked.problems, checked.objects

    def _inventory(self, objs: list, revision: str) -> Inventory:
        """inventory.build_inventory, with model objects cached per document."""
        from reconciler.intake.inventory import build_inventory, model_objects

        cache: dict[int, tuple] = {}

        def cached(o) -> list:
            entry = self._models.get(id(o.doc))
            if entry is None or entry[0] is not o.doc:
                entry = (o.doc, model_objects(o))
            cache[id(o.doc)] = entry
            return entry[1]

        inventory = build_inventory(objs, revision, make=cached)
        self._models = cache
        return inventory


# --- compile: only changed Services -----------------------------------------------------------


@dataclass
class Compiled:
    """A desired ruleset with what it was compiled from (for the next incremental step)."""

    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset
    static_key: tuple
    inputs: dict[str, tuple] = field(default_factory=dict)  # Service key -> (Service, slices)
    fragments: dict[str, object] = field(default_factory=dict)  # Service key -> ServiceFragment
    recompiled: int = 0


def compile_incremental(inventory: Inventory, config: NodeConfig, prev: Compiled | None) -> Compiled:
    """compile.compile_ruleset(inventory, config), re-using `prev`'s fragment of every
    Service whose Service object and slices are unchanged (same node config and service
    CIDRs). Equal to compile_ruleset's result (tests/test_watch.py checks)."""
    from reconciler.compile.services import FAMILIES, assemble, compile_service, compile_static, family_context, \
        slices_by_service

    static_key = (config, inventory.service_cidrs)
    reuse = prev is not None and prev.static_key == static_key
    contexts = {f: family_context(config, f) for f in FAMILIES}
    by_svc = slices_by_service(inventory.endpoint_slices)
    inputs, fragments, n = {}, {}, 0
    for svc in sorted(inventory.services, key=lambda s: (s.namespace, s.name)):
        key = svc.key
        inp = (svc, tuple(by_svc.get(key, ())))
        if reuse and key in prev.inputs and prev.inputs[key] == inp:
            frag = prev.fragments[key]
        else:
            frag = compile_service(svc, inp[1], config, contexts)
            n += 1
        inputs[key], fragments[key] = inp, frag
    ruleset = assemble(compile_static(config, inventory), fragments.values())
    return Compiled(inventory, config, ruleset, static_key, inputs, fragments, n)


def changed_services(old: Compiled, new: Compiled) -> set[str] | None:
    """Service keys whose objects may differ; None when everything may (static part changed)."""
    if old.static_key != new.static_key:
        return None
    keys = set(old.fragments) | set(new.fragments)
    return {k for k in keys if old.fragments.get(k) is not new.fragments.get(k)}


def project(rs: Ruleset, static: Ruleset, fragments: list) -> Ruleset:
    """`rs` restricted to the static skeleton's objects and the objects of `fragments`
    (chains, affinity sets, and only those elements of shared sets). Diffing two
    projections made with the same static part and the old + new fragments of every
    changed Service gives the same changes as diffing the whole rulesets: every object
    left out belongs to an unchanged Service in both."""
    out = Ruleset()
    for fam, t in rs.tables.items():
        st = static.tables.get(fam)
        chains = list(st.chains) if st else []
        whole_sets: set[str] = set()
        keys: dict[str, set] = {n: set(s.elements) for n, s in st.sets.items()} if st else {}
        for frag in fragments:
            ff = frag.families.get(fam)
            if ff is None:
                continue
            chains.extend(ff.chains)
            whole_sets.update(ff.sets)
            for set_name, key in ff.elements:
                keys.setdefault(set_name, set()).add(key)
        table = Table(t.family, t.name, t.comment)
        for name in chains:
            c = t.chains.get(name)
            if c is not None:
                table.chains[name] = c
                o = rs.owners.get(chain_id(fam, name))
                if o:
                    out.owners[chain_id(fam, name)] = o
        for name, s in t.sets.items():
            if name in whole_sets:
                table.sets[name] = s
            elif name in keys:
                want = keys[name]
                table.sets[name] = replace(s, elements={k: e for k, e in s.elements.items() if k in want}
                                           if len(want) * 4 > len(s.elements) else
                                           {k: s.elements[k] for k in want if k in s.elements})
                for k in table.sets[name].elements:
                    o = rs.owners.get(element_id(fam, name, k))
                    if o:
                        out.owners[element_id(fam, name, k)] = o
            else:
                continue
            o = rs.owners.get(set_id(fam, name))
            if o:
                out.owners[set_id(fam, name)] = o
        out.tables[fam] = table
    return out


def _netns_id(netns: str | None) -> tuple | None:
    if netns is None:
        return None
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _udp_services(inv: Inventory | None) -> set[str]:
    if inv is None:
        return set()
    return {s.key for s in inv.services if any(p.protocol == "UDP" for p in s.ports)}


def _counts(rs: Ruleset) -> dict[str, tuple[int, int]]:
    return {fam: (sum(len(c.rules) for c in t.chains.values()), sum(len(s.elements) for s in t.sets.values()))
            for fam, t in rs.tables.items()}


# --- the daemon -----------------------------------------------------------------------------


class Daemon:
    """State and the sync function; see the module doc. Not thread-safe: sync() runs on
    the runner's thread only; healthy() reads a few attributes."""

    def __init__(self, directory: Path, config_path: Path | None, target: Target, *, strict: bool,
                 metrics=None, clock: Callable[[], float] = time.monotonic):
        self.directory, self.config_path, self.target, self.strict = directory, config_path, target, strict
        self.metrics = metrics
        self.clock = clock
        self.intake = Intake(directory, strict=strict)
        self.store = target.store()
        self.nft = None
        self.config: NodeConfig | None = None
        self.desired: Compiled | None = None  # the last good revision, compiled
        self.applied: Compiled | None = None  # what our last commit put in the kernel
        self.token: int | None = None  # kernel token right after our last commit
        self.last_digest: tuple | None = None  # (input digest, revision) last read (valid or not)
        self.invalid: tuple[str, str] | None = None  # (revision, message) of an invalid latest revision
        self.need_full = True
        self.reload_config = False
        self.last_full: float | None = None
        self.last_success: float | None = None
        self.started = clock()
        self.on_root: Callable[[str], None] | None = None  # the watcher follows the resolved root
        self.store_error: str | None = None  # the last state-store write error (logged once)
        self.netns_id: tuple | None = None  # (st_dev, st_ino) of --netns when entered

    # -- config

    def load_config(self) -> bool:
        from reconciler.intake.config import discover_node_ips, load_node_config

        nft = self.nft
        cfg, problems = load_node_config(str(self.config_path) if self.config_path else None,
                                         discover_ips=lambda: nft.in_namespace(discover_node_ips))
        for p in problems:
            logs.problem(p)
        if any(p.is_error for p in problems):
            return False
        if self.config is not None and cfg.table_name != self.config.table_name:
            logs.log.error(f"tableName changed from {self.config.table_name} to {cfg.table_name}; watch cannot move "
                           f"to another table while it runs: keeping the old config; restart nftrec watch")
            return False
        if cfg.full_sync_period < cfg.min_sync_period:
            logs.log.error(f"{cfg.source.file}: fullSyncPeriod ({cfg.full_sync_period}s) is shorter than "
                           f"minSyncPeriod ({cfg.min_sync_period}s); make it at least as long")
            return False
        self.config = cfg
        return True

    # -- health

    def healthy(self) -> tuple[bool, str]:
        if self.invalid is not None:
            return False, f"revision {short_revision(self.invalid[0])} is invalid and was not applied: {self.invalid[1]}"
        period = self.config.full_sync_period if self.config else 3600.0
        now = self.clock()
        if self.last_success is None:
            if now - self.started > 2 * period:
                return False, f"no successful sync since the start {now - self.started:.0f}s ago"
            return True, "starting: no sync yet"
        if now - self.last_success > 2 * period:
            return False, f"no successful sync for {now - self.last_success:.0f}s (2 x fullSyncPeriod = {2 * period:.0f}s)"
        return True, f"revision {short_revision(self.applied.inventory.revision if self.applied else None)} applied " \
                     f"{now - self.last_success:.1f}s ago"

    # -- the sync function (runs on the runner's thread)

    def sync(self) -> float | None:
        start = self.clock()
        self._check_netns()
        if self.reload_config:
            self.reload_config = False
            before = self.config
            if self.load_config() and self.config != before:
                logs.log.info(f"node config {self.config.source.file} re-read; full sync")
                self.last_digest = None  # recompile everything with the new config
            self.need_full = True
        snap = self.intake.read()
        if self.on_root is not None:
            self.on_root(snap.root)
        if (snap.digest, snap.revision) != self.last_digest:
            self._take(snap)
        if self.desired is not None and self.desired.config != self.config:
            # SIGHUP changed the node config while the newest revision is invalid: the
            # last good revision is what stays in the kernel, compiled with the new config.
            try:
                self.desired = compile_incremental(self.desired.inventory, self.config, self.desired)
            except NftSyntaxError as e:
                logs.log.error(f"the last good revision does not compile with the new node config: {e}")
        full_due = self.last_full is None or self.clock() - self.last_full >= self.config.full_sync_period
        full = self.need_full or full_due
        if self.desired is None:
            return None  # no good revision read yet: the kernel stays untouched
        if not full and self.applied is not None and self.desired is self.applied:
            return self._next_full_in()
        try:
            self._sync(full, start)
        except SyncFailed:
            self.need_full = True
            raise
        return self._next_full_in()

    def _next_full_in(self) -> float | None:
        if self.last_full is None:
            return None
        return max(0.0, self.last_full + self.config.full_sync_period - self.clock())

    def _take(self, snap: Snapshot) -> None:
        """A new revision read: log its problems; compile it when valid."""
        self.last_digest = (snap.digest, snap.revision)
        for p in snap.problems:
            logs.problem(p)
        compiled, message = None, None
        if snap.ok:
            try:
                compiled = compile_incremental(snap.inventory, self.config, self.desired)
            except NftSyntaxError as e:  # defence in depth: validation should have refused it
                message = f"refusing input that would reach nft unsafely: {e}"
        else:
            message = f"{snap.errors} error(s) in the input"
        if compiled is None:
            self.invalid = (snap.revision, message)
            logs.log.error(f"revision {short_revision(snap.revision)} of {self.intake.shown} is invalid ({message}); "
                           f"it was not applied and the last good ruleset stays in the kernel. "
                           f"Run `nftrec validate {self.intake.shown}` for the full report.",
                           extra={"fields": {"event": "invalid", "revision": snap.revision, "errors": snap.errors}})
            self._record(self.store.record_attempt, snap.revision, f"invalid input: {message}")
            self._set_revisions()
            return
        self.invalid = None
        self.desired = compiled

    def _set_revisions(self) -> None:
        if self.metrics is None:
            return
        applied = self.applied.inventory.revision if self.applied else None
        attempted = self.invalid[0] if self.invalid else (self.desired.inventory.revision if self.desired else None)
        self.metrics.set_revisions(applied, attempted)

    def _sync(self, full: bool, start: float) -> None:
        desired = self.desired
        nft = self.nft
        reason = "" if full else None
        try:
            token = kernel_token(nft)
        except NftError as e:
            self._failed(desired, start, full, f"cannot read the kernel's ruleset generation: {e.text.strip()}")
        if not full and (token is None or token != self.token or self.applied is None):
            full, reason = True, "the kernel's ruleset changed since our last commit"
        drift = None
        verified_live = None
        try:
            if full:
                live = read_live(nft, self.target.table)
                old = self._last_applied_ruleset()
                if old is not None:
                    drift = diff(old, live)
                plan = make_plan(desired.ruleset, live, {s.key: s for s in desired.inventory.services})
            else:
                changed = changed_services(self.applied, desired)
                if changed is None:
                    old_p, new_p = self.applied.ruleset, desired.ruleset
                else:
                    from reconciler.compile.services import compile_static

                    static = compile_static(desired.config, desired.inventory)
                    frags = [f for k in changed for f in (self.applied.fragments.get(k), desired.fragments.get(k)) if f]
                    old_p, new_p = project(self.applied.ruleset, static, frags), project(desired.ruleset, static, frags)
                services = {s.key: s for s in desired.inventory.services}
                plan = make_plan(new_p, canonical(old_p), services)
            if not plan.empty:
                try:
                    nft.run(plan.transaction)
                except NftError as e:
                    if full:
                        raise
                    logs.log.warning(f"the transaction planned from memory failed ({e.text.strip()}); "
                                     f"listing the kernel's tables and planning again")
                    full, reason = True, "a transaction planned from memory failed"
                    live = read_live(nft, self.target.table)
                    plan = make_plan(desired.ruleset, live, {s.key: s for s in desired.inventory.services})
                    if not plan.empty:
                        nft.run(plan.transaction)
            after = kernel_token(nft)
            expected = token if plan.empty else (token + 1 if token is not None else None)
            if full or after is None or after != expected:
                verified_live, after = verify_applied(nft, self.target, desired.ruleset)
        except NftError as e:
            self._failed(desired, start, full, f"the kernel rejected the transaction; nothing was changed "
                         f"(the previous ruleset is whole). nft said: {e.text.strip()}")
        except CommandError as e:
            self._failed(desired, start, full, str(e))
        kernel_done = self.clock()
        # The kernel holds `desired` now; record it.
        previous = self.applied
        self.applied, self.token = desired, after
        self.need_full = False
        if full:
            self.last_full = start
        self.last_success = kernel_done
        live_fp = fingerprint(verified_live if verified_live is not None else canonical(desired.ruleset))
        if self._record(self.store.record_applied, desired.inventory.revision, desired.ruleset, live_fp, after) \
                and self.invalid is not None:  # still the newest revision read: keep it visible
            self._record(self.store.record_attempt, self.invalid[0], f"invalid input: {self.invalid[1]}")
        self._set_revisions()
        drifted = len(drift) if drift is not None else 0
        if drifted:
            owners = sorted(drift.owners())
            shown = ", ".join(owners[:5]) + (" ..." if len(owners) > 5 else "")
            logs.log.warning(f"drift: {drifted} object(s) in table {self.target.table} differed from the last applied "
                             f"ruleset" + (f" (Services: {shown})" if owners else " (shared objects)") + "; repaired",
                             extra={"fields": {"event": "drift", "objects": drifted, "services": owners}})
        changed = [f"{s.action}{s.service}" for s in plan.services]
        end = self.clock()
        kind = "full" if full else "partial"
        if self.metrics is not None:
            self.metrics.observe_sync(kind, end - start, True)
            if full:
                self.metrics.drift_repaired(drifted)
            for fam, (rules, elements) in _counts(desired.ruleset).items():
                self.metrics.set_counts(fam, rules, elements)
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        logs.log.info(
            f"sync {kind}: revision {short_revision(desired.inventory.revision)}, "
            f"{len(changed)} Service(s) changed{' (' + shown + ')' if changed else ''}, "
            f"{len(plan.transaction)} operations, {1000 * (end - start):.0f} ms "
            f"(kernel updated after {1000 * (kernel_done - start):.0f} ms)" + (f"; {reason}" if reason else ""),
            extra={"fields": {"event": "sync", "kind": kind, "revision": desired.inventory.revision,
                              "servicesChanged": changed, "operations": len(plan.transaction),
                              "durationMs": round(1000 * (end - start), 1),
                              "kernelMs": round(1000 * (kernel_done - start), 1),
                              "driftObjects": drifted, "recompiled": desired.recompiled,
                              "filesParsed": self.intake.parsed}})
        self._conntrack(previous, desired, plan)

    def _record(self, fn, *args) -> bool:
        """A state-store write. The kernel is what matters: a write that fails (state dir
        unwritable, disk full) is logged once until writes work again, without a traceback,
        and never fails the sync (`nftrec status` is stale meanwhile)."""
        try:
            fn(*args)
        except (OSError, StateCorrupt) as e:
            message = f"cannot record the state in {self.store.dir}: {e}"
            if message != self.store_error:
                logs.log.error(f"{message}; the kernel is still reconciled, `nftrec status` is stale until "
                               f"the state directory is writable again",
                               extra={"fields": {"event": "state", "ok": False}})
            self.store_error = message
            return False
        if self.store_error is not None:
            logs.log.info(f"state directory {self.store.dir} is writable again", extra={"fields": {"event": "state"}})
            self.store_error = None
        return True

    def bind_netns(self) -> None:
        """Remember which namespace --netns named when the daemon entered it."""
        self.netns_id = _netns_id(self.target.netns)

    def _check_netns(self) -> None:
        """The namespace thread keeps a deleted namespace alive: without this check the
        daemon would go on reconciling a namespace nothing else can see."""
        if self.target.netns is None or self.netns_id is None:
            return
        now = _netns_id(self.target.netns)
        if now != self.netns_id:
            what = "was deleted" if now is None else "was deleted and re-created"
            logs.log.error(f"network namespace {self.target.netns} {what} while nftrec watch ran; exiting "
                           f"(restart nftrec watch once the namespace exists)",
                           extra={"fields": {"event": "netns", "ok": False}})
            raise Fatal(f"network namespace {self.target.netns} {what}")

    def _last_applied_ruleset(self) -> Ruleset | None:
        """What we last committed (memory, else the state store): the reference for drift."""
        if self.applied is not None:
            return self.applied.ruleset
        try:
            st = read_status(self.store)
            entries = read_history(self.store)
            if entries and st.desired_digest == entries[-1].digest:
                return self.store.load_ruleset(entries[-1])
        except Exception:  # best effort: no drift report for the first sync
            return None
        return None

    def _failed(self, desired: Compiled, start: float, full: bool, message: str) -> None:
        logs.log.error(f"sync {'full' if full else 'partial'} of revision {short_revision(desired.inventory.revision)} "
                       f"failed: {message}; retrying in {self.config.sync_period:g}s",
                       extra={"fields": {"event": "sync", "ok": False, "revision": desired.inventory.revision}})
        self._record(self.store.record_attempt, desired.inventory.revision, message)
        if self.metrics is not None:
            self.metrics.observe_sync("full" if full else "partial", self.clock() - start, False)
            self.metrics.set_revisions(self.applied.inventory.revision if self.applied else None,
                                       desired.inventory.revision)
        raise SyncFailed(message)

    def _conntrack(self, old: Compiled | None, new: Compiled, plan) -> None:
        """UDP: entries pinned to endpoints that went away (reference §8.5)."""
        touched = {s.service for s in plan.services}
        if not touched & (_udp_services(old.inventory if old else None) | _udp_services(new.inventory)):
            return
        try:
            from reconciler.kernel import conntrack
        except ImportError:
            return
        try:
            n = conntrack.cleanup_udp(self.target.netns, new.inventory, new.config)
        except Exception as e:  # never fail a sync that already reached the kernel
            logs.log.warning(f"UDP conntrack cleanup failed: {e}")
            return
        if n:
            logs.log.info(f"deleted {n} stale UDP conntrack entr{'y' if n == 1 else 'ies'}",
                          extra={"fields": {"event": "conntrack", "deleted": n}})
        if self.metrics is not None:
            self.metrics.conntrack_deleted(n)


# --- the file watcher -----------------------------------------------------------------------


class Watcher:
    """watchdog on the directory (recursive, following git-sync's link) and its parent
    (the link swap); relevant events are debounced into `trigger()`."""

    def __init__(self, directory: Path, trigger: Callable[[], None], *, debounce: float = DEBOUNCE,
                 debounce_max: float = DEBOUNCE_MAX):
        from reconciler.intake.load import SUFFIXES

        self.link = os.path.abspath(directory)
        self.parent = os.path.dirname(self.link) or "/"
        self.trigger, self.debounce, self.debounce_max = trigger, debounce, debounce_max
        self._suffixes = SUFFIXES
        self._cond = threading.Condition()
        self._first: float | None = None  # first event of the current burst
        self._last = 0.0
        self._stopped = False
        self._root: str | None = None
        self._root_watch = None
        self.events = 0
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                watcher._event(event)

        self._handler = Handler()
        self._observer = Observer()
        self._observer.schedule(self._handler, self.parent, recursive=False)
        self._thread = threading.Thread(target=self._debounce_loop, name="nftrec-debounce", daemon=True)

    def start(self) -> None:
        self._observer.start()
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._observer.stop()
        self._observer.join(timeout=5)

    def follow(self, root: str) -> None:
        """Watch `root` (the resolved directory being read) recursively, instead of the old one."""
        if root == self._root or not os.path.isdir(root):
            return
        if self._root_watch is not None:
            try:
                self._observer.unschedule(self._root_watch)
            except (KeyError, OSError):
                pass
            self._root_watch = None
        try:
            self._root_watch = self._observer.schedule(self._handler, root, recursive=True)
            self._root = root
        except OSError as e:
            logs.log.warning(f"cannot watch {root}: {e}; changes are picked up by the periodic full sync")

    def _relevant(self, event) -> bool:
        if event.event_type in ("opened", "closed_no_write") or (event.is_directory and event.event_type == "modified"):
            return False
        for p in (event.src_path, getattr(event, "dest_path", "") or ""):
            if not p:
                continue
            p = os.fsdecode(p)
            if p == self.link:
                return True  # the directory itself or git-sync's link
            if os.path.dirname(p) == self.parent and not (self._root and p.startswith(self._root + os.sep)):
                continue  # a sibling of the link in the parent: not ours
            name = os.path.basename(p)
            rel = os.path.relpath(p, self._root) if self._root and p.startswith(self._root) else name
            if any(part.startswith(".") for part in rel.split(os.sep)):
                continue  # hidden (.git, .tmp-*, editor swap files): never read
            if event.is_directory or name.endswith(self._suffixes):
                return True
        return False

    def _event(self, event) -> None:
        if not self._relevant(event):
            return
        now = time.monotonic()
        with self._cond:
            self.events += 1
            self._last = now
            if self._first is None:
                self._first = now
            self._cond.notify_all()

    def _debounce_loop(self) -> None:
        while True:
            with self._cond:
                while self._first is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                while not self._stopped:
                    now = time.monotonic()
                    wait = min(self._last + self.debounce, self._first + self.debounce_max) - now
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                self._first = None
            self.trigger()


# --- entry point ----------------------------------------------------------------------------


def run_watch(directory: Path, config_path: Path | None, target: Target, *, strict: bool = False,
              metrics_address: str = "127.0.0.1:9105", debounce: float = DEBOUNCE) -> int:
    """The daemon: returns 0 after SIGTERM/SIGINT, 1 when it cannot start."""
    from reconciler.daemon.metrics import Metrics, MetricsError

    stop_requested = threading.Event()
    metrics = Metrics()
    daemon = Daemon(directory, config_path, target, strict=strict, metrics=metrics)
    server = lock = watcher = None
    runner: Runner | None = None

    def on_stop(signum, _frame):
        stop_requested.set()
        if runner is not None:
            runner.stop()

    def on_hup(_signum, _frame):
        daemon.reload_config = True
        if runner is not None:
            runner.run()

    old = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    try:
        try:
            daemon.nft = target.nft()
        except CommandError as e:
            logs.log.error(str(e))
            return 1
        daemon.bind_netns()
        if not daemon.load_config():
            return 1
        cfg = daemon.config
        if metrics_address:
            try:
                server = metrics.serve(metrics_address, daemon.healthy)
            except MetricsError as e:
                logs.log.error(f"{e}; give --metrics-address HOST:PORT, or \"\" to disable metrics")
                return 1
            logs.log.info(f"metrics on {server.url}/metrics, health on {server.url}/healthz",
                          extra={"fields": {"event": "metrics", "metricsUrl": server.url, "metricsPort": server.port}})
        lock = target.lock()
        said = False
        while not stop_requested.is_set():
            try:
                lock.acquire()
                break
            except LockHeld as e:
                if not said:
                    logs.log.warning(f"{e}; waiting for it")
                    said = True
                stop_requested.wait(LOCK_RETRY)
        if stop_requested.is_set():
            return 0
        fatal = []

        def sync() -> float | None:
            try:
                return daemon.sync()
            except Fatal:
                fatal.append(True)
                runner.stop()
                raise
            finally:  # a SIGHUP may have changed the periods
                c = daemon.config
                runner.set_intervals(c.min_sync_period, c.sync_period, c.full_sync_period)

        runner = Runner(sync, cfg.min_sync_period, cfg.sync_period, cfg.full_sync_period)
        watcher = Watcher(directory, runner.run, debounce=debounce)
        daemon.on_root = watcher.follow
        try:
            watcher.follow(str(Path(directory).resolve()))
        except OSError:
            pass
        watcher.start()
        logs.log.info(f"watching {directory} for table {target.table} in {target.where} (minSyncPeriod "
                      f"{cfg.min_sync_period:g}s, syncPeriod {cfg.sync_period:g}s, fullSyncPeriod "
                      f"{cfg.full_sync_period:g}s, debounce {debounce:g}s); pid {os.getpid()}",
                      extra={"fields": {"event": "start", "pid": os.getpid()}})
        runner.run()  # the initial (full) sync; nothing happens until a read succeeds
        if stop_requested.is_set():
            runner.stop()
        runner.loop()
        if fatal:
            return 1
        logs.log.info("stopping: the rules stay in place", extra={"fields": {"event": "stop"}})
        return 0
    finally:
        if watcher is not None:
            watcher.stop()
        if server is not None:
            server.close()
        if daemon.nft is not None:
            daemon.nft.close()
        if lock is not None:
            lock.release()
        for s, h in old.items():
            signal.signal(s, h)
