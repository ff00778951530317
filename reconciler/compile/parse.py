"""Input parsing for the compiler: every string from the model that goes into a rule or an
element passes one of these first (addresses and CIDRs are parsed, names checked), and
anything else raises CompileError."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from reconciler.compile.ruleset import NftSyntaxError, check_atom
from reconciler.intake import leading_zero_octet

FAMILY_OF_VERSION = {4: "ip", 6: "ip6"}
ADDRESS_TYPE_FAMILY = {"IPv4": "ip", "IPv6": "ip6"}
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


class CompileError(NftSyntaxError):
    """Input the compiler refuses to turn into rules (it would be unsafe or ambiguous)."""


def parse_ip(text: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # '%' would smuggle an IPv6 scope id (arbitrary text) through ipaddress; 010.0.0.1 is
    # octal to some parsers, decimal to others (and to ipaddress before Python 3.9.5).
    if not isinstance(text, str) or "%" in text or leading_zero_octet(text.strip()):
        raise CompileError(f"{what}: not an IP address: {text!r}")
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise CompileError(f"{what}: not an IP address: {text!r}") from None


def parse_net(text: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(text, str) or "%" in text or leading_zero_octet(text.strip().partition("/")[0]):
        raise CompileError(f"{what}: not a CIDR: {text!r}")
    try:
        # strict=False: net.IPNet.String() masks host bits (kube-proxy's rendering).
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise CompileError(f"{what}: not a CIDR: {text!r}") from None


def family_of(addr) -> str:
    return FAMILY_OF_VERSION[addr.version]


def parse_port(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise CompileError(f"{what}: not a port number: {value!r}")
    return value


def parse_proto(value: str, what: str) -> str:
    try:
        return PROTOCOLS[value]
    except (KeyError, TypeError):
        raise CompileError(f"{what}: unsupported protocol {value!r}") from None


def name_part(value: str, what: str) -> str:
    # '/' separates the parts of kube-proxy's chain names; allowing it in a part would
    # let two Services produce the same chain name. The rest is checked by check_name
    # on the whole chain name and check_comment on the element comment.
    if not isinstance(value, str) or "/" in value:
        raise CompileError(f"{what}: not a valid name: {value!r}")
    return value


def set_literal(items: Sequence[str], sep: str) -> str:
    return "{ " + sep.join(check_atom(i) for i in items) + " }"


def collapse_nets(nets: Iterable) -> tuple[str, ...]:
    """Sorted, overlap-free CIDR strings (same packets matched, nft never sees overlap)."""
    return tuple(str(n) for n in ipaddress.collapse_addresses(sorted(set(nets))))

