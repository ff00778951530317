"""The JSON Schemas in schemas/ (one per accepted kind) as compiled validators.

The schemas live at the top of the repo; a wheel ships them to share/nftrec/schemas.
Each validator is built once (jsonschema compiles lazily, so reuse is what makes 10,000
documents fast) and carries a format checker with nftrec's strict IP/CIDR formats.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator, FormatChecker

# kind -> schema file
KINDS = {
    "Service": "service.json",
    "EndpointSlice": "endpointslice.json",
    "Endpoints": "endpoints.json",
    "ServiceCIDR": "servicecidr.json",
    "NodeConfig": "nodeconfig.json",
}


def schema_dir() -> Path:
    candidates = [
        Path(__file__).resolve().parent.parent / "schemas",  # a checkout
        Path(sys.prefix) / "share" / "nftrec" / "schemas",  # an installed wheel
        Path(sys.base_prefix) / "share" / "nftrec" / "schemas",
    ]
    for c in candidates:
        if (c / "service.json").is_file():
            return c
    raise FileNotFoundError("nftrec's schemas/ directory is missing; reinstall nftrec")


# --- strict IP formats ---------------------------------------------------------------------


def parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP in any family, or None. Rejects what kube's strict parser rejects: leading
    zeros (010.0.0.1: octal or decimal?), zones (fe80::1%eth0), whitespace."""
    if not isinstance(value, str) or not value or value.strip() != value or "%" in value:
        return None
    try:
        return ipaddress.ip_address(value)  # Python >= 3.9.5 refuses IPv4 leading zeros
    except ValueError:
        return None


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


FORMATS = FormatChecker(formats=())


@FORMATS.checks("ip")
def _is_ip(value) -> bool:
    return not isinstance(value, str) or parse_ip(value) is not None


@FORMATS.checks("ipv4")
def _is_ipv4(value) -> bool:
    return not isinstance(value, str) or isinstance(parse_ip(value), ipaddress.IPv4Address)


@FORMATS.checks("ipv6")
def _is_ipv6(value) -> bool:
    return not isinstance(value, str) or isinstance(parse_ip(value), ipaddress.IPv6Address)


@FORMATS.checks("cidr")
def _is_cidr(value) -> bool:
    return not isinstance(value, str) or parse_cidr(value) is not None


@lru_cache(maxsize=None)
def load_schema(kind: str) -> dict:
    with open(schema_dir() / KINDS[kind], encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def validator(kind: str) -> Draft202012Validator:
    """The one compiled validator for a kind (KeyError for kinds without a schema)."""
    return Draft202012Validator(load_schema(kind), format_checker=FORMATS)
