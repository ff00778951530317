"""Schema errors as plain sentences, and the two small types every check reports through.

Shared by the manifest checks (validate.py) and the node config (config.py): one mapping
from a jsonschema error to "what is wrong and what to do", so both read the same.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from reconciler.intake.load import Document, locate
from reconciler.intake.parse import YAML11_FALSE, YAML11_TRUE
from reconciler.intake.problems import ERROR, UNKNOWN_FIELD, Problem, field_path, safe_name, show, unknown_field
from reconciler.intake.schemas import canonical_cidr, cidr_hint, ip_hint, parse_ip, special_ip, trim_space


SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_FORMAT_WORDS = {
    "ip": "a valid IP address (IPv4 like 10.96.0.10 without leading zeros, or IPv6 like fd00::10)",
    "ipv4": "a valid IPv4 address (like 10.96.0.10, without leading zeros)",
    "ipv6": "a valid IPv6 address (like fd00::10)",
    "cidr": "a valid CIDR (like 10.0.0.0/8 or fd00::/64, without leading zeros)",
}
_NONSPECIAL = {"ip-nonspecial": ("ip", None), "ipv4-nonspecial": ("ipv4", 4), "ipv6-nonspecial": ("ipv6", 6)}
_TYPE_WORDS = {"integer": "a whole number", "string": "a string", "object": "a mapping", "array": "a list",
               "boolean": "true or false", "number": "a number", "null": "null"}



def _what(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    for t, word in (
        (str, "a string"), (int, "a whole number"), (float, "a number"), (dict, "a mapping"),
        (list, "a list"), (type(None), "null")
    ):
        if isinstance(value, t):
            return word
    return f"a YAML {type(value).__name__}"


@dataclass
class Obj:
    """One document with its identity, as the checks see it."""

    doc: Document
    kind: str
    namespace: str
    name: str
    valid: bool = True

    @property
    def label(self) -> str:  # safe for one-line messages
        if self.kind == "ServiceCIDR":
            return safe_name(self.name)
        return f"{safe_name(self.namespace)}/{safe_name(self.name)}"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Report:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, o: Obj, path: tuple, message: str, severity: str = ERROR, *, key: bool = False, code: str = "") -> None:
        line, col = locate(o.doc, path, key=key)
        self.problems.append(Problem(o.doc.file, line, col, o.kind, o.label, field_path(path), message, severity, code))


# --- schema errors -> plain sentences ------------------------------------------------------


def schema_problem(rep: Report, o: Obj, err, *, own: bool = False) -> None:
    """One jsonschema error as plain sentences in `rep`. `own`: nftrec's own formats (the
    node config, the probe annotation), whose unknown keys are errors and `x-` keys are
    ignored; a Kubernetes kind's unknown fields carry UNKNOWN_FIELD for settle()."""
    path = tuple(err.absolute_path)
    v, inst, kind = err.validator, err.instance, err.validator_value
    desc = err.schema.get("description") if isinstance(err.schema, dict) else None
    if v == "required":
        # jsonschema reports each missing property as its own error, all with the whole list
        for name in kind:
            if isinstance(inst, dict) and name not in inst and err.message == f"{name!r} is a required property":
                if name == SERVICE_NAME_LABEL or (name == "labels" and o.kind == "EndpointSlice"):
                    msg = (f"the label {SERVICE_NAME_LABEL} is missing (metadata.labels); it names the Service this slice belongs to, "
                           "add it (without it kube-proxy ignores the slice)")
                else:
                    msg = f"{name} is required but missing; add it"
                _add_missing(rep, o, path, name, msg)
        return
    if v == "additionalProperties":
        allowed = err.schema.get("properties", {})
        for name in inst:
            if name in allowed:
                continue
            if not own:
                rep.add(o, path + (name,), unknown_field(path + (name,), allowed), key=True, code=UNKNOWN_FIELD)
            elif not str(name).startswith("x-"):
                rep.add(o, path + (name,), f"unknown key {show(name)}; remove it or fix its spelling "
                        "(keys starting with x- are ignored)", key=True)
        return
    if v == "type":
        types = kind if isinstance(kind, list) else [kind]
        want = " or ".join(_TYPE_WORDS.get(t, t) for t in types if t != "null")
        msg = f"must be {want}, not {_what(inst)} ({show(inst)}){_type_hint(inst, types, o.kind)}"
    elif v in ("enum", "const"):
        options = kind if v == "enum" else [kind]
        msg = f"{show(inst)} is not allowed; use {desc or ' or '.join(show(x) for x in options)}"
    elif v == "format" and kind in _NONSPECIAL:
        msg = ip_message(inst, *_NONSPECIAL[kind])
    elif v == "format" and kind == "cidr-canonical":
        canon = canonical_cidr(inst)
        if canon is None:
            msg = f"{show(inst)} is not {_FORMAT_WORDS['cidr']}{cidr_hint(inst)}"
        else:
            msg = f"{show(inst)} is not in canonical form (the network address, as Kubernetes requires for ServiceCIDRs); write {canon}"
    elif v == "format" and kind == "cidr-padded":  # spaces around it are fine: hint on the rest
        msg = f"{show(inst)} is not {_FORMAT_WORDS['cidr']}{cidr_hint(trim_space(inst))}"
    elif v == "format":
        msg = f"{show(inst)} is not {_FORMAT_WORDS.get(kind, kind)}"
        if kind in ("ip", "ipv4", "ipv6"):
            msg += ip_hint(inst)
        elif kind == "cidr":
            msg += cidr_hint(inst)
    elif v == "pattern":
        msg = f"{show(inst)} is not {desc or 'in the expected form'}"
        types = err.schema.get("type") if isinstance(err.schema, dict) else None
        if isinstance(inst, str) and inst.isdigit() and isinstance(types, list) and "integer" in types:
            msg += "; a port number is written without quotes"
        msg += _non_ascii_hint(inst)
    elif v in ("minimum", "maximum"):
        msg = f"{show(inst)} is out of range; it must be {desc or ('at least ' if v == 'minimum' else 'at most ') + str(kind)}"
    elif v in ("maxLength", "minLength"):
        msg = f"{show(inst)} has {len(inst)} characters; it must be " + \
              (f"at most {kind}" if v == "maxLength" else f"at least {kind}") + (f" ({desc})" if desc else "")
    elif v in ("maxItems", "minItems"):
        msg = f"has {len(inst)} entries; it must have " + (f"at most {kind}" if v == "maxItems" else f"at least {kind}")
    elif v == "uniqueItems":
        msg = "lists the same value twice; list each once"
    elif v in ("anyOf", "oneOf"):
        msg = f"{show(inst)} is not {desc or 'valid here'}" + (cidr_hint(inst) if isinstance(inst, str) and "/" in inst else ip_hint(inst))
    else:
        msg = " ".join(str(err.message).split())[:200]
    rep.add(o, path, msg)


