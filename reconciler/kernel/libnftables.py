"""The real kernel: libnftables in-process through ctypes (no `nft` subprocess).

Every call runs on one `NamespaceThread`, so the library's netlink socket lives in the
namespace the object was made for. Tables and the generation id come over raw netlink
(netlink.py): libnftables would fill its whole cache for them.

Most commands make libnftables read every table of the namespace first (its cache), and
an nft older than the tool that wrote a foreign table can crash there. So a command runs
in-process only when commands of its kinds already read this namespace's ruleset, at
this generation, without harm; otherwise in a child process (isolated.py), once per kind
and foreign change. (A foreign commit in the instant between that check and nft's own
read is not covered.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import struct
import signal
import tempfile
import threading
from collections import deque
from typing import Callable, TypeVar

from reconciler import logs
from reconciler.compile import Chain, NamedSet, Table, chain_cmd, set_cmd, table_cmd
from reconciler.heap import trim_heap
from reconciler.kernel.interface import Crashed, MayHaveCommitted, NftError, NotFound, error_for
from reconciler.kernel.isolated import in_child
from reconciler.kernel.netlink import NfTablesSocket, netns_cookie, own_portids
from reconciler.kernel.netns import NamespaceThread
from reconciler.kernel.transaction import Transaction

T = TypeVar("T")

# enum nft_output_flags (nftables/libnftables.h)
_OUT_JSON = 1 << 4
_OUT_NUMERIC_PRIO = 1 << 8
_OUT_NUMERIC_TIME = 1 << 10
_LIST_FLAGS = _OUT_NUMERIC_PRIO | _OUT_NUMERIC_TIME  # `priority -110`, `timeout 10800s`

_lib: ctypes.CDLL | None = None
# libnftables before 1.0 keeps its symbol tables (marks, realms, ...) in globals that every
# nft_ctx_new sets and every nft_ctx_free frees: two contexts alive in one process end in
# "double free or corruption". So a process holds at most one context, on every version
# (the same code paths run everywhere): a second Libnftables while one is open is refused,
# and a context is freed before its replacement is made (_renew_ctx).
_contexts_lock = threading.Lock()
_contexts = 0  # nft contexts alive in this process (0 or 1)


class SecondContext(NftError):
    """A Libnftables was made while another is open in this process (a bug of the caller:
    pass the open one along)."""


# A command whose script or output is this big is a big one (a cold or full-sync
# transaction, a listing of a big table). Afterwards its context is replaced and the C
# heap trimmed: nft keeps what it listed or declared in the context's cache until the
# next command needs another cache, and what it frees stays in the worker thread's
# malloc arena unless trimmed. A new context is cheap.
_TRIM_AFTER = 1 << 20

# How long a command may take in a child process (a cold transaction of a big table
# takes seconds): a bound for a hang, not a timing.
_CHILD_TIMEOUT = 900.0


# A test seam: a child that ran a committing command kills itself (SIGKILL) right after
# the commit, before it answers: the parent must then say the commit may have happened.
_CHILD_DIES_AFTER_COMMIT = os.environ.get("NFTREC_TEST_CHILD_DIES_AFTER_COMMIT") == "1"

# How many of its own commits' generations an object remembers (the event watcher asks
# about recent ones only).
_GENERATIONS = 1024

_HEAD = struct.Struct("=iiQ")  # a child's answer: rc, errno, len(output); then output and errors


def _pack(rc: int, errno_: int, out: bytes, err: bytes) -> bytes:
    return _HEAD.pack(rc, errno_, len(out)) + out + err


def _unpack(data: bytes) -> tuple[int, int, bytes, bytes]:
    rc, errno_, n = _HEAD.unpack_from(data)
    return rc, errno_, data[_HEAD.size:_HEAD.size + n], data[_HEAD.size + n:]


def command_kind(lines) -> frozenset:
    """What decides which tables libnftables reads for a script: the verb and object of
    each command, and whether an `add table` carries a block (which makes nft read every
    table's chains and sets; a bare one reads nothing)."""
    kind = set()
    for line in lines:
        if not line or line[0] in " \t}#":
            continue
        end = line.find(" ", line.find(" ") + 1)
        head = line if end < 0 else line[:end]
        kind.add(head + " {" if head.endswith(" table") and "{" in line else head)
    return frozenset(kind)


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


class Libnftables:
    """The `Interface` on the real kernel. `netns`: a name under /run/netns (as `ip netns
    add` makes) or a path; everything this object does happens inside that namespace."""

    def __init__(self, netns: str | None = None):
        self.netns = netns
        self._lib = _load_lib()
        self._worker = NamespaceThread(netns)
        try:
            self._ctx = self._worker.call(self._new_ctx)
        except BaseException:
            self._worker.close()
            raise
        self._nl = NfTablesSocket()  # used on the worker thread only
        self._cookie: int | None = None  # the worker's namespace's, once read
        # The commands (verb and object) that ran without harm at generation
        # _readable_gen (see the module docstring); our own commits carry them forward.
        self._readable: frozenset = frozenset()
        self._readable_gen: int | None = None
        # Whose commit an nf_tables event shows (made()): the port ids of the sockets of
        # every context this object let go, and the generations its own commits made.
        self._portids: set[int] = set()
        self._generations: deque = deque(maxlen=_GENERATIONS)

    def __enter__(self) -> Libnftables:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- Interface

    def run(self, tx: Transaction) -> None:
        self._run(tx, dry_run=False)

    def check(self, tx: Transaction) -> None:
        self._run(tx, dry_run=True)

    def run_script(self, script: str) -> None:
        self._worker.call(lambda: self._cmd(script))

    def list_table(self, family: str, table: str) -> str | None:
        cmd = table_cmd("list", Table(family, table))

        def listing() -> str | None:
            try:
                return self._cmd(cmd, _LIST_FLAGS)
            except NotFound:
                return None
        return self._worker.call(listing)

    def list_objects(self, family: str, table: str, chains: list[str], sets: list[NamedSet]) -> str | None:
        cmds = [chain_cmd("list", family, table, Chain(c)) for c in chains]
        cmds += [set_cmd("list", family, table, st) for st in sets]
        # One command per object: in one batch, nft 1.0.6 narrows its cache to the sets
        # named and then prints a rule's anonymous map as nothing (`meta l4proto tcp`).
        try:
            return self._worker.call(lambda: "".join(self._cmd(c, _LIST_FLAGS) for c in cmds))
        except NotFound:
            return None

    def list_tables(self) -> list[tuple[str, str]]:
        return self._worker.call(self._nl.tables)

    def generation(self) -> int | None:
        return self._worker.call(self._nl.generation)

    def netns_cookie(self) -> int | None:
        # Read once: the worker thread never leaves its namespace.
        if self._cookie is None:
            self._cookie = self._worker.call(netns_cookie)
        return self._cookie

    def version(self) -> str | None:
        """libnftables' own version, from the JSON listing's metainfo. `list flowtables`:
        nft 1.0 and later read no table's chains, sets or rules for it."""
        doc = json.loads(self._worker.call(lambda: self._cmd("list flowtables", _OUT_JSON)))
        for item in doc.get("nftables", []):
            if "metainfo" in item:
                return item["metainfo"].get("version")
        return None

    def in_namespace(self, fn: Callable[[], T]) -> T:
        return self._worker.call(fn)

    def made(self, portid: int, generation: int) -> bool:
        """Whether a commit that this namespace's events show (its socket's port id, the
        generation it made) was this object's, through a context since let go (renewed
        after a big command or a child's death) or by a generation it committed. The
        context in use is the caller's to look up (own_portids, in the namespace): its
        socket is bound by its first command. Any thread."""
        return portid in self._portids or generation in self._generations

    def close(self) -> None:
        if self._ctx:
            ctx, self._ctx = self._ctx, None

            def free():
                self._free_ctx(ctx)
                self._nl.close()

            self._worker.call(free)
        self._worker.close()

    # -- running commands (on the worker thread only)

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
            self._worker.call(lambda: self._cmd_file(f.fileno(), size, dry_run, tx.text, command_kind(tx)))

    def _new_ctx(self):
        global _contexts
        with _contexts_lock:
            if _contexts:
                raise SecondContext("another libnftables context is open in this process (libnftables before 1.0 "
                                    "frees shared globals with each context: a double free); use the open one")
            ctx = self._lib.nft_ctx_new(0)
            if not ctx:
                raise NftError("nft_ctx_new failed")
            _contexts += 1
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)
        return ctx

    def _free_ctx(self, ctx) -> None:
        global _contexts
        with _contexts_lock:
            self._lib.nft_ctx_free(ctx)
            _contexts -= 1

    def _renew_ctx(self) -> None:
        """Replace the context (see _TRIM_AFTER): nft's cache goes with the old one. The old
        one is freed first: libnftables before 1.0 keeps its symbol tables (marks, realms)
        in globals that every nft_ctx_new sets and every nft_ctx_free frees, so two live
        contexts in one process end in a double free."""
        self._portids |= own_portids()  # its socket's events may still be on their way
        old, self._ctx = self._ctx, None
        self._free_ctx(old)
        self._ctx = self._new_ctx()

    def _cmd(self, script: str | bytes, flags: int = 0, dry_run: bool = False) -> str:
        buf = script if isinstance(script, bytes) else script.encode()
        kind = command_kind(buf.decode(errors="replace").splitlines())
        # c_char_p: passed without a copy (nft makes two: its own and the scanner's)
        return self._nft(lambda ctx: self._lib.nft_run_cmd_from_buffer(ctx, buf), len(buf), flags, dry_run,
                         lambda: script if isinstance(script, str) else script.decode(errors="replace"), kind)

    def _cmd_file(self, fd: int, size: int, dry_run: bool, text: Callable[[], str], kind: frozenset) -> str:
        """Run the script in the open file `fd`. nft's scanner reads a file in 16 KiB
        pieces, while a buffer is copied twice first, so a big transaction peaks lower.
        nft reopens the file by this name to quote a failing line (the right one, unlike
        with a buffer, where nft 1.0.6 quotes the script's first line)."""
        path = f"/proc/self/fd/{fd}"
        return self._nft(lambda ctx: self._lib.nft_run_cmd_from_filename(ctx, path.encode()), size, 0, dry_run,
                         text, kind, where=path)

    def _nft(self, call: Callable, size: int, flags: int, dry_run: bool, text: Callable[[], str],
             kind: frozenset, where: str | None = None) -> str:
        lib, ctx = self._lib, self._ctx

        def raw() -> tuple[int, int, bytes, bytes]:
            lib.nft_ctx_output_set_flags(ctx, flags)
            lib.nft_ctx_set_dry_run(ctx, dry_run)
            try:
                rc = call(ctx)
            finally:
                lib.nft_ctx_set_dry_run(ctx, False)
            # Reading a buffer also resets it for the next command.
            return rc, ctypes.get_errno(), lib.nft_ctx_get_output_buffer(ctx) or b"", \
                lib.nft_ctx_get_error_buffer(ctx) or b""

        commits = not dry_run and any(not k.startswith("list ") for k in kind)
        rc, errno_, out_b, err_b = self._guarded(raw, kind, commits)
        out, err = out_b.decode(errors="replace"), err_b.decode(errors="replace")
        if size + len(out) >= _TRIM_AFTER:
            self._renew_ctx()
            trim_heap()
        if rc != 0:
            if not (err or out).strip() and errno_:
                # libnftables before 1.0 prints a netlink error (EPERM: "Operation not
                # permitted (you must be root)") to stderr, not to the error buffer
                err = f"{os.strerror(errno_)}\n"
            if where is not None:  # "/proc/self/fd/7:3:39-45: Error: ..." -> "transaction line 3:39-45: ..."
                err = err.replace(f"{where}:", "transaction line ")
            raise error_for(err or out, text())
        return out

    def _guarded(self, raw: Callable[[], tuple], kind: frozenset, commits: bool) -> tuple:
        """raw() in-process if each of its commands (verb and object: what decides which
        objects of every table nft reads) already ran at the current generation;
        otherwise in a child, so that a crash reading a foreign table is an NftError with
        its reason. A success (and our own commit, when the generation moved by exactly
        that) vouches for the generation after it."""
        try:
            gen = self._nl.generation()
        except NftError:  # no privileges to read the ruleset: nor has nft
            return raw()
        if gen == self._readable_gen and kind <= self._readable:
            result = raw()
        else:
            def child() -> bytes:
                answer = raw()
                if _CHILD_DIES_AFTER_COMMIT and commits and answer[0] == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                return _pack(*answer)

            outcome = in_child(child, what="libnftables", timeout=_CHILD_TIMEOUT)
            if not outcome.ok:
                self._renew_ctx()  # the child shared the context's netlink socket
                reason = outcome.reason("running a commit" if commits else "reading this namespace's ruleset")
                moved = self._nl.generation() != gen
                text = self._crash_text(reason, moved, commits, outcome.crashed or outcome.timed_out)
                raise (MayHaveCommitted if commits and moved else Crashed)(text)
            result = _unpack(outcome.stdout)
        if result[0] == 0:
            # A listing changes nothing: what it vouches for is kept under `gen`, which a
            # foreign commit meanwhile only makes stale.
            after = self._nl.generation() if commits else gen
            if after == (gen + commits) & 0xFFFFFFFF:
                if commits:
                    self._generations.append(after)  # ours (made()): nothing else committed in between
                self._readable = kind | (self._readable if gen == self._readable_gen else frozenset())
                self._readable_gen = after
        return result

    def _crash_text(self, reason: str, moved: bool, commits: bool, hint: bool) -> str:
        others = ", ".join(f"{f} {n}" for f, n in self._nl.tables())
        if not moved:
            changed = "nothing was changed"
        elif commits:  # the kernel answered the commit before the child died, or someone else committed
            changed = "it may have committed: the ruleset generation moved"
        else:
            changed = "the ruleset changed meanwhile"
        return (f"{reason} (in a child process: {changed}); the namespace's tables: {others or 'none'}" + (
            ". Upgrade nftables to the version of the tool that wrote the foreign table, or remove that table"
            if hint else ""))
