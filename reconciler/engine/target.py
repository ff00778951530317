"""Where a command acts (a network namespace, a table, a state directory), and the error
every command reports to the user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reconciler.engine.lock import Lock, LockHeld
from reconciler.engine.state import StateStore
from reconciler.kernel import Interface, Libnftables, NftError


def short_revision(revision: str | None) -> str:
    """A revision for one-line messages: each git commit or sha256 digest in it (a commit,
    `sha256:<digest>`, `<commit>+dirty:sha256:<digest>`, `main@sha1:<commit>`) cut to 12."""
    if not revision:
        return "-"
    return re.sub(r"[0-9a-f]{40,}", lambda m: m.group(0)[:12], revision)


class CommandError(Exception):
    """A failure with a message for the user (what, where, what to do); exit 1.
    `lines=True`: the message carries another tool's multi-line output (nft's error),
    printed with its line breaks (logs.escape_lines); else it is printed as one line."""

    def __init__(self, message: str, *, lines: bool = False):
        super().__init__(message)
        self.lines = lines


@dataclass
class Target:
    """Where a command acts: a network namespace (None: the host), a table, a state dir."""

    netns: str | None
    table: str
    state_root: Path

    @property
    def where(self) -> str:
        return f"netns {self.netns}" if self.netns else "the host namespace"

    def store(self) -> StateStore:
        return StateStore(self.state_root, netns=self.netns, table=self.table)

    def lock(self) -> Lock:
        return Lock(self.store().lock_path)

    def hold_lock(self) -> Lock:
        """The namespace's lock, acquired (the caller releases it); when another nftrec
        holds it, a CommandError that says who."""
        try:
            return self.lock().acquire()
        except LockHeld as e:
            raise CommandError(str(e)) from None

    def nft(self) -> Interface:
        try:
            return Libnftables(self.netns)
        except NftError as e:
            raise CommandError(str(e)) from None
