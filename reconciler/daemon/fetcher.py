"""`nftrec watch oci://...`: the source's own thread, apart from the syncs. Every
oci.interval it resolves the reference (one HEAD request for a tag); a new digest is pulled
(every digest checked; with `verify`, cosign's signatures checked before the layer is
fetched: a refused artifact is reported to the daemon, never fetched or published),
published by the store's symlink swap, which the watcher follows as git-sync's, and old
artifacts are pruned. A failure changes nothing in the kernel: it is counted, logged,
recorded for `status`, and retried with exponential backoff up to oci.interval.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from reconciler import logs
from reconciler.engine import KEEP, StateCorrupt, Target, jitter, read_source_state, read_status
from reconciler.engine import reference, utc_now, write_source_state
from reconciler.intake import (
    SOURCE_ERROR_REASONS, NodeConfig, Refused, SourceError, artifact_at, close_registries, named_digest, open_store, prune,
    pull, resolve, store_for,
)

STORE_ERROR = "store"  # the reason label when the state directory cannot be written
BACKOFF_START = 1.0  # seconds before the first retry; doubled per failure, up to oci.interval


class Fetcher:
    """Resolve, pull and publish on a thread (module doc). `ready()`: an artifact of this
    reference is published; until then the daemon syncs nothing."""

    def __init__(self, source: str, target: Target, metrics=None, clock: Callable[[], float] = time.monotonic):
        self.ref = reference(source)  # a CommandError naming it when it is not a reference
        self.target, self.metrics, self.clock = target, metrics, clock
        self.store = open_store(store_for(target.store().dir, self.ref))  # watched before the first fetch
        self.link = self.store / "current"
        if metrics is not None:
            metrics.source_reasons((*SOURCE_ERROR_REASONS, STORE_ERROR))
        self.config: Callable[[], NodeConfig | None] = lambda: None  # main: the daemon's node config
        self.applied: Callable[[], str | None] = lambda: None  # main: the revision in the kernel
        self.resigned: Callable[[], None] = lambda: None  # main: take the published revision again
        self.verifier: Callable[[], object] = lambda: None  # main: the daemon's CosignVerifier under `verify`
        self.refused: Callable[[object], None] = lambda verdict: None  # main: an artifact refused unfetched
        self.unsigned: tuple[str, str] | None = None  # (digest, message) of the refusal last reported
        self.state = read_source_state(target.store()) or {}
        self.current = self._kept()
        self.state = {"reference": str(self.ref), "digest": self.current,
                      "revision": self.state.get("revision") if self.current else None,
                      "fetchedAt": self.state.get("fetchedAt") if self.current else None}
        self.failures = 0  # consecutive failed polls
        self.logged: str | None = None  # the reason of the failure last logged
        self.failing_since: float | None = None
        self.polls = self.pulls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nftrec-fetch", daemon=True)

    def _kept(self) -> str | None:
        """The published artifact, when this reference's fetcher published it (a restart with
        the registry down serves it); another reference's (same repository) is not used."""
        artifact = artifact_at(self.link) if os.path.islink(self.link) else None
        if artifact is None or self.state.get("reference") != str(self.ref) or self.state.get("digest") != artifact.digest:
            return None
        return artifact.digest

    def ready(self) -> bool:
        return self.current is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)  # a request in flight ends at its timeout
        close_registries()  # the kept connections

    def _loop(self) -> None:
        """Poll at once, then every oci.interval, shifted once by the node's jitter (up to
        10 % of it, from its name): a fleet started together spreads its polls."""
        wait, shifted = 0.0, False
        while not self._stop.wait(wait):
            wait = self.poll()
            cfg = self.config()
            if not shifted and cfg is not None:
                wait, shifted = wait + jitter(cfg.node_name, cfg.oci.interval, "poll"), True

    def poll(self) -> float:
        """One resolve (and pull + publish when the digest is new); seconds until the next."""
        cfg = self.config()
        if cfg is None:
            return BACKOFF_START
        interval = cfg.oci.interval
        try:
            digest = resolve(self.ref, cfg.oci)
            self.polls += 1
            if self.metrics is not None:
                self.metrics.source_polled()
            if digest != self.current:
                self._take(digest, cfg)
            elif cfg.verify is not None and digest != self._applied():
                self._signed_since(digest, cfg)
        except SourceError as e:
            return self._failed(e.reason, e.message, interval)
        except OSError as e:  # the store: disk full, permissions
            return self._failed(STORE_ERROR, f"cannot write the store {self.store}: {e.strerror or e}", interval)
        if self.failures:
            logs.log.info(f"source {self.ref}: reachable again after {self.failures} failed attempt(s) over "
                          f"{self.clock() - self.failing_since:.0f}s", extra={"fields": {"event": "source", "ok": True}})
            self.failures, self.logged, self.failing_since = 0, None, None
            self._record(lastError=None, lastErrorReason=None, lastErrorAt=None, failingSince=None, failures=0)
        return interval

    def _take(self, digest: str, cfg: NodeConfig) -> None:
        """Pull, publish, prune; the watcher sees the link swap and asks for a sync."""
        start = self.clock()
        verifier = self.verifier() if cfg.verify is not None else None
        try:
            artifact = pull(self.ref, cfg.oci, self.store, digest=digest, signatures=cfg.verify is not None,
                            check=verifier.require_signed if verifier is not None else None, publish=True)
        except Refused as e:  # its layer was not fetched; polled again: cosign may sign it later
            if self.unsigned != (digest, e.verdict.message):
                self.unsigned = (digest, e.verdict.message)
                self.refused(e.verdict)
            return
        self.unsigned = None
        self.current = digest
        self.pulls += 1
        if self.metrics is not None:
            self.metrics.source_pulled()
        logs.log.info(f"source {self.ref}: artifact {artifact.name} fetched in {1000 * (self.clock() - start):.0f} "
                      f"ms and published for the next sync", extra={"fields": {
                          "event": "source", "ok": True, "reference": str(self.ref), "digest": digest,
                          "revision": artifact.name}})
        self._record(digest=digest, revision=artifact.name, fetchedAt=utc_now())
        try:
            prune(self.store, keep=KEEP, protect=frozenset(d for d in (digest, self._applied()) if d))
        except OSError as e:
            logs.log.warning(f"source {self.ref}: cannot prune old artifacts in {self.store}: {e}")

    def _signed_since(self, digest: str, cfg: NodeConfig) -> None:
        """The published artifact is not the applied one (with verify: refused, or not
        synced yet). cosign signs after `flux push` has moved the tag, so its signatures
        are read again; when they changed, the daemon takes the revision again."""
        before = artifact_at(self.link)
        after = pull(self.ref, cfg.oci, self.store, digest=digest, signatures=True)
        if before is not None and after.signatures != before.signatures:
            logs.log.info(f"source {self.ref}: the signatures of {after.name} changed; checking it again",
                          extra={"fields": {"event": "source", "ok": True, "digest": digest}})
            self.resigned()

    def _applied(self) -> str | None:
        """The digest of the artifact in the kernel (kept for rollback)."""
        revision = self.applied()
        if revision is None:
            try:
                revision = read_status(self.target.store()).last_applied_revision
            except (OSError, StateCorrupt):
                return None
        return named_digest(revision)

    def _failed(self, reason: str, message: str, interval: float) -> float:
        """Count, record, log once per kind of failure; the backoff before the next try."""
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self.clock()
        if self.metrics is not None:
            self.metrics.source_failed(reason)
        delay = min(interval, BACKOFF_START * 2 ** min(self.failures - 1, 20))
        if self.logged != reason:  # a repeated failure is counted, not logged again (its text may vary)
            self.logged = reason
            logs.log.error(f"source {self.ref}: {message} ({reason}); nothing changed in the kernel, retrying with "
                           f"backoff up to {interval:g}s", extra={"fields": {
                               "event": "source", "ok": False, "reason": reason, "reference": str(self.ref)}})
        now = utc_now()
        self._record(lastError=message, lastErrorReason=reason, lastErrorAt=now, failures=self.failures,
                     failingSince=self.state.get("failingSince") or now)
        return delay

    def _record(self, **changes) -> None:
        self.state.update(changes)
        try:
            write_source_state(self.target.store(), self.state)
        except OSError:
            pass  # status is stale then; the state directory's own errors are logged by the syncs

    def health_note(self) -> str | None:
        """What /healthz adds about the source (it stays green: the kernel serves the last
        good artifact; a source failure is a separate condition, as Flux's)."""
        if self.failures:
            return (f"source {self.ref} failing for {self.clock() - self.failing_since:.0f}s "
                    f"({self.logged or '?'}, {self.failures} attempt(s))")
        if self.current is None:
            return f"source {self.ref}: nothing fetched yet"
        return None
