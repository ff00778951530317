"""`plan --refresh`: the kernel listed, the desired ruleset compiled from the inputs, and
the two diffed whole. Nothing is taken from the state's record of the kernel (the
generation token, the recorded ruleset standing in for the listing).

Two things make it cheaper at 10,000 Services without that trust:

* `begin_listing` (called by the command line before the manifests are read) starts the
  listing on libnftables' worker thread: nft's netlink dump and printing (~2.7 s at 10k)
  run outside the GIL while intake runs; `read_listing` waits for it and parses.
* A compile memo (`desired_ruleset`): the last applied history entry and its
  compiled.json are what nftrec compiled from each Service's input digest, under a key of
  the effective node config, --strict, the code and the service CIDRs (compile_oneshot's
  memo, written by apply). A Service whose digest and key are unchanged gets its objects
  from that entry (its bytes are checked against the entry's sha256 when read); every
  other one is compiled. Whether the kernel still holds that entry does not matter: the
  endpoint index ranges are then re-placed to keep the listing's (compile.relocate,
  layout.allocate is a function of the picks and the ranges kept), which is exactly what
  a compile against the listing gives (tests/test_refresh.py compares the two for random
  edits and random damage to the kernel), and the diff is against the listing.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler import logs
from reconciler.compile import FAMILIES, Ruleset, compile_oneshot, relocate
from reconciler.engine.state import StateCorrupt, read_history, read_status
from reconciler.engine.target import Target
from reconciler.kernel import Libnftables, NftError, parse_live, read_live

# (netns, table) -> (its own Libnftables, {family: wait for the listing}): one per process
_started: dict[tuple[str | None, str], tuple[Libnftables, dict[str, Callable[[], str | None]]]] = {}


def begin_listing(target: Target) -> None:
    """Start listing `target`'s tables now, on a Libnftables of its own. Best effort: any
    error here is left for read_listing's own listing to report."""
    key = (target.netns, target.table)
    if key in _started:
        return
    try:
        nft = Libnftables(target.netns)
    except NftError:
        return
    try:
        _started[key] = (nft, {fam: nft.list_table_later(fam, target.table) for fam in FAMILIES})
    except NftError:
        nft.close()


def read_listing(nft, target: Target) -> Ruleset:
    """The live ruleset (kernel.read_live), from the listing begin_listing started when it
    did, else listed now through `nft`."""
    started = _started.pop((target.netns, target.table), None)
    if started is None:
        return read_live(nft, target.table)
    own, waits = started
    try:
        from reconciler import progress

        with progress.step(f"listing table {target.table} in the kernel"):
            return parse_live({fam: wait() for fam, wait in waits.items()}, target.table)
    finally:
        own.close()


def _memo(target: Target) -> tuple[Ruleset, dict] | None:
    """(the last applied ruleset, decoded whole, and its compiled.json), or None when
    there is none that belongs together (no apply from manifests yet, a rollback or a
    saved plan applied last, anything unreadable: everything is compiled)."""
    store = target.store()
    try:
        digest = read_status(store).desired_digest
        memo = store.read_compiled(digest)
        if memo is None:
            return None
        entry = next((e for e in reversed(read_history(store)) if e.digest == digest), None)
        if entry is None:
            return None
        # whole, not lazily: the diff reads every object (per-object decoding costs more)
        return store.load_ruleset(entry), memo
    except (StateCorrupt, OSError) as e:
        logs.log.debug(f"plan --refresh: no compile memo ({e}); compiling every Service")
        return None


def desired_ruleset(desired, target: Target, live: Ruleset):
    """The OneShot whose ruleset is `desired`'s, compiled as against the listing `live`
    (compile_memoized with the state's memo)."""
    return compile_memoized(desired.inventory, desired.config, desired.config_digest, live, _memo(target))


def compile_memoized(inventory, config, config_digest: str | None, live: Ruleset,
                     memo: tuple[Ruleset, dict] | None):
    """compile_oneshot(inventory, config, config_digest, live): every Service compiled, the
    listing's index ranges kept, with the unchanged Services' objects taken from `memo`
    ((a recorded ruleset, its compiled.json), module doc). `live` is only read."""
    from dataclasses import replace

    if memo is None:
        return compile_oneshot(inventory, config, config_digest, live, None)
    one = compile_oneshot(inventory, config, config_digest, memo[0], memo[1])  # consumes memo[0]
    if one.changed is None:
        logs.log.debug("plan --refresh: the compile memo does not fit; every Service compiled")
    else:
        logs.log.debug(f"plan --refresh: {one.recompiled} of {len(inventory.services)} Services compiled, "
                       f"the rest from the compile memo")
    # the memo's index ranges are the recorded ruleset's: placed again as against the listing
    return replace(one, ruleset=relocate(one.ruleset, live), changed=None, applied_part=None, desired_part=None)
