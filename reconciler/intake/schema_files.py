"""What the no-op fast path needs of schemas.py, without importing jsonschema (whose import
costs as much as the rest of a no-op): where the JSON Schemas are (code_digest() hashes
them) and the strict IP/CIDR parsers (address discovery, the node config's settings).
schemas.py re-exports all of it.

The schemas live at the top of the repo; a wheel ships them to share/nftrec/schemas.
"""

from __future__ import annotations

import ipaddress
import sys
from functools import lru_cache
from pathlib import Path


def schema_dir() -> Path:
    candidates = [
        Path(__file__).resolve().parents[2] / "schemas",  # a checkout
        Path(sys.prefix) / "share" / "nftrec" / "schemas",  # an installed wheel
        Path(sys.base_prefix) / "share" / "nftrec" / "schemas",
    ]
    for c in candidates:
        if (c / "service.json").is_file():
            return c
    raise FileNotFoundError("nftrec's schemas/ directory is missing; reinstall nftrec")


# --- strict IP formats ---------------------------------------------------------------------


def leading_zero_octet(text: str) -> bool:
    """Whether the IPv4 part of an address (the whole, or an IPv6 address' dotted tail like
    ::ffff:1.2.3.04) has an octet written with a leading zero. ipaddress refuses them from
    Python 3.9.5 on; 3.9.0 to 3.9.4 (Debian 11 ships 3.9.2) read 010 as decimal 10."""
    return "." in text and any(len(p) > 1 and p[0] == "0" for p in text.rpartition(":")[2].split("."))


def parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP in any family, or None. Rejects what kube's strict parser rejects: leading
    zeros (010.0.0.1: octal or decimal?), zones (fe80::1%eth0), whitespace, and IPv4-mapped
    IPv6 (::ffff:10.0.0.1: Kubernetes counts it as IPv4, nft as IPv6)."""
    if not isinstance(value, str) or not value or value.strip() != value or "%" in value:
        return None
    return _parse_ip(str(value))  # str(): a Yaml11Bool is never an IP, but keep the key plain


# The schema's format check, the per-kind checks and the model each parse the same address
# in turn (three times per endpoint); the objects are immutable, so a small memo serves.
@lru_cache(maxsize=4096)
def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if leading_zero_octet(value):
        return None
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return None
    return ip


def parse_cidr(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A CIDR (host bits allowed, as kube's ParseCIDRSloppy does), or None."""
    if not isinstance(value, str) or "/" not in value or "%" in value or value.strip() != value:
        return None
    addr, _, bits = value.partition("/")
    if parse_ip(addr) is None or not bits.isdigit() or (len(bits) > 1 and bits[0] == "0"):
        return None
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None
