"""`nftrec cleanup`: kube-proxy's CleanupLeftovers for nftrec's tables.

One `delete table` transaction per family, so a missing table in one family does not
stop the other; NotFound is success (nothing left over). Only the named tables are
touched: never `flush ruleset`, never another owner's table. Where libnftables cannot
run beside a table it cannot read (one a newer nft wrote), the table is deleted by a
netlink NFT_MSG_DELTABLE, which reads nothing. Removing ours is recorded in the state.
"""

from __future__ import annotations

import sys
from typing import TextIO

from reconciler import logs
from reconciler.compile import FAMILIES
from reconciler.engine.state import StateCorrupt, StateStore
from reconciler.engine.target import Target
from reconciler.kernel import Interface, NftError, NotFound, Transaction, netlink_delete_table, sweep_trace_tables

KUBE_PROXY_TABLE = "kube-proxy"


def run_cleanup(target: Target, *, kube_proxy: bool, dry_run: bool) -> bool:
    """`nftrec cleanup` under the namespace lock: a killed `trace --kernel`'s tables, then ours."""
    lock = target.hold_lock()
    try:
        nft = target.nft()
        try:
            if not dry_run:
                sweep_trace_tables(nft, target.netns)
            return cleanup(nft, target.table, kube_proxy=kube_proxy, dry_run=dry_run, store=target.store())
        finally:
            nft.close()
    finally:
        lock.release()


def cleanup(nft: Interface, table: str, *, kube_proxy: bool = False, dry_run: bool = False,
            out: TextIO = sys.stdout, store: StateStore | None = None) -> bool:
    """Delete our tables (and kube-proxy's with `kube_proxy`). True when all went well;
    then `store`, when something was applied there, records that the tables were removed
    on purpose (status.json's cleanedUpAt: `status` reports no drift, `watch` applies afresh)."""
    names = [table] + ([KUBE_PROXY_TABLE] if kube_proxy and table != KUBE_PROXY_TABLE else [])
    present = set(nft.list_tables())
    ok = True
    for name in names:
        for family in FAMILIES:
            if dry_run or (family, name) not in present:  # absent: nft is not asked (it would read every table)
                state = "would delete" if (family, name) in present else "not present:"
                out.write(f"{state} table {family} {name}\n")
                continue
            try:
                out.write(_delete(nft, family, name) + "\n")
            except NotFound:
                out.write(f"not present: table {family} {name}\n")
            except NftError as e:
                ok = False
                out.write(f"error: could not delete table {family} {name}: {logs.escape_lines(e.text.strip())}\n")
    if ok and not dry_run and store is not None:
        try:
            if store.status().ever_applied:
                store.record_cleanup()
        except StateCorrupt as e:  # the tables are gone all the same
            logs.log.warning(f"{e} The cleanup is not recorded there.")
    return ok


def _delete(nft: Interface, family: str, name: str) -> str:
    """Delete one table; what was done, as a line for the operator. When libnftables fails
    (it reads every table first: it crashes or errs on one a newer nft wrote), the kernel
    is asked directly; if that fails too, both reasons are in the NftError."""
    try:
        nft.run(Transaction().delete_table(family, name))
    except NotFound:
        raise
    except NftError as e:
        why = logs.escape_lines(e.text.strip())
        try:
            nft.in_namespace(lambda: netlink_delete_table(family, name))
        except NotFound:
            raise
        except NftError as e2:
            raise NftError(f"{e.text.strip()}\nand by netlink: {e2.text.strip()}") from None
        return f"deleted table {family} {name} (by netlink: libnftables failed in this namespace: {why})"
    return f"deleted table {family} {name}"
