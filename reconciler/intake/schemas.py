"""The JSON Schemas in schemas/ (one per accepted kind) as compiled validators.

The schemas live at the top of the repo; a wheel ships them to share/nftrec/schemas.
Each validator is built once (jsonschema compiles lazily, so reuse is what makes many
documents fast) and carries a format checker with nftrec's strict IP/CIDR formats.
"""

from __future__ import annotations

import ipaddress
import json
from functools import lru_cache

from jsonschema import Draft202012Validator, FormatChecker, validators

from reconciler.intake.schema_files import leading_zero_octet, parse_cidr, parse_ip, schema_dir

# kind -> schema file
KINDS = {
    "Service": "service.json",
    "EndpointSlice": "endpointslice.json",
    "Endpoints": "endpoints.json",
    "ServiceCIDR": "servicecidr.json",
    "NodeConfig": "nodeconfig.json",
    "Fleet": "fleet.json",
    "NodeInventory": "nodeinventory.json",
}


# --- strict IP formats ---------------------------------------------------------------------


def special_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why Kubernetes refuses ip as an endpoint or external IP (ValidateNonSpecialIP), or None."""
    if ip.is_unspecified:
        return f"may not be unspecified ({ip})"
    if ip.is_loopback:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if ip.is_link_local:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    p = ip.packed
    if (ip.version == 4 and p[:3] == bytes((224, 0, 0))) or (ip.version == 6 and p[0] == 0xFF and p[1] & 0x0F == 0x02):
        return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
    return None


def ip_hint(value: object) -> str:
    """Why a string is not an acceptable IP, as advice to append to a message ("" if none)."""
    if not isinstance(value, str):
        return ""
    if value.strip() != value:
        return "; remove the spaces around it"
    if "%" in value:
        return "; IPv6 zone ids (like %eth0) are not allowed: remove the zone"
    if "/" in value:
        return "; this is a CIDR, but a single address is wanted here: drop the /prefix"
    addr = value.split("/")[0]
    if leading_zero_octet(addr):
        return "; remove the leading zeros"
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return (f"; IPv4-mapped IPv6 addresses are not allowed (Kubernetes counts them as IPv4, nft as IPv6): "
                f"write {ip.ipv4_mapped}")
    return ""


# Go's unicode.IsSpace: what strings.TrimSpace removes (ASCII and Unicode white space).
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def trim_space(value: str) -> str:
    """Go's strings.TrimSpace. Kubernetes trims loadBalancerSourceRanges entries with it
    before validating them (ValidateService), and kube-proxy again before using them."""
    return value.strip(GO_SPACE)


def parse_padded_cidr(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """parse_cidr after trim_space: a loadBalancerSourceRanges entry, as Kubernetes reads it.
    Only the trimmed, canonical network ever reaches the model and nft."""
    return parse_cidr(trim_space(value)) if isinstance(value, str) else None


def cidr_hint(value: object) -> str:
    """Why a string is not an acceptable CIDR, as advice to append to a message ("" if none)."""
    if not isinstance(value, str):
        return ""
    if "/" not in value:
        return "; a CIDR needs a prefix length, like /32 for one IPv4 address or /128 for one IPv6 address" if parse_ip(value) else ip_hint(value)
    addr, _, bits = value.partition("/")
    hint = ip_hint(addr)
    if hint:
        return hint
    ip = parse_ip(addr)
    if bits.isdigit() and len(bits) > 1 and bits[0] == "0":
        return "; remove the leading zero of the prefix length"
    if ip is not None and bits.isdigit() and int(bits) > ip.max_prefixlen:
        return f"; the prefix length of an IPv{ip.version} CIDR is at most {ip.max_prefixlen}"
    return ""


def canonical_cidr(value: str) -> str | None:
    """The canonical text of a CIDR (network address, RFC 5952), or None if not a CIDR."""
    net = parse_cidr(value)
    return None if net is None else str(net)


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


def _nonspecial(value, version: int | None) -> bool:
    if not isinstance(value, str):
        return True
    ip = parse_ip(value)
    return ip is not None and (version is None or ip.version == version) and special_ip(ip) is None


@FORMATS.checks("ip-nonspecial")
def _is_ip_nonspecial(value) -> bool:
    return _nonspecial(value, None)


@FORMATS.checks("ipv4-nonspecial")
def _is_ipv4_nonspecial(value) -> bool:
    return _nonspecial(value, 4)


@FORMATS.checks("ipv6-nonspecial")
def _is_ipv6_nonspecial(value) -> bool:
    return _nonspecial(value, 6)


@FORMATS.checks("cidr-canonical")
def _is_cidr_canonical(value) -> bool:
    return not isinstance(value, str) or canonical_cidr(value) == value


@FORMATS.checks("cidr-padded")
def _is_cidr_padded(value) -> bool:
    return not isinstance(value, str) or parse_padded_cidr(value) is not None


@FORMATS.checks("cidr")
def _is_cidr(value) -> bool:
    return not isinstance(value, str) or parse_cidr(value) is not None


@lru_cache(maxsize=None)
def load_schema(kind: str) -> dict:
    with open(schema_dir() / KINDS[kind], encoding="utf-8") as f:
        return json.load(f)


def _is_integer(checker, instance) -> bool:
    # JSON Schema counts 80.0 as an integer; Kubernetes' int32 fields do not, and a float
    # must never reach the ruleset as a port
    return isinstance(instance, int) and not isinstance(instance, bool)


_Validator = validators.extend(
    Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


# --- a lean descend for schemas without references ------------------------------------------
#
# jsonschema's descend() builds a new validator object for every subschema it enters, on
# every instance (evolve(): attrs __init__, validator_for, and a referencing resolver for
# the subresource): about 40 per Service, most of the cost of validating many documents.
# For a schema that holds no reference ($ref, $dynamicRef, $anchor, nested $id), the
# resolver is never consulted, so the validator for a subschema is the same object every
# time: _LeanValidator builds it once and keeps it. Everything else (the keyword functions,
# the errors and their paths) is jsonschema's own code, unchanged.

_REF_KEYWORDS = frozenset({"$ref", "$dynamicRef", "$recursiveRef", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$id"})


def _has_references(schema, top: bool = True) -> bool:
    if isinstance(schema, dict):
        if any(k in _REF_KEYWORDS and not (top and k == "$id") for k in schema):
            return True
        return any(_has_references(v, False) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_references(v, False) for v in schema)
    return False


def _lean_descend(self, instance, schema, path=None, schema_path=None, resolver=None):
    """Validator.descend (jsonschema 4.x) with the subschema's validator built once."""
    if schema is True:
        return
    if schema is False or resolver is not None or self._ref_resolver is not None:
        yield from _PLAIN_DESCEND(self, instance, schema, path, schema_path, resolver)
        return
    kind = type(instance)
    if kind in _SCALARS:  # a leaf that this subschema accepted before: accepted again
        memo = (id(schema), kind, instance)
        if memo in _VALID_LEAVES:
            return
    entry = _EVOLVED.get(id(schema))
    if entry is None or entry[0] is not schema or entry[1].format_checker is not self.format_checker:
        evolved = self.evolve(schema=schema)
        entry = _EVOLVED[id(schema)] = (schema, evolved, evolved._validators)
    _, evolved, keywords = entry
    failed = False
    for validator, k, v in keywords:
        errors = validator(evolved, v, instance, schema) or ()
        for error in errors:
            # as jsonschema's descend: set details if not already set by the called function
            error._set(validator=k, validator_value=v, instance=instance, schema=schema,
                       type_checker=evolved.TYPE_CHECKER)
            if k not in {"if", "$ref"}:
                error.schema_path.appendleft(k)
            if path is not None:
                error.path.appendleft(path)
            if schema_path is not None:
                error.schema_path.appendleft(schema_path)
            yield error
            failed = True
    if kind in _SCALARS and not failed:
        if len(_VALID_LEAVES) >= 16_384:  # bounded (~2 MB): names and IPs are unique; "TCP", 80, true recur
            _VALID_LEAVES.clear()
        _VALID_LEAVES.add(memo)


