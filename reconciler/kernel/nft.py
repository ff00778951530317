"""The nftables access layer: one narrow interface, a transaction builder, a fake.

Pipeline position: diff → **transaction** → apply (and live.py reads through it).

Modelled on kubernetes-sigs/knftables: callers build a `Transaction` (an ordered list of
nft command texts, all made by ruleset.py's `*_cmd` functions) and hand it to an
`Interface`, which runs it as ONE kernel transaction (`run`), dry-runs it (`check`), or
lists one of our tables. `Libnftables` talks to the kernel in-process through ctypes;
`Fake` keeps an in-memory model for unit tests.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import errno
import itertools
import os
import queue
import re
import shlex
import socket
import struct
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

from reconciler import logs
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
from reconciler.heap import trim_heap

T = TypeVar("T")


# --- errors --------------------------------------------------------------------------------


class NftError(RuntimeError):
    """nft refused a command; `text` is nft's own error output (what and where)."""

    def __init__(self, text: str, script: str | None = None):
        super().__init__(text.strip() or "nft failed without an error message")
        self.text = text
        self.script = script


class NotFound(NftError):
    """ENOENT: the table/chain/set/element the command names does not exist."""


PERMISSION_HINT = ("nftrec needs CAP_NET_ADMIN in the network namespace it acts on "
                   "(and CAP_SYS_ADMIN to enter one given by --netns): run it as root")


def _error_for(text: str, script: str | None = None) -> NftError:
    # knftables.IsNotFound matches the same strerror text.
    if "No such file or directory" in text:
        return NotFound(text, script)
    if "Operation not permitted" in text:
        return NftError(f"{text.strip()}\n{PERMISSION_HINT}", script)
    return NftError(text, script)


# --- transaction ---------------------------------------------------------------------------


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
        no copy of the whole script is ever in memory (~10 MB at 10,000 Services)."""
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


# --- the interface -------------------------------------------------------------------------


class Interface(Protocol):
    def run(self, tx: Transaction) -> None:
        """Commit `tx` as one kernel transaction: all of it or (on NftError) none."""

    def check(self, tx: Transaction) -> None:
        """Dry run: raise NftError if the kernel would refuse `tx`; change nothing."""

    def list_table(self, family: str, table: str) -> str | None:
        """nft's text listing of one table (numeric priorities/times), None if absent.

        Text, not JSON: nft 1.0.6's JSON listing drops table and chain comments and the
        `dynamic` set flag, so the text form is the only complete one (see live.py).
        """

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        """nft's text listing of just these chains and sets (by name; a NamedSet says set or
        map) of one table, as `table … { … }` blocks; None if any of them is absent. Costs
        what the objects cost, not the whole table (nft fills its cache per object)."""

    def list_tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table in the namespace."""

    def generation(self) -> int | None:
        """The ruleset generation id (bumped by every committed transaction), or None."""


# --- libnftables through ctypes ------------------------------------------------------------

# enum nft_output_flags (nftables/libnftables.h)
_OUT_HANDLE = 1 << 3
_OUT_JSON = 1 << 4
_OUT_NUMERIC_PRIO = 1 << 8
_OUT_NUMERIC_TIME = 1 << 10
_LIST_FLAGS = _OUT_NUMERIC_PRIO | _OUT_NUMERIC_TIME  # `priority -110`, `timeout 10800s`

_CLONE_NEWNET = 0x40000000
_lib: ctypes.CDLL | None = None
# A command whose script or output is this big is a big one (a cold or full-sync
# transaction, a listing of a big table). Afterwards its context is replaced and the C
# heap trimmed: nft keeps what it listed or declared in the context's cache (~190 MB
# after listing a 10,000-Service table) until the next command needs another cache,
# and what it frees stays in the worker thread's malloc arena (~250 MB after a cold
# 10,000-Service transaction) unless trimmed. A new context costs < 1 ms.
_TRIM_AFTER = 1 << 20


