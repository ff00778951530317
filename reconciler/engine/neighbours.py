"""What else on the node decides the fate of nftrec's packets: `doctor`'s neighbour checks.

Other tables are read only by the `nft` binary in a child process with a time bound, one
table at a time (kernel/isolated.py): an nft older than the tool that wrote a table may
crash reading it, and that crash is a finding. Each finding carries its fix in one line.
Host files (the distribution's firewall service) are read under `root`, so tests can
point it at a directory of their own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from reconciler.engine.teardown import KUBE_PROXY_TABLE
from reconciler.kernel import NamespaceThread, program, run, run_nft

_TIMEOUT = 20.0  # seconds for one listing: a bound for a hang
_VERDICTS = ("accept", "drop", "reject", "jump", "goto", "return", "queue")
_NEUTRAL = ("counter", "log")  # statements that neither match nor decide
_ALL_FORWARD = ("it accepts both directions of every DNATed connection; a drop in any chain on the forward hook "
                "is final, so an accept in another table, nftrec's included, does not help")


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    detail: str


# -- forward-hook chains that drop ----------------------------------------------------------


def _parse(items: Iterable[dict]) -> tuple[dict, dict]:
    chains: dict[tuple, dict] = {}
    rules: dict[tuple, list] = {}
    for item in items:
        if "chain" in item:
            c = item["chain"]
            chains[(c["family"], c["table"], c["name"])] = c
        elif "rule" in item:
            r = item["rule"]
            rules.setdefault((r["family"], r["table"], r["chain"]), []).append(r)
    return chains, rules


def _accepts_dnat(exprs: list) -> bool:
    """`ct status dnat accept` (with counters): the rule that lets DNATed connections by."""
    matches = [e["match"] for e in exprs if "match" in e]
    if not matches or [e for e in exprs if not set(e) & {"match", "accept", *_NEUTRAL}] or {"accept": None} not in exprs:
        return False
    for m in matches:
        right = m.get("right")
        if m.get("left") != {"ct": {"key": "status"}} or "dnat" not in (right if isinstance(right, list) else [right]):
            return False
    return True


def _xt_conntrack_accept(exprs: list) -> bool:
    """iptables' `-m conntrack --ctstate … -j ACCEPT` as nft shows it: which states, it cannot say."""
    conds = [e for e in exprs if not set(e) & {"accept", *_NEUTRAL}]
    return {"accept": None} in exprs and len(conds) == 1 and (conds[0].get("xt") or {}).get("name") == "conntrack"


def _walk(key: tuple, chains: dict, rules: dict, depth: int = 0) -> tuple[str, dict | None]:
    """What becomes of a DNATed packet in chain `key`: ("accept", rule), ("drop", rule) for
    an unconditional drop or reject, ("maybe", rule) at an iptables conntrack accept, or
    ("end", None) when it falls off the chain (or returns). Conditional rules are passed
    over: doctor cannot know whether they match."""
    if depth > 16:
        return "end", None
    family, table, _ = key
    for rule in rules.get(key, []):
        exprs = rule.get("expr", [])
        if _accepts_dnat(exprs):
            return "accept", rule
        if _xt_conntrack_accept(exprs):
            return "maybe", rule
        if any(not set(e) & {*_NEUTRAL, *_VERDICTS} for e in exprs):
            continue  # a match, a limit, an xt match of iptables-nft: may or may not apply
        verdict = next((e for e in reversed(exprs) if set(e) & set(_VERDICTS)), None)
        if verdict is None:
            continue
        name = next(iter(verdict))
        if name == "accept":
            return "accept", rule
        if name in ("drop", "reject"):
            return "drop", rule
        if name == "return":
            return "end", None
        if name in ("jump", "goto"):
            fate = _walk((family, table, verdict[name]["target"]), chains, rules, depth + 1)
            if fate[0] != "end" or name == "goto":
                return fate
    return "end", None


