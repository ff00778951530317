"""`nftrec cleanup`: kube-proxy's CleanupLeftovers for nftrec's tables.

One `delete table` transaction per family, so a missing table in one family does not
stop the other; NotFound is success (nothing left over). Only the named tables are
touched: never `flush ruleset`, never another owner's table.
"""

from __future__ import annotations

import sys
from typing import TextIO

from reconciler import logs
from reconciler.kernel import Interface, NftError, NotFound, Transaction
from reconciler.compile import FAMILIES

KUBE_PROXY_TABLE = "kube-proxy"


def cleanup(nft: Interface, table: str, *, kube_proxy: bool = False, dry_run: bool = False,
            out: TextIO = sys.stdout) -> bool:
    """Delete our tables (and kube-proxy's with `kube_proxy`). True when all went well."""
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
                nft.run(Transaction().delete_table(family, name))
                out.write(f"deleted table {family} {name}\n")
            except NotFound:
                out.write(f"not present: table {family} {name}\n")
            except NftError as e:
                ok = False
                out.write(f"error: could not delete table {family} {name}: {logs.escape_lines(e.text.strip())}\n")
    return ok