def _load_lib() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise NftError(
            f"cannot load libnftables ({name}): {e}; install the nftables package "
            "(Debian/Ubuntu: apt-get install nftables libnftables1)"
        ) from None
    vp, ci, cu, cs = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
    for fname, restype, argtypes in (
        ("nft_ctx_new", vp, [ci]),
        ("nft_ctx_free", None, [vp]),
        ("nft_ctx_buffer_output", ci, [vp]),
        ("nft_ctx_buffer_error", ci, [vp]),
        ("nft_ctx_get_output_buffer", cs, [vp]),
        ("nft_ctx_get_error_buffer", cs, [vp]),
        ("nft_ctx_output_set_flags", None, [vp, cu]),
        ("nft_ctx_set_dry_run", None, [vp, ctypes.c_bool]),
        ("nft_run_cmd_from_buffer", ci, [vp, cs]),
        ("nft_run_cmd_from_filename", ci, [vp, cs]),
    ):
        fn = getattr(lib, fname)
        fn.restype, fn.argtypes = restype, argtypes
    _lib = lib
    return lib


class NamespaceThread:
    """One dedicated thread; with a netns it moves itself into it before anything else.

    Network namespaces are per thread on Linux, so only this thread (and the sockets it
    opens, e.g. libnftables' netlink socket) ever sees the namespace; the caller's thread
    — the host namespace — is never switched. A missing namespace is an error, never
    created (unlike pyroute2.netns.setns' default O_CREAT).
    """

    def __init__(self, netns: str | None):
        self._q: queue.Queue = queue.Queue()
        ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=self._main, args=(netns, ready), name=f"nft-{netns or 'host'}", daemon=True
        )
        self._thread.start()
        err = ready.get()
        if err is not None:
            raise err

    @staticmethod
    def _enter(netns: str) -> None:
        path = netns if netns.startswith("/") else f"/run/netns/{netns}"
        if not netns.startswith("/") and ("/" in netns or netns in (".", "..")):
            raise NftError(f"bad network namespace name {netns!r}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NftError(
                f"network namespace {netns!r} does not exist ({path}); create it with "
                f"`ip netns add {netns}`"
            ) from None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                hint = f"; {PERMISSION_HINT}" if e == errno.EPERM else ""
                raise NftError(f"cannot enter network namespace {netns!r}: {os.strerror(e)}{hint}")
        finally:
            os.close(fd)

    def _main(self, netns: str | None, ready: queue.Queue) -> None:
        try:
            if netns is not None:
                self._enter(netns)
        except BaseException as e:  # report to the constructor, then end the thread
            ready.put(e)
            return
        ready.put(None)
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box.append((True, fn()))
            except BaseException as e:
                box.append((False, e))
            done.set()

    def call(self, fn: Callable[[], T]) -> T:
        return self.submit(fn)()

    def submit(self, fn: Callable[[], T]) -> Callable[[], T]:
        """Queue `fn` on the thread now; the returned function waits for its result (or
        raises its exception). The caller's thread runs on meanwhile: a listing spends
        its time in libnftables and the kernel, outside the GIL."""
        if not self._thread.is_alive():
            raise NftError("the nft worker thread is closed")
        box: list = []
        done = threading.Event()
        self._q.put((fn, box, done))

        def wait() -> T:
            done.wait()
            ok, value = box[0]
            if ok:
                return value
            raise value
        return wait

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()