def _fix(family: str, table: str, chain: str, chains: dict) -> str:
    tool = "ip6tables" if family == "ip6" else "iptables"
    if (family, table, "DOCKER-USER") in chains:
        return f"Docker's: `{tool} -I DOCKER-USER -m conntrack --ctstate DNAT -j ACCEPT` ({_ALL_FORWARD})"
    if table == "firewalld":
        return ("firewalld's: StrictForwardPorts=no in /etc/firewalld/firewalld.conf (it then accepts connections "
                "other tools DNAT), or a firewalld policy accepting forwarding from the clients' zone to the "
                "backends' zone; then `firewall-cmd --reload`")
    if family in ("ip", "ip6") and table in ("filter", "mangle", "raw", "security") and chain.isupper():
        return (f"iptables-nft's: `{tool} -I {chain} -m conntrack --ctstate DNAT -j ACCEPT` "
                f"({_ALL_FORWARD})")
    return f"`nft insert rule {family} {table} {chain} ct status dnat accept` ({_ALL_FORWARD})"


def forward_drops(items: list[dict]) -> list[Finding]:
    """A finding per forward-hook chain that drops what nftrec DNATs to a backend on
    another interface (its policy, or an unconditional drop or reject that no
    `ct status dnat accept` precedes)."""
    chains, rules = _parse(items)
    found = []
    for key, c in sorted(chains.items()):
        if c.get("hook") != "forward" or c.get("type", "filter") != "filter":
            continue
        fate, rule = _walk(key, chains, rules)
        family, table, name = key
        where = f"table {family} {table} chain {name}"
        if fate == "drop":
            verb = "reject" if any("reject" in e for e in rule["expr"]) else "drop"
            how = f"ends in an unconditional {verb} (chain {rule['chain']}, rule handle {rule.get('handle')})"
        elif fate == "maybe":
            if c.get("policy") != "drop":
                continue
            how = (f"has policy drop, and before it an accept by iptables' conntrack match (chain {rule['chain']}, "
                   f"rule handle {rule.get('handle')}) whose states nft cannot show (if they are DNAT, all is well)")
        elif fate == "end" and c.get("policy") == "drop":
            how = "has policy drop"
        else:
            continue
        found.append(Finding("forward drop", False, f"{where} {how}: it drops the connections nftrec DNATs to "
                                                    f"a backend that is not a local process (another host, a "
                                                    f"container); fix, {_fix(family, table, name, chains)}"))
    return found


# -- another proxy --------------------------------------------------------------------------


def kube_services_chains(items: list[dict]) -> list[str]:
    """`family table` of every table with a KUBE-SERVICES chain (kube-proxy's iptables
    mode through iptables-nft)."""
    return sorted({f"{c['family']} {c['table']}" for c in (i["chain"] for i in items if "chain" in i)
                   if c["name"] == "KUBE-SERVICES"})


def legacy_kube_services(netns: str | None, read: Callable[[str], str] | None = None) -> tuple[list[str], list[str]]:
    """(tables of iptables-legacy holding KUBE-SERVICES, notes on what could not be read).
    Which legacy tables exist comes from /proc's ip_tables_names of the namespace; their
    chains from iptables-legacy-save, when installed."""
    found, notes = [], []
    for tool, names_file in (("iptables", "ip_tables_names"), ("ip6tables", "ip6_tables_names")):
        names_path = f"/proc/thread-self/net/{names_file}"
        try:
            names = (read(names_path) if read else _in_netns(netns, lambda: Path(names_path).read_text())).split()
        except OSError:
            names = []  # the module is not loaded: no legacy table at all
        if "nat" not in names and "filter" not in names:
            continue
        save = program(f"{tool}-legacy-save")
        if save is None:
            notes.append(f"{tool}-legacy has tables here ({', '.join(sorted(names))}) but {tool}-legacy-save is not "
                         "installed to look inside them (install iptables)")
            continue
        out = run(netns, [save], timeout=_TIMEOUT)
        if not out.ok:
            notes.append(out.reason("listing the legacy tables"))
            continue
        found += [f"{tool}-legacy {t}" for t in kube_services_saved(out.stdout.decode(errors="replace"))]
    return found, notes


