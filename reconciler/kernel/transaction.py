"""The Transaction builder: an ordered list of nft commands, run as one kernel transaction.

Modelled on knftables' Transaction. Every command text comes from compile's `*_cmd`
functions, so the builder and the compiler never disagree on nft's syntax.
"""

from __future__ import annotations

import itertools

from reconciler.compile import (
    Chain,
    Element,
    NamedSet,
    Rule,
    Table,
    chain_cmd,
    element_cmd,
    rule_cmd,
    set_cmd,
    table_cmd,
)


class Transaction:
    """An ordered list of nft commands, run as one atomic kernel transaction.

    Every method appends exactly one command (= one operation, as kube-proxy counts them).
    """

    def __init__(self) -> None:
        self._ops: list[str] = []

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self):
        return iter(self._ops)

    def __repr__(self) -> str:
        return f"<Transaction {len(self)} ops>"

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self._ops)

    def text(self) -> str:
        """The `nft -f` script (one command per line)."""
        return "".join(op + "\n" for op in self._ops)

    def script(self) -> bytes:
        """text() as the bytes libnftables reads, built with one join (small transactions;
        big ones are streamed to a file instead: `write`)."""
        return "\n".join(itertools.chain(self._ops, ("",))).encode()

    def size(self) -> int:
        """len(script()) without building it."""
        return sum(len(op.encode()) if not op.isascii() else len(op) for op in self._ops) + len(self._ops)

    def write(self, f) -> None:
        """Stream script() into the binary file `f`, a few hundred commands at a time, so
        no copy of the whole script (megabytes for a big table) is ever in memory."""
        ops = self._ops
        for i in range(0, len(ops), 512):
            f.write("".join(op + "\n" for op in ops[i : i + 512]).encode())

    def raw(self, command: str) -> Transaction:
        """Append an already formatted command (must come from ruleset.py's *_cmd)."""
        if "\n" in command:
            raise ValueError("one command per operation")
        self._ops.append(command)
        return self

    def extend(self, other: Transaction) -> Transaction:
        self._ops.extend(other._ops)
        return self

    # Objects are the ruleset.py dataclasses; flush/delete only use their names, so
    # `Chain("x")` / the live NamedSet are fine there. Elements need their set.
    def add(self, family: str, table: str, obj, *, set: NamedSet | None = None) -> Transaction:
        return self._verb("add", family, table, obj, set)

    def flush(self, family: str, table: str, obj) -> Transaction:
        if not isinstance(obj, (Chain, NamedSet)):
            raise TypeError(f"cannot flush {type(obj).__name__}")
        return self._verb("flush", family, table, obj, None)

    def delete(self, family: str, table: str, obj, *, set: NamedSet | None = None) -> Transaction:
        return self._verb("delete", family, table, obj, set)

    def add_rule(self, family: str, table: str, chain: str, rule: Rule) -> Transaction:
        return self.raw(rule_cmd(family, table, chain, rule))

    def add_table(self, table: Table) -> Transaction:
        return self.raw(table_cmd("add", table))

    def delete_table(self, family: str, name: str) -> Transaction:
        return self.raw(table_cmd("delete", Table(family, name)))

    def _verb(self, verb: str, family: str, table: str, obj, set_: NamedSet | None) -> Transaction:
        if isinstance(obj, Table):
            return self.raw(table_cmd(verb, obj))
        if isinstance(obj, Chain):
            return self.raw(chain_cmd(verb, family, table, obj))
        if isinstance(obj, NamedSet):
            return self.raw(set_cmd(verb, family, table, obj))
        if isinstance(obj, Element):
            if set_ is None:
                raise TypeError("an element needs its set: set=NamedSet")
            return self.raw(element_cmd(verb, family, table, set_, obj))
        raise TypeError(f"not an nft object: {obj!r}")


_ELEMENTS = " elements = { "
_ELEMENT_VERBS = ("add element ", "delete element ")


def canonical_ops(ops) -> list[str]:
    """The commands of a transaction in a form where only the order nft obeys remains:
    two transactions with equal forms leave the kernel alike. The elements a declaration
    lists (`… elements = { a , b } ; }`) are sorted, and so is each run of consecutive
    element commands of one verb (adding, or deleting, elements commutes; across verbs,
    or around any other command, the order stays as it is)."""
    out: list[str] = []
    run: list[str] = []
    verb = None
    for op in ops:
        i = op.find(_ELEMENTS)
        if i >= 0 and op.endswith(" } ; }"):
            items = op[i + len(_ELEMENTS):-len(" } ; }")].split(" , ")
            op = op[: i + len(_ELEMENTS)] + " , ".join(sorted(items)) + " } ; }"
        this = next((v for v in _ELEMENT_VERBS if op.startswith(v)), None)
        if this != verb or this is None:
            out.extend(sorted(run))
            run = []
        verb = this
        (run if this is not None else out).append(op)
    out.extend(sorted(run))
    return out