class Libnftables:
    """The real kernel, through libnftables in-process (no `nft` subprocess).

    `netns`: name under /run/netns (as `ip netns add` makes) or a path; everything this
    object does happens inside that namespace.
    """

    def __init__(self, netns: str | None = None):
        self.netns = netns
        self._lib = _load_lib()
        self._worker = NamespaceThread(netns)
        self._ctx = self._worker.call(self._new_ctx)
        self._nl: socket.socket | None = None
        self._seq = 0
        self._cookie: int | None = None  # the worker's namespace's, once read (netns_cookie)

    # Runs on the worker thread only.
    def in_namespace(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker thread, i.e. inside this object's network namespace
        (e.g. pyroute2 address discovery for the node config)."""
        return self._worker.call(fn)

    def _new_ctx(self):
        ctx = self._lib.nft_ctx_new(0)
        if not ctx:
            raise NftError("nft_ctx_new failed")
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)
        return ctx

    def _cmd(self, script: str | bytes, flags: int = 0, dry_run: bool = False) -> str:
        buf = script if isinstance(script, bytes) else script.encode()
        # c_char_p: passed without a copy (nft makes two: its own and the scanner's)
        return self._nft(lambda ctx: self._lib.nft_run_cmd_from_buffer(ctx, buf), len(buf), flags, dry_run,
                         lambda: script if isinstance(script, str) else script.decode(errors="replace"))

    def _cmd_file(self, fd: int, size: int, dry_run: bool, text: Callable[[], str]) -> str:
        """Run the script in the open file `fd`. nft's scanner reads a file in 16 KiB
        pieces, while a buffer is copied twice first: a cold 10,000-Service transaction
        peaks ~20 MB lower this way (and without our own ~10 MB copy of the script).
        nft reopens the file by this name to quote a failing line (the right one, unlike
        with a buffer, where nft 1.0.6 quotes the script's first line)."""
        path = f"/proc/self/fd/{fd}"
        return self._nft(lambda ctx: self._lib.nft_run_cmd_from_filename(ctx, path.encode()), size, 0, dry_run,
                         text, where=path)

    def _nft(self, call: Callable, size: int, flags: int, dry_run: bool, text: Callable[[], str],
             where: str | None = None) -> str:
        lib, ctx = self._lib, self._ctx
        lib.nft_ctx_output_set_flags(ctx, flags)
        lib.nft_ctx_set_dry_run(ctx, dry_run)
        try:
            rc = call(ctx)
        finally:
            lib.nft_ctx_set_dry_run(ctx, False)
        # Reading a buffer also resets it for the next command.
        out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        if size + len(out) >= _TRIM_AFTER:
            self._renew_ctx()
            trim_heap()
        if rc != 0:
            if where is not None:  # "/proc/self/fd/7:3:39-45: Error: ..." -> "transaction line 3:39-45: ..."
                err = err.replace(f"{where}:", "transaction line ")
            raise _error_for(err or out, text())
        return out

    def _renew_ctx(self) -> None:
        """Replace the context (see _TRIM_AFTER): nft's cache goes with the old one. The new
        one is made first, so a failure keeps the old."""
        new = self._new_ctx()
        old, self._ctx = self._ctx, new
        self._lib.nft_ctx_free(old)

    def close(self) -> None:
        if self._ctx:
            ctx, self._ctx = self._ctx, None

            def free():
                self._lib.nft_ctx_free(ctx)
                if self._nl is not None:
                    self._nl.close()

            self._worker.call(free)
        self._worker.close()

    def __enter__(self) -> Libnftables:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- Interface

    def run(self, tx: Transaction) -> None:
        self._run(tx, dry_run=False)

    def check(self, tx: Transaction) -> None:
        self._run(tx, dry_run=True)

    def _run(self, tx: Transaction, *, dry_run: bool) -> None:
        if not len(tx):
            return
        size = tx.size()
        if size < _TRIM_AFTER:  # watch's edits: from memory, no file, no trim
            script = tx.script()
            self._worker.call(lambda: self._cmd(script, dry_run=dry_run))
            return
        f = None
        try:
            f = tempfile.TemporaryFile(prefix="nftrec-transaction-")  # unlinked: nothing left on kill -9
            tx.write(f)
            f.flush()
            os.stat(f"/proc/self/fd/{f.fileno()}")  # the name nft opens (no /proc: from memory)
        except OSError as e:
            if f is not None:
                f.close()
            logs.log.debug(f"no temporary file for the transaction ({e}); handing it to nft from memory")
            script = tx.script()
            trim_heap()
            self._worker.call(lambda: self._cmd(script, dry_run=dry_run))
            return
        with f:
            trim_heap()  # before nft's own peak (see _TRIM_AFTER)
            self._worker.call(lambda: self._cmd_file(f.fileno(), size, dry_run, tx.text))

    def run_script(self, script: str) -> None:
        """Run an `nft -f` script as one transaction (a confirmed apply's rollback restores
        listings, which are blocks, not the one-command-per-line of a Transaction)."""
        self._worker.call(lambda: self._cmd(script))

    def list_table(self, family: str, table: str) -> str | None:
        return self.list_table_later(family, table)()

    def list_table_later(self, family: str, table: str) -> Callable[[], str | None]:
        """list_table, started now on the worker thread; the returned function waits for
        the listing (`plan --refresh` lists while it reads the manifests)."""
        cmd = table_cmd("list", Table(family, table))

        def listing() -> str | None:
            try:
                return self._cmd(cmd, _LIST_FLAGS)
            except NotFound:
                return None
        return self._worker.submit(listing)

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        cmds = [chain_cmd("list", family, table, Chain(c)) for c in chains]
        cmds += [set_cmd("list", family, table, st) for st in sets]
        # One command per object: in one batch, nft 1.0.6 narrows its cache to the sets
        # named and then prints a rule's anonymous map as nothing (`meta l4proto tcp`).
        try:
            return self._worker.call(lambda: "".join(self._cmd(c, _LIST_FLAGS) for c in cmds))
        except NotFound:
            return None

    def list_table_json(self, family: str, table: str) -> dict | None:
        """The JSON listing (incomplete in nft 1.0.6: no table/chain comments)."""
        import json

        cmd = table_cmd("list", Table(family, table))
        try:
            return json.loads(self._worker.call(lambda: self._cmd(cmd, _OUT_JSON)))
        except NotFound:
            return None

    def version(self) -> str | None:
        """libnftables' own version, from the JSON listing's metainfo (for `doctor`)."""
        import json

        doc = json.loads(self._worker.call(lambda: self._cmd("list tables", _OUT_JSON)))
        for item in doc.get("nftables", []):
            if "metainfo" in item:
                return item["metainfo"].get("version")
        return None

    def list_tables(self) -> list[tuple[str, str]]:
        # NFT_MSG_GETTABLE dump over raw netlink: `nft list tables` fills nft's whole
        # cache first (2.9 s with 10,000 Services), the dump takes microseconds.
        out = []
        for mtype, data, off, length in self._worker.call(lambda: self._nl_request(1, dump=True)):
            if mtype != (10 << 8) | 0:  # NFT_MSG_NEWTABLE
                continue
            fam = _FAMILY_NAMES.get(data[off + 16], str(data[off + 16]))
            name = _nl_attr(data, off, length, 1)  # NFTA_TABLE_NAME
            if name is not None:
                out.append((fam, name.rstrip(b"\0").decode()))
        return out

    def generation(self) -> int | None:
        # NFT_MSG_GETGEN: libnftables does not expose the generation id (it is in no
        # listing, JSON metainfo included), so ask the kernel directly.
        msgs = self._worker.call(lambda: self._nl_request(16))
        for mtype, data, off, length in msgs:
            if mtype == (10 << 8) | 15:  # NFT_MSG_NEWGEN
                gen = _nl_attr(data, off, length, 1)  # NFTA_GEN_ID, big-endian u32
                if gen is not None:
                    return struct.unpack(">I", gen[:4])[0]
        raise NftError("NFT_MSG_GETGEN: no generation id in the kernel's answer")

    def netns_cookie(self) -> int | None:
        """The namespace's SO_NETNS_COOKIE (Linux >= 5.14): unique for the boot and never
        reused, unlike a namespace's inode number, which a namespace deleted and re-created
        under the same name often gets back. None where the kernel lacks it. Read once:
        the worker thread never leaves its namespace (a watch sync asked every time, a
        netlink socket opened and closed on the worker per token)."""
        if self._cookie is not None:
            return self._cookie

        def cookie() -> int | None:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12) as s:
                try:
                    return struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, 71, 8))[0]  # SO_NETNS_COOKIE
                except OSError:
                    return None

        self._cookie = self._worker.call(cookie)
        return self._cookie

    def _nl_request(self, cmd: int, dump: bool = False) -> list[tuple[int, bytes, int, int]]:
        """One nf_tables netlink request on the worker thread (so inside the namespace);
        returns (type, buffer, offset, length) of each answer message."""
        if self._nl is None:
            self._nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
            self._nl.bind((0, 0))
        self._seq += 1
        flags = 1 | (0x300 if dump else 0)  # NLM_F_REQUEST [| NLM_F_DUMP]
        req = struct.pack("=IHHII", 20, (10 << 8) | cmd, flags, self._seq, 0)  # NFNL_SUBSYS_NFTABLES
        req += struct.pack("=BBH", socket.AF_UNSPEC, 0, 0)  # nfgenmsg
        self._nl.send(req)
        msgs = []
        while True:
            data = self._nl.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if seq == self._seq:
                    if mtype == 3:  # NLMSG_DONE
                        return msgs
                    if mtype == 2:  # NLMSG_ERROR
                        (err,) = struct.unpack_from("=i", data, off + 16)
                        if err:
                            what = _NL_REQUESTS.get(cmd, f"nf_tables netlink request {cmd}")
                            hint = f"; {PERMISSION_HINT}" if -err == errno.EPERM else ""
                            raise NftError(f"{what} failed: {os.strerror(-err)}{hint}")
                    else:
                        msgs.append((mtype, data, off, length))
                        if not dump:
                            return msgs
                off += (length + 3) & ~3