def _type_hint(inst: object, types: list, kind: str) -> str:
    if isinstance(inst, bool) and "string" in types:
        return "; YAML reads plain true, false (and, to kubectl, yes, no, on, off) as booleans, so quote it"
    if not isinstance(inst, str):
        return ""
    if "integer" in types and re.fullmatch(r"[-+]?0[0-9_]+", inst.strip()):
        return ("; a number written with a leading zero is ambiguous (kubectl reads 010 as octal 8, YAML 1.2 as "
                "decimal 10), so nftrec refuses it: write it without the leading zero")
    if "integer" in types and inst.strip().isdigit():
        return "; write it without quotes"
    if "boolean" in types and inst in YAML11_TRUE | YAML11_FALSE:
        word = "true" if inst in YAML11_TRUE else "false"
        if kind == "NodeConfig":  # nftrec's own file, read as YAML 1.2 (config.py)
            return f"; write {word} (the node config is YAML 1.2, which reads {inst} as a string)"
        # a plain yes reaches here only quoted: validate reads the unquoted one as kubectl does
        return f"; write {word} (quoted, {show(inst)} is a string to kubectl too)"
    return ""


def _non_ascii_hint(inst: object) -> str:
    if not isinstance(inst, str):
        return ""
    odd = next((c for c in inst if not c.isascii()), None)
    if odd is None:
        return ""
    return (f"; it contains the non-ASCII character {odd!r} (U+{ord(odd):04X} {unicodedata.name(odd, 'UNNAMED')}), "
            "which may only look like an ASCII one: retype it")


def ip_message(inst: object, fmt: str, version: int | None) -> str:
    """The message for an endpoint or external IP that failed its format (see schemas.py)."""
    ip = parse_ip(inst) if isinstance(inst, str) else None
    if ip is None:
        return f"{show(inst)} is not {_FORMAT_WORDS[fmt]}{ip_hint(inst)}"
    if version is not None and ip.version != version:
        have, want = f"IPv{ip.version}", f"IPv{version}"
        return f"{show(inst)} is an {have} address but the slice's addressType is {want}; put it in a slice of that address type"
    why = special_ip(ip) or "is not allowed here"
    return f"{show(inst)} {why}; Kubernetes refuses such addresses for endpoints and external IPs: use a routable address"


def _add_missing(rep: Report, o: Obj, path: tuple, name: str, msg: str) -> None:
    line, col = locate(o.doc, path)
    rep.problems.append(Problem(o.doc.file, line, col, o.kind, o.label, field_path(path + (name,)), msg, ERROR))
