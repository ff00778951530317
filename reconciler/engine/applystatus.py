"""One-shot `apply`'s status records: with the node config's `status.remote`, every outcome
(applied, refused, invalid, failed, rolled-back, held, halted) is queued durably in the
namespace's status queue, the one watch pushes from, and `send_queued` (cli.main, once the
command is done and its lock released) makes one attempt of at most SEND_BOUND seconds to
push what is queued. The push never changes apply's output or exit code: what is not sent
stays queued for the next apply or the watch. `start_status` turns reporting on for this process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from reconciler import clock, logs

# Seconds for the push before apply exits: one record is a fetch and a push of a few hundred
# bytes (about 0.4 s to a file:// remote or a local git daemon; ssh adds two handshakes),
# while an unreachable remote would hold apply for git's own 120 s (ssh's connect: 15 s).
SEND_BOUND = 5.0
LAST_FILE = "last-queued.json"  # in the queue directory: the outcome queued last, for repeats


@dataclass
class Reporter:
    """This process's node (its config) and namespace (its state store)."""

    target: object  # engine.Target
    node: object  # intake.NodeConfig
    channel: object = None  # statusrecords.StatusChannel, once a record was queued


_reporter: Reporter | None = None


def start_status(target, node):
    """`apply` reports its outcomes for `node` (the node config, returned) in `target`'s namespace."""
    global _reporter
    _reporter = Reporter(target, node)
    return node


def report(outcome: str, attempted: str | None, error: str = "", rollout=None) -> None:
    """Queue the outcome's record (no network; nothing unless `start_status` ran and the node config
    has status.remote). `rollout`: the revision's (it names the node's wave), else the wave
    of the last rollout decision (rollout.json). The same outcome of the same revision again
    is queued once per fullSyncPeriod, as watch does, so that a node applying from cron tells
    `fleet status` it is alive without a commit per run. Never raises."""
    r = _reporter
    settings = getattr(getattr(r, "node", None), "status", None)
    if settings is None or not settings.remote:
        return
    try:
        _queue(r, settings, outcome, attempted, error, rollout)
    except Exception as e:  # a status record never fails an apply
        logs.log.warning(f"cannot queue the status record ({outcome}): {e}")


def _queue(r: Reporter, settings, outcome: str, attempted: str | None, error: str, rollout) -> None:
    from reconciler.atomic import atomic_write
    from reconciler.engine.rollout import read_rollout_state, status_record
    from reconciler.engine.state import read_status
    from reconciler.engine.statusrecords import QUEUE_DIR, StatusChannel
    from reconciler.intake import identity_of

    store = r.target.store()
    now = clock.now()
    last_path = store.dir / QUEUE_DIR / LAST_FILE
    try:
        last = json.loads(last_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = None
    if isinstance(last, dict) and [last.get("outcome"), last.get("attempted")] == [outcome, attempted] and \
            isinstance(last.get("time"), (int, float)) and 0 <= now - last["time"] < r.node.full_sync_period:
        return
    wave = "" if rollout is not None else (read_rollout_state(store) or {}).get("wave") or ""
    record = status_record(identity_of(r.node), rollout, read_status(store).last_applied_revision, attempted,
                           outcome, error, wave=wave if isinstance(wave, str) else "")
    if r.channel is None:
        r.channel = StatusChannel(store.dir, settings)
    r.channel.enqueue(record)
    atomic_write(last_path, json.dumps({"outcome": outcome, "attempted": attempted, "time": now}).encode(), 0o600)


def send_queued(bound: float = SEND_BOUND) -> None:
    """The one bounded push before the process exits (module doc): a warning when records
    stay queued, never an error."""
    r = _reporter
    if r is None or r.channel is None:
        return
    try:
        sent, why = r.channel.flush(bound), None
    except Exception as e:  # an unwritable queue directory: the push never fails the apply
        sent, why = False, f"{type(e).__name__}: {e}"
    if not sent:
        why = why or r.channel.last_error or "another nftrec is pushing them"
        logs.log.warning(f"status records kept queued ({r.channel.pending}), the next apply or the watch sends "
                         f"them: {why}")