_NL_REQUESTS = {1: "listing the nftables tables (NFT_MSG_GETTABLE)",
                16: "reading the nftables ruleset generation (NFT_MSG_GETGEN)"}
_FAMILY_NAMES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}


def _nl_attr(data: bytes, off: int, length: int, want: int) -> bytes | None:
    """Payload of attribute `want` in the nfnetlink message at `off` (after nfgenmsg)."""
    a = off + 20
    while a + 4 <= off + length:
        alen, atype = struct.unpack_from("=HH", data, a)
        if alen < 4:
            break
        if atype & 0x7FFF == want:
            return data[a + 4 : a + alen]
        a += (alen + 3) & ~3
    return None


# --- the fake ------------------------------------------------------------------------------


@dataclass
class _FChain:
    base: str | None  # "type filter hook input priority 0" or None
    comment: str | None
    rules: list[str] = field(default_factory=list)


@dataclass
class _FSet:
    kind: str  # "set" | "map"
    spec: dict  # "type", "flags", "timeout", "comment" (raw texts)
    elements: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)  # key -> (comment, value)


@dataclass
class _FTable:
    comment: str | None
    chains: dict[str, _FChain] = field(default_factory=dict)
    sets: dict[str, _FSet] = field(default_factory=dict)


_REF_CHAIN = re.compile(r"\b(?:goto|jump)\s+([^\s,}]+)")
_REF_SET = re.compile(r"@([^\s,}]+)")
_COMMENT_TAIL = re.compile(r'\s+comment\s+"([^"]*)"$')