def check_jsonschema() -> None:
    """Raise RuntimeError when the installed jsonschema lacks an internal _lean_descend
    uses (pyproject.toml bounds jsonschema to the versions tested), rather than validate
    differently: descend's parameters, a validator's `_validators` (keyword function,
    keyword, value) and `_ref_resolver`, and ValidationError._set."""
    import inspect
    from importlib import metadata

    from jsonschema.exceptions import ValidationError

    probe = _Validator({"type": "integer"})
    missing = [name for name, ok in (
        ("Validator.descend(instance, schema, path, schema_path, resolver)",
         list(inspect.signature(_Validator.descend).parameters)[:6] ==
         ["self", "instance", "schema", "path", "schema_path", "resolver"]),
        ("Validator._validators", isinstance(getattr(probe, "_validators", None), (list, tuple))
         and all(isinstance(t, tuple) and len(t) == 3 and callable(t[0]) for t in probe._validators)),
        ("Validator._ref_resolver", hasattr(probe, "_ref_resolver")),
        ("Validator.evolve", callable(getattr(probe, "evolve", None))),
        ("ValidationError._set", callable(getattr(ValidationError, "_set", None))),
    ) if not ok]
    if missing:
        raise RuntimeError(f"jsonschema {metadata.version('jsonschema')} lacks {', '.join(missing)}, which nftrec's "
                           "validator relies on; install a jsonschema within nftrec's tested bounds")


check_jsonschema()
_PLAIN_DESCEND = _Validator.descend
# A scalar's result depends only on its subschema, its exact type (True == 1, and a
# Yaml11Bool is a str subclass the schema must see) and its value; formats are pure.
_SCALARS = frozenset({str, int, float, bool, type(None)})
_VALID_LEAVES: set[tuple] = set()  # (id(subschema), type, value) found valid
_EVOLVED: dict[int, tuple] = {}  # id(subschema) -> (subschema, its validator, its keywords); schemas live forever
_LeanValidator = validators.extend(_Validator)
_LeanValidator.descend = _lean_descend


@lru_cache(maxsize=None)
def validator(kind: str) -> Draft202012Validator:
    """The one compiled validator for a kind (KeyError for kinds without a schema)."""
    schema = load_schema(kind)
    if _has_references(schema):
        return _Validator(schema, format_checker=FORMATS)
    return _LeanValidator(schema, format_checker=FORMATS)
