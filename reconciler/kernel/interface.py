"""The kernel seam, as knftables has it: `Interface` and its errors.

The engine and the daemon hold an `Interface` and nothing else: `Libnftables` is the real
kernel, `Fake` an in-memory one for unit tests. A `Transaction` is the unit of change.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from reconciler.compile import NamedSet
from reconciler.kernel.transaction import Transaction

T = TypeVar("T")

PERMISSION_HINT = ("nftrec needs CAP_NET_ADMIN in the network namespace it acts on "
                   "(and CAP_SYS_ADMIN to enter one given by --netns): run it as root")


class NftError(RuntimeError):
    """nft refused a command; `text` is nft's own error output (what and where)."""

    def __init__(self, text: str, script: str | None = None):
        super().__init__(text.strip() or "nft failed without an error message")
        self.text = text
        self.script = script


class NotFound(NftError):
    """ENOENT: the table/chain/set/element the command names does not exist."""


class Crashed(NftError):
    """libnftables crashed or hung in the child process that ran the command (reading a
    table that a newer nft wrote, say): this says nothing about the command itself."""


class MayHaveCommitted(Crashed):
    """The child that ran a commit died after the ruleset generation moved: the commit may
    have reached the kernel (or another process committed meanwhile). Unlike any other
    NftError, the previous ruleset may be gone: list before trusting either."""


def error_for(text: str, script: str | None = None) -> NftError:
    """The NftError for nft's error text (knftables.IsNotFound matches the same strerror)."""
    if "No such file or directory" in text:
        return NotFound(text, script)
    if "Operation not permitted" in text:
        return NftError(f"{text.strip()}\n{PERMISSION_HINT}", script)
    return NftError(text, script)


class Interface(Protocol):
    """Everything the engine and the daemon do with the kernel of one network namespace."""

    def run(self, tx: Transaction) -> None:
        """Commit `tx` as one kernel transaction: all of it or (on NftError) none."""

    def check(self, tx: Transaction) -> None:
        """Dry run: raise NftError if the kernel would refuse `tx`; change nothing."""

    def run_script(self, script: str) -> None:
        """Run an `nft -f` script as one transaction (a confirmed apply's rollback restores
        listings, which are blocks, not the one command per line of a Transaction)."""

    def list_table(self, family: str, table: str) -> str | None:
        """nft's text listing of one table (numeric priorities/times), None if absent.
        Text, not JSON: nft 1.0.6's JSON listing drops table and chain comments and the
        `dynamic` set flag, so the text form is the only complete one."""

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        """nft's text listing of just these chains and sets (a NamedSet says set or map) of
        one table, as `table … { … }` blocks; None if any of them is absent. Costs what
        the objects cost, not the whole table (nft fills its cache per object)."""

    def list_tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table in the namespace."""

    def generation(self) -> int | None:
        """The ruleset generation id (bumped by every committed transaction), or None."""

    def netns_cookie(self) -> int | None:
        """The namespace's identity for this boot (never reused), or None if unknown."""

    def version(self) -> str | None:
        """The nftables library's version, if it tells."""

    def in_namespace(self, fn: Callable[[], T]) -> T:
        """Run `fn` inside this object's network namespace (e.g. address discovery)."""

    def close(self) -> None:
        """Release the kernel handle; the object is unusable afterwards."""