class Fake:
    """In-memory nftables for unit tests: parses exactly the command shapes ruleset.py
    writes, fails like the kernel on missing/busy objects, and lists in nft's text format.

    `run` is atomic: it applies to a deep copy and swaps only on success.
    """

    def __init__(self) -> None:
        self.tables: dict[tuple[str, str], _FTable] = {}
        self.gen = 0
        self.runs: list[Transaction] = []  # every successful transaction, for assertions

    # -- Interface

    def run(self, tx: Transaction) -> None:
        if not len(tx):
            return
        state = copy.deepcopy(self.tables)
        for i, op in enumerate(tx):
            try:
                self._apply(state, op)
            except NftError as e:
                raise type(e)(f"Error: {e.text}\n{op}\n(transaction op {i + 1})", tx.text()) from None
        self.tables = state
        self.gen += 1
        self.runs.append(tx)

    def check(self, tx: Transaction) -> None:
        state = copy.deepcopy(self.tables)
        for op in tx:
            self._apply(state, op)

    def list_tables(self) -> list[tuple[str, str]]:
        return list(self.tables)

    def generation(self) -> int | None:
        return self.gen

    def list_table(self, family: str, table: str) -> str | None:
        return self._listing(family, table)

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        t = self.tables.get((family, table))
        names = [st.name for st in sets]
        if t is None or any(c not in t.chains for c in chains) or any(n not in t.sets for n in names):
            return None
        if not chains and not names:
            return ""
        return self._listing(family, table, set(chains), set(names))

    def _listing(self, family: str, table: str, chains: set[str] | None = None,
                 sets: set[str] | None = None) -> str | None:
        """nft's text form of one table; with `chains`/`sets`, only those objects (as one
        block: a parser cannot tell that apart from nft's block per object)."""
        t = self.tables.get((family, table))
        if t is None:
            return None
        whole = chains is None and sets is None
        out = [f"table {family} {table} {{"]
        if t.comment and whole:
            out.append(f'\tcomment "{t.comment}"')
        for name, s in t.sets.items():
            if not whole and name not in (sets or ()):
                continue
            out.append(f"\t{s.kind} {name} {{")
            if "typeof" in s.spec:
                out.append(f"\t\ttypeof {s.spec['typeof']}")
            else:
                out.append(f"\t\ttype {s.spec['type']}")
            for k in ("flags", "timeout"):
                if s.spec.get(k):
                    out.append(f"\t\t{k} {s.spec[k]}")
            if s.spec.get("comment"):
                out.append(f'\t\tcomment "{s.spec["comment"]}"')
            if s.elements:
                elems = []
                for key, (comment, value) in s.elements.items():
                    e = key + (f' comment "{comment}"' if comment else "")
                    elems.append(e + (f" : {value}" if value is not None else ""))
                out.append("\t\telements = { " + ",\n\t\t\t     ".join(elems) + " }")
            out.append("\t}")
            out.append("")
        for name, c in t.chains.items():
            if not whole and name not in (chains or ()):
                continue
            out.append(f"\tchain {name} {{")
            if c.base:
                out.append(f"\t\t{c.base}; policy accept;")
            if c.comment:
                out.append(f'\t\tcomment "{c.comment}"')
            out.extend(f"\t\t{r}" for r in c.rules)
            out.append("\t}")
            out.append("")
        if out[-1] == "":
            out.pop()
        out.append("}")
        return "\n".join(out) + "\n"

    # -- the command interpreter

    @staticmethod
    def _apply(tables: dict[tuple[str, str], _FTable], op: str) -> None:
        m = re.match(r"(add|flush|delete) (table|chain|rule|set|map|element) (ip6?) (\S+)\s*(.*)$", op)
        if not m:
            raise NftError(f"syntax error (the fake knows only nftrec's shapes): {op}")
        verb, kind, family, tname, rest = m.groups()
        key = (family, tname)
        if kind == "table":
            if verb == "add":
                c = re.search(r'comment "([^"]*)"', rest)
                if key not in tables:
                    tables[key] = _FTable(c.group(1) if c else None)
                elif c:
                    tables[key].comment = c.group(1)
            elif key not in tables:
                raise NotFound("No such file or directory")
            elif verb == "delete":
                del tables[key]
            else:
                t = tables[key]
                for ch in t.chains.values():
                    ch.rules.clear()
                for s in t.sets.values():
                    s.elements.clear()
            return
        t = tables.get(key)
        if t is None:
            raise NotFound("No such file or directory")
        name, _, rest = rest.partition(" ")
        if kind == "chain":
            Fake._chain(t, verb, name, rest)
        elif kind == "rule":
            Fake._rule(t, name, rest)
        elif kind in ("set", "map"):
            Fake._set(t, verb, kind, name, rest)
        else:
            Fake._element(t, verb, name, rest)

    @staticmethod
    def _refs(t: _FTable, text: str) -> None:
        # The kernel resolves jump/goto targets and @set references when a rule or
        # element is added: a missing one is ENOENT.
        for target in _REF_CHAIN.findall(text):
            if target not in t.chains:
                raise NotFound("No such file or directory")
        for s in _REF_SET.findall(text):
            if s not in t.sets:
                raise NotFound("No such file or directory")

    @staticmethod
    def _used(t: _FTable, chain: str) -> bool:
        pat = re.compile(r"\b(?:goto|jump)\s+" + re.escape(chain) + r"(?=[\s,}]|$)")
        for name, c in t.chains.items():
            if name != chain and any(pat.search(r) for r in c.rules):
                return True
        return any(v and pat.search(v) for s in t.sets.values() for _, v in s.elements.values())

    @staticmethod
    def _chain(t: _FTable, verb: str, name: str, rest: str) -> None:
        if verb == "add":
            base = comment = None
            # `{ type … ; }`, `{ comment "…" ; }`, then rules (ruleset.chain_rules_cmd);
            # no rule body or comment holds a `;` (ruleset.check_rule_body, check_comment)
            rest = rest.strip()
            stmts = [x.strip() for x in rest[1:-1].split(";")] if rest.startswith("{") else []
            stmts = [x for x in stmts if x]
            if stmts and stmts[0].startswith("type "):
                base = stmts.pop(0)
            elif stmts and stmts[0].startswith("comment "):
                comment = re.match(r'comment "([^"]*)"', stmts.pop(0)).group(1)
            old = t.chains.get(name)
            if old is None:
                t.chains[name] = _FChain(base, comment)
            elif base is not None and old.base is None:
                raise NftError("File exists")  # a regular chain cannot become a base chain
            elif base is not None and old.base != base:
                raise NftError("Operation not supported")  # hooks cannot change in place
            elif comment:
                old.comment = comment
            for body in stmts:
                Fake._rule(t, name, body)
            return
        c = t.chains.get(name)
        if c is None:
            raise NotFound("No such file or directory")
        if verb == "flush":
            c.rules.clear()
        else:  # kernel >= 6.x deletes the chain's own rules; refused while referenced
            if Fake._used(t, name):
                raise NftError("Device or resource busy")
            del t.chains[name]

    @staticmethod
    def _rule(t: _FTable, chain: str, body: str) -> None:
        c = t.chains.get(chain)
        if c is None:
            raise NotFound("No such file or directory")
        Fake._refs(t, body)
        c.rules.append(body)

    @staticmethod
    def _set(t: _FTable, verb: str, kind: str, name: str, rest: str) -> None:
        if verb == "add":
            spec = {}
            elements = None
            for part in rest.strip().strip("{}").split(";"):
                part = part.strip()
                if part.startswith("elements = {"):  # set_elements_cmd: elements in the declaration
                    elements = part[len("elements = {"):].rstrip().rstrip("}").split(",")
                elif part:
                    k, _, v = part.partition(" ")
                    spec[k] = v.strip('"') if k == "comment" else v
            old = t.sets.get(name)
            if old is None:
                t.sets[name] = _FSet(kind, spec)
            elif old.kind != kind or any(old.spec.get(k) != spec.get(k) for k in ("type", "typeof", "flags", "timeout")):
                raise NftError("File exists")  # a definition cannot change in place
            for e in elements or ():
                Fake._element(t, "add", name, "{ " + e.strip() + " }")
            return
        s = t.sets.get(name)
        if s is None or s.kind != kind:
            raise NotFound("No such file or directory")
        if verb == "flush":
            s.elements.clear()
            return
        ref = re.compile(r"@" + re.escape(name) + r"(?=[\s,}]|$)")
        if any(ref.search(r) for c in t.chains.values() for r in c.rules):
            raise NftError("Device or resource busy")
        del t.sets[name]

    @staticmethod
    def _element(t: _FTable, verb: str, name: str, rest: str) -> None:
        s = t.sets.get(name)
        if s is None:
            raise NotFound("No such file or directory")
        body = rest.strip()
        if not (body.startswith("{") and body.endswith("}")):
            raise NftError(f"syntax error: {rest}")
        body = body[1:-1].strip()
        value = None
        if s.kind == "map" and verb == "add":
            body, sep, value = body.rpartition(" : ")
            if not sep:
                raise NftError("syntax error: map element without a value")
            Fake._refs(t, value)
        comment = None
        cm = _COMMENT_TAIL.search(body)
        if cm:
            comment, body = cm.group(1), body[: cm.start()]
        key = " . ".join(shlex.split(body.replace(" . ", " ")))
        if verb == "add":
            if key in s.elements and s.elements[key][1] != value:
                raise NftError("File exists")  # kernel: same key, other data
            s.elements[key] = (comment, value)
        elif key not in s.elements:
            raise NotFound("No such file or directory")
        else:
            del s.elements[key]
