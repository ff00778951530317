"""A Ruleset as one `nft -f` script that builds nftrec's tables from scratch (`nftrec
render`, cold apply): per table `add table`, `delete table`, `add table` (the delete then
succeeds whether or not the table exists, and `nft -f` runs the file as one transaction),
then sets, chains, rules and elements, each declared before it is used. Every text comes
from ruleset.py's `*_cmd` functions, which check what goes into it."""

from __future__ import annotations

import ipaddress

from reconciler.compile.ruleset import (
    FAMILIES,
    Element,
    Ruleset,
    Table,
    chain_cmd,
    check_rule_body,
    element_cmd,
    rule_cmd,
    set_cmd,
    table_cmd,
)


def _atom_sort_key(atom: str) -> tuple:
    """IPs numerically, numbers numerically, words alphabetically — stable and readable."""
    try:
        ip = ipaddress.ip_address(atom)
        return (0, ip.version, int(ip), "")
    except ValueError:
        pass
    if atom.isdigit():
        return (1, 0, int(atom), "")
    return (2, 0, 0, atom)


def element_sort_key(e: Element) -> tuple:
    return tuple(_atom_sort_key(k) for k in e.key)


def render_table(table: Table) -> list[str]:
    fam, name = table.family, table.name
    lines = [table_cmd("add", table), table_cmd("delete", table), table_cmd("add", table)]
    for s in table.sets.values():
        lines.append(set_cmd("add", fam, name, s))
    for c in table.chains.values():
        lines.append(chain_cmd("add", fam, name, c))
    for c in table.chains.values():
        for r in c.rules:
            check_rule_body(r.body)
            lines.append(rule_cmd(fam, name, c.name, r))
    for s in table.sets.values():
        for e in sorted(s.elements.values(), key=element_sort_key):
            lines.append(element_cmd("add", fam, name, s, e))
    return lines


def render_header(config) -> str:
    """The comment lines `nftrec render` puts before the script: where nodeport-ips came
    from (render reads no interfaces; plan, apply and watch do)."""
    from reconciler.compile.skeleton import family_context

    if all(family_context(config, f).nodeport_match_all for f in FAMILIES):
        return ""
    ips = ", ".join(config.node_ips) or "none"
    return (f"# nodeport-ips: render looks at no interface, so nodeIPs ({ips}) stand in for the node's addresses "
            f"inside nodePortAddresses ({', '.join(config.node_port_addresses)}); plan, apply and watch use "
            f"every address on the node's interfaces inside them\n")


def render_script(ruleset: Ruleset) -> str:
    """The whole desired ruleset as an `nft -f` script (ip table first, then ip6)."""
    lines: list[str] = []
    for family in FAMILIES:
        table = ruleset.tables.get(family)
        if table is None:
            continue
        if lines:
            lines.append("")
        lines.extend(render_table(table))
    return "\n".join(lines) + "\n" if lines else ""