def kube_services_saved(text: str) -> list[str]:
    """The tables of an iptables-save listing that declare a KUBE-SERVICES chain."""
    found, table = [], None
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":KUBE-SERVICES ") and table not in found:
            found.append(table)
    return found


def _in_netns(netns: str | None, fn: Callable[[], str]) -> str:
    worker = NamespaceThread(netns)
    try:
        return worker.call(fn)
    finally:
        worker.close()


def proxies(tables: list[tuple[str, str]], items: list[dict], legacy: list[str]) -> Finding:
    """Another proxy for the same Service IPs: kube-proxy's nftables tables, or the
    KUBE-SERVICES chains of its iptables mode (iptables-nft's, or legacy ones: k3s)."""
    kube = sorted(f for f, n in tables if n == KUBE_PROXY_TABLE)
    parts = []
    if kube:
        parts.append(f"kube-proxy's tables exist ({', '.join(kube)}): two proxies would program the same Services; "
                     "stop kube-proxy and run `nftrec cleanup --kube-proxy`")
    chains = kube_services_chains(items) + legacy
    if chains:
        parts.append(f"KUBE-SERVICES chains exist ({', '.join(chains)}): kube-proxy's iptables mode (k3s runs its "
                     "own) serves the same Service IPs; stop it (k3s: --disable-kube-proxy), then `kube-proxy "
                     "--cleanup` removes its iptables rules")
    if parts:
        return Finding("conflicting tables", False, "; ".join(parts))
    return Finding("conflicting tables", True, "no kube-proxy tables, no KUBE-SERVICES chains")


# -- reading the other tables ---------------------------------------------------------------


def read_tables(netns: str | None, tables: list[tuple[str, str]],
                own: set[tuple[str, str]]) -> tuple[list[dict], list[Finding]]:
    """The JSON items of every table not in `own`, each listed by the nft binary in a child
    process; a table that cannot be listed (a crash, a hang) is a finding."""
    items: list[dict] = []
    problems = []
    for family, name in tables:
        if (family, name) in own:
            continue
        out = run_nft(netns, ["-j", "list", "table", family, name], timeout=_TIMEOUT)
        if out.missing:
            return items, [Finding("other tables", False, f"{out.reason()}: doctor cannot look at the other tables")]
        if not out.ok:
            problems.append(Finding("other tables", False, f"{out.reason(f'listing table {family} {name}')}; doctor "
                                    "could not check that table: list it with the nft of the tool that wrote it"))
            continue
        try:
            items += [i for i in json.loads(out.stdout).get("nftables", []) if "metainfo" not in i]
        except ValueError as e:
            problems.append(Finding("other tables", False, f"nft's JSON listing of table {family} {name} is "
                                    f"unreadable ({e})"))
    return items, problems


# -- the distribution's firewall service ----------------------------------------------------


def _first_statement(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    return ""


def firewall_service(root: Path) -> Finding:
    """nftables.service (Debian, RHEL) loads a file that begins with `flush ruleset` on
    every boot and reload: that deletes nftrec's tables."""
    enabled = [p for p in sorted((root / "etc/systemd/system").glob("*.wants/nftables.service"))]
    notes = []
    for conf in ("etc/nftables.conf", "etc/sysconfig/nftables.conf"):
        try:
            text = (root / conf).read_text(errors="replace")
        except OSError:
            continue
        if enabled and _first_statement(text).startswith("flush ruleset"):
            return Finding("firewall service", False, f"nftables.service is enabled and /{conf} begins with "
                           "`flush ruleset`: every boot and `systemctl reload nftables` deletes nftrec's tables. "
                           "`nftrec watch` repairs them within a second; one-shot users must run `nftrec apply` "
                           f"again after each reload. Fix: in /{conf}, flush only its own tables "
                           "(`flush table inet filter`) instead of the whole ruleset")
    if any((root / p).exists() for p in ("run/firewalld.pid", "var/run/firewalld.pid")):
        notes.append("firewalld runs (a reload replaces its own tables only; its forward chain is checked above)")
    return Finding("firewall service", True, "; ".join(notes) or "no nftables.service that flushes the ruleset")
