"""The last applied ruleset, read back from the state directory alone.

`apply --restore` re-applies it at boot or after `nftables.service` flushed the ruleset,
with no source, network or manifest read; watch starts from it while a new revision is
held. It refuses (RestoreRefused, changing nothing) when the record is missing or damaged:
a guess would put rules in the kernel that nobody applied.
"""

from __future__ import annotations

from reconciler.engine.state import HistoryEntry, StateCorrupt, StateStore
from reconciler.engine.target import CommandError
from reconciler.compile import Ruleset


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
