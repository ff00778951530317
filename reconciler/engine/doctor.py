"""`nftrec doctor`: can nftrec work here? One line per check, exit 1 if any fails.

The checks mirror kube-proxy's supported.go (kernel >= 5.13, nft >= 1.0.1: warnings
here, since nftrec reads only its own tables) plus what nftrec itself needs: which
spellings this nft accepts and what of nftrec's ruleset the kernel refuses, by check
transactions (kernel/features.py); then the neighbours that decide the fate of
nftrec's packets (neighbours.py), warnings all.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from reconciler import logs
from reconciler.engine.neighbours import (Finding, firewall_service, forward_drops, legacy_kube_services, proxies,
                                          read_tables)
from reconciler.intake import NftSpelling
from reconciler.kernel import (PROBE_TABLE, Interface, Libnftables, NftError, Transaction, kernel_refusals,
                               probe_spelling)
from reconciler.compile import FAMILIES, Table

MIN_NFT = (1, 0, 1)
MIN_KERNEL = (5, 13)
_CAP_NET_ADMIN = 12


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = False  # reported, but does not fail doctor

    def line(self) -> str:
        mark = "ok  " if self.ok else ("warn" if self.warning else "FAIL")
        return f"{mark} {self.name}: {self.detail}"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def check_kernel(release: str) -> Check:
    """kube-proxy refuses a kernel before 5.13 for the sake of other nftables users; nftrec
    checks what it writes instead (check_kernel_features), so a warning."""
    if _version_tuple(release)[:2] >= MIN_KERNEL:
        return Check("kernel", True, f"{release} >= 5.13")
    return Check("kernel", False, f"{release} is older than 5.13, kube-proxy's floor; nftrec checks what the "
                 "kernel accepts of its ruleset instead (kernel features below)", warning=True)


def check_kernel_features(nft: Interface, spelling: NftSpelling) -> Check:
    """A sample of nftrec's ruleset in one check transaction: what the kernel refuses."""
    refused = kernel_refusals(nft, spelling)
    if not refused:
        return Check("kernel features", True, "every construct nftrec writes is accepted (check transaction)")
    return Check("kernel features", False, f"this kernel ({os.uname().release}) refuses what nftrec writes, so apply "
                 f"would fail: {'; '.join(refused)}; run nftrec on a newer kernel")


def check_privileges(status_text: str) -> Check:
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text, re.M)
    caps = int(m.group(1), 16) if m else 0
    if caps & (1 << _CAP_NET_ADMIN):
        return Check("privileges", True, "CAP_NET_ADMIN is effective")
    return Check("privileges", False, "CAP_NET_ADMIN is missing: run as root or grant the capability "
                 "(systemd: AmbientCapabilities=CAP_NET_ADMIN)")


def check_nft_version(version: str | None) -> Check:
    """kube-proxy refuses nft < 1.0.1: an older nft crashes listing rules that a newer nft
    wrote into other tools' tables. nftrec lists only its own tables, so a warning."""
    if version is None:
        return Check("nft version", False, "could not read libnftables' version")
    if _version_tuple(version) >= MIN_NFT:
        return Check("nft version", True, f"{version} >= 1.0.1")
    return Check("nft version", False, f"{version} is older than 1.0.1, kube-proxy's floor (an older nft may "
                 "crash reading other tools' tables written by a newer nft); nftrec reads only its own tables and "
                 "uses the spellings this nft accepts", warning=True)


# What each NftSpelling field says, accepted and refused (compile/layout.py).
_SPELLINGS = {
    "index_maps": ("endpoint maps", "`typeof numgen random mod 1 : verdict` maps",
                   "shared maps by index range", "kube-proxy's anonymous map per Service port"),
    "shared_affinity": ("affinity", "`typeof ip saddr . numgen … . numgen …` sets",
                        "one shared set per table", "kube-proxy's set per endpoint"),
}


def check_spelling(spelling: NftSpelling) -> Check:
    """The constructs this nft accepts (check transactions) and the spelling used."""
    parts = []
    for name, (what, construct, ours, theirs) in _SPELLINGS.items():
        ok = getattr(spelling, name)
        parts.append(f"{what}: {construct} {'accepted' if ok else 'refused'}, so {ours if ok else theirs}")
    return Check("nft spellings", True, "; ".join(parts) + " (same packets either way)")


def run_doctor(netns: str | None, table: str, out: TextIO = sys.stdout,
               read: Callable[[str], str] | None = None, root: Path = Path("/")) -> int:
    """Every check, one line each. `root`: where the host's files are read (tests)."""
    read = read or (lambda p: open(p).read())
    checks = [check_kernel(os.uname().release), check_privileges(read("/proc/self/status"))]
    nft: Interface | None
    try:
        nft = Libnftables(netns)
    except NftError as e:
        checks.append(Check("libnftables", False, str(e)))
        nft = None
    if nft is not None:
        try:
            checks.append(Check("libnftables", True, f"loaded{' in netns ' + netns if netns else ''}"))
            checks.append(check_nft_version(nft.version()))
            spelling = probe_spelling(nft)
            checks += [check_spelling(spelling), check_kernel_features(nft, spelling)]
            try:  # what knftables probes: can we create our table, with a comment?
                nft.check(Transaction().add_table(Table("ip", table, comment="nftrec doctor probe")))
                checks.append(Check("nft transaction", True, f"a table {table} can be created (dry run)"))
            except NftError as e:
                checks.append(Check("nft transaction", False, f"dry run failed: {e.text.strip()}"))
        except NftError as e:
            checks.append(Check("nftables", False, str(e)))
        try:
            checks += [_warning(f) for f in neighbour_findings(netns, table, nft.list_tables(), root)]
        except NftError as e:
            checks.append(Check("neighbours", False, f"could not look at the other tables: {e}", warning=True))
        finally:
            nft.close()
    for c in checks:
        out.write(logs.escape_lines(c.line()) + "\n")
    failed = [c for c in checks if not c.ok and not c.warning]
    out.write("nftrec can run here.\n" if not failed else f"{len(failed)} check(s) failed.\n")
    return 0 if not failed else 1


def neighbour_findings(netns: str | None, table: str, tables: list[tuple[str, str]], root: Path) -> list[Finding]:
    """The other tables (each listed by the nft binary in a child process), the legacy
    iptables tables, and, on the host's own namespace, its firewall service."""
    own = {(family, name) for family in FAMILIES for name in (table, PROBE_TABLE)}
    items, findings = read_tables(netns, tables, own)
    drops = forward_drops(items)
    findings += drops or [Finding("forward drop", True, "no other table drops forwarded DNATed connections")]
    legacy, notes = legacy_kube_services(netns)
    findings.append(proxies(tables, items, legacy))
    findings += [Finding("iptables-legacy", False, n) for n in notes]
    if netns is None:
        findings.append(firewall_service(root))
    else:
        findings.append(Finding("firewall service", True, f"not checked: the host's services load the host's "
                                f"namespace, not {netns}"))
    return findings


def _warning(f: Finding) -> Check:
    return Check(f.name, f.ok, f.detail, warning=not f.ok)
