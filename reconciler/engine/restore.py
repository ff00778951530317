"""The last applied ruleset, read back from the state directory alone, and `apply --restore`.

`apply --restore` re-applies it at boot or after `nftables.service` flushed the ruleset,
with no source, network, manifest or node config read; watch starts from it while a new
revision is held. It refuses (RestoreRefused, changing nothing) when the record is missing
or damaged: a guess would put rules in the kernel that nobody applied.
"""

from __future__ import annotations

import sys
from typing import TextIO

from reconciler import logs
from reconciler.compile import Ruleset
from reconciler.engine.commits import append_commit
from reconciler.engine.confirm import pending_path, recover_locked
from reconciler.engine.lock import Lock, LockHeld
from reconciler.engine.plan import format_text, make_plan
from reconciler.engine.state import HistoryEntry, StateCorrupt, StateStore, namespace_dir
from reconciler.engine.sync import commit
from reconciler.engine.target import CommandError, Target, short_revision
from reconciler.engine.verify import slim_created, verify_listed
from reconciler.kernel import MayHaveCommitted, NftError, read_live

LOCK_WAIT = 10.0  # seconds a restore waits for a one-shot apply that holds the namespace's lock


class RestoreRefused(CommandError):
    """The state holds no intact last applied ruleset; the message says why and what to do."""


def last_applied(store: StateStore) -> tuple[HistoryEntry, Ruleset]:
    """The history entry and ruleset that status.json names as applied last.

    Never rebuilds or moves a damaged file (unlike read_status): a damaged state is
    reported as such and left for the operator to look at."""
    todo = (f"apply the manifests again (`nftrec apply DIR`), or let the watch daemon sync; "
            f"the state is in {store.dir}")
    try:
        status = store.status()
    except StateCorrupt as e:
        raise RestoreRefused(f"nothing restored: {e}; {todo}") from None
    if status.cleaned_up_at is not None:
        raise RestoreRefused(f"nothing restored: `nftrec cleanup` removed the tables on purpose at "
                             f"{status.cleaned_up_at}; {todo}")
    if status.desired_digest is None:
        raise RestoreRefused(f"nothing restored: no ruleset was ever applied with this state; {todo}")
    try:
        entries = store.history()
        for entry in reversed(entries):
            if entry.digest == status.desired_digest:
                return entry, store.load_ruleset(entry)
    except (StateCorrupt, FileNotFoundError) as e:
        raise RestoreRefused(f"nothing restored: {e}; {todo}") from None
    raise RestoreRefused(f"nothing restored: the last applied ruleset (digest {status.desired_digest[:12]}) "
                         f"is not in the history in {store.history_dir}; {todo}")


def _recorded(root, netns: str | None) -> list[tuple[StateStore, HistoryEntry, Ruleset]]:
    """Every table of the namespace's state with its last applied ruleset, all read before
    the kernel is touched; a table `nftrec cleanup` removed on purpose is left out. Any
    table's record missing or damaged refuses the whole restore."""
    tables = namespace_dir(root, netns) / "tables"
    names = sorted(p.name for p in tables.iterdir() if (p / "status.json").exists() or (p / "commits.jsonl").exists()
                   ) if tables.is_dir() else []
    found, cleaned = [], []
    for name in names:
        store = StateStore(root, netns=netns, table=name)
        try:
            if store.status().cleaned_up_at is not None:
                cleaned.append(name)
                continue
        except StateCorrupt:
            pass  # last_applied says so
        found.append((store, *last_applied(store)))
    if not found and not cleaned:
        raise RestoreRefused(f"nothing restored: the state in {tables.parent} records no applied ruleset "
                             f"(no table's status.json); apply the manifests first (`nftrec apply DIR`)")
    return found


def _lock(root, netns: str | None) -> Lock | None:
    """The namespace's lock, or None when a running watch holds it (it repairs by itself)."""
    store = StateStore(root, netns=netns)
    if not store.namespace_dir.is_dir():
        _recorded(root, netns)  # refuses: nothing is created for a state that never was
    try:
        return Lock(store.lock_path).acquire()
    except LockHeld as e:
        if e.cmdline and " watch " in f" {e.cmdline} ":
            return None
    try:  # a one-shot command: it ends soon
        return Lock(store.lock_path, timeout=LOCK_WAIT).acquire()
    except LockHeld as e:
        raise CommandError(str(e)) from None


def run_restore(root, netns: str | None, *, out_stream: TextIO = sys.stdout) -> int:
    """`apply --restore`: each recorded table's last applied ruleset back in the kernel, one
    transaction per table planned against the live table (nothing when it already matches),
    verified by a listing. Recorded as a commit of kind "restore" (no history entry: the
    ruleset is already there); status.json keeps its revision and attempts, and takes the
    kernel's new generation token. A running watch holds the lock and repairs by itself."""
    where = f"netns {netns}" if netns else "the host namespace"
    lock = _lock(root, netns)
    if lock is None:
        print(f"Nothing restored in {where}: the watch daemon holds its state and repairs the kernel itself.",
              file=out_stream)
        return 0
    try:
        found = _recorded(root, netns)
        if not found:
            print(f"Nothing to restore in {where}: `nftrec cleanup` removed nftrec's tables on purpose.",
                  file=out_stream)
            return 0
        nft = Target(netns, found[0][0].table, root).nft()
        try:
            for store, entry, ruleset in found:
                _restore_table(nft, Target(netns, store.table, root), store, entry, ruleset, out_stream)
        finally:
            if nft is not None:
                nft.close()
        return 0
    finally:
        lock.release()


def _restore_table(nft, target: Target, store: StateStore, entry: HistoryEntry, ruleset: Ruleset,
                   out_stream: TextIO) -> None:
    if pending_path(store).exists() and recover_locked(nft, store):  # an apply died in its confirm window
        entry, ruleset = last_applied(store)  # what its rollback left recorded
    shown = f"revision {short_revision(entry.revision)} (digest {entry.digest[:12]}, applied at {entry.applied_at})"
    plan = make_plan(ruleset, read_live(nft, target.table))
    if plan.empty:
        print(logs.escape(f"Nothing to restore: table {target.table} in {target.where} already holds {shown}; "
                          f"0 operations."), file=out_stream)
        return
    out_stream.write(format_text(plan, color=False))
    try:
        plan, _ = commit(nft, target.table, ruleset, slim_created(plan), {}, from_memory=None)
    except MayHaveCommitted as e:
        raise CommandError(f"the transaction may have committed: {e.text.strip()}; run `nftrec apply --restore` "
                           f"again, or `nftrec status` to see what the kernel holds") from None
    except NftError as e:
        raise CommandError(f"the kernel rejected the restore; nothing was changed. nft said:\n{e.text.strip()}",
                           lines=True) from None
    _after, token, fp = verify_listed(nft, target, ruleset)
    done = append_commit(store, revision=entry.revision, writer="nftrec apply --restore", kind="restore",
                         token=token, operations=len(plan.transaction), fingerprint=fp,
                         services=[f"{s.action}{s.service}" for s in plan.services])
    status = store.status()
    status.kernel_generation, status.live_fingerprint, status.commit_sequence = token, fp, done.sequence
    store.write_status(status)
    print(logs.escape(f"Restore complete: {len(plan.transaction)} operations in one transaction; {shown} is "
                      f"live again in {target.where}."), file=out_stream)
