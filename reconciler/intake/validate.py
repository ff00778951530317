"""Validation: JSON Schema per document, then Kubernetes' own per-object
rules, then checks across documents. Every finding is a Problem with file:line:col, the
object, the field path and a plain sentence; all are collected, not only the first.

Pipeline position: load -> **validate** -> model -> compile -> ...
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from reconciler.intake.load import Document, LoadResult, locate
from reconciler.intake.parse import Yaml11Bool
from reconciler.intake.probes import annotation_text as probe_annotation_text, check_annotation as check_probe_annotation, \
    check_ports as check_probe_ports
from reconciler.intake.problems import ERROR, FIELD_VALIDATION, NOTICE, UNKNOWN_FIELD, WARNING, Problem, field_path, safe_name, show
from reconciler.intake.schema_errors import SERVICE_NAME_LABEL, Obj, Report, ip_message, schema_problem
from reconciler.intake.schemas import parse_cidr, parse_ip, special_ip, validator
from reconciler.intake.sources import STDIN_DISPLAY

ACCEPTED = ("Service", "EndpointSlice", "Endpoints", "ServiceCIDR")


def family(ip: str) -> str:
    return "IPv4" if ":" not in ip else "IPv6"


@dataclass
class Checked:
    """What validation produced: problems, and the documents fit for the model."""

    problems: list[Problem]
    objects: list[Obj] = field(default_factory=list)  # accepted kinds, schema-valid
    documents: int = 0

    @property
    def ok(self) -> bool:
        return not any(p.is_error for p in self.problems)


# --- identity ----------------------------------------------------------------------------


def _identify(doc: Document, rep: Report, unknown: dict[str, list[Document]]) -> Obj | None:
    data = doc.data
    kind = data.get("kind")
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    name = meta.get("name", "")
    ns = meta.get("namespace") or "default"  # unset, null or "": the default namespace, as kubectl does
    name = name if isinstance(name, str) else str(name)
    ns = ns if isinstance(ns, str) else str(ns)
    shown = f"{safe_name(ns)}/{safe_name(name)}" if name else ""
    if not isinstance(kind, str) or not kind:
        what = "is missing" if kind is None else f"must be a string, not {show(kind)}"
        rep.problems.append(Problem(doc.file, doc.source.line, doc.source.col, "", shown, "kind",
                                    f"kind {what}; every object needs apiVersion and kind (e.g. apiVersion: v1, kind: Service)"))
        if "apiVersion" not in data:
            rep.problems.append(Problem(doc.file, doc.source.line, doc.source.col, "", shown, "apiVersion",
                                        "apiVersion is missing; add it (v1 for Service and Endpoints)"))
        return None
    if kind not in ACCEPTED:
        if "apiVersion" not in data:
            rep.problems.append(Problem(doc.file, doc.source.line, doc.source.col, safe_name(kind), shown, "apiVersion",
                                        "apiVersion is missing; every Kubernetes object needs one"))
        unknown.setdefault(kind, []).append(doc)
        return None
    return Obj(doc, kind, "" if kind == "ServiceCIDR" else ns, name)


# --- per-object rules (Kubernetes' validation the schema cannot express) -----------------


def _check_service(rep: Report, o: Obj) -> None:
    rep.problems.extend(check_probe_annotation(o.doc, o.kind, o.label))
    spec = o.doc.data.get("spec") or {}
    stype = spec.get("type", "ClusterIP")
    if stype == "ExternalName":
        if not spec.get("externalName"):
            rep.add(o, ("spec", "externalName"), "an ExternalName Service needs spec.externalName; add the DNS name it aliases")
        return
    cip, cips = spec.get("clusterIP"), spec.get("clusterIPs")
    headless = cip == "None" or (cips or [None])[0] == "None"
    if cips:
        if "None" in cips and len(cips) > 1:
            rep.add(o, ("spec", "clusterIPs"), '"None" must be the only entry of clusterIPs (a headless Service has no IPs)')
        if cip not in (None, "") and cip != cips[0] and str(parse_ip(cip)) != str(parse_ip(cips[0])):
            rep.add(o, ("spec", "clusterIP"), f"clusterIP {show(cip)} differs from clusterIPs[0] {show(cips[0])}; "
                    "clusterIP must equal the first entry of clusterIPs")
    if headless and stype in ("NodePort", "LoadBalancer"):
        rep.add(o, ("spec", "clusterIP"), f'a {stype} Service cannot be headless (clusterIP: None); use type ClusterIP or give it a clusterIP')
    ips = [] if headless else (cips or ([cip] if cip not in (None, "") else []))
    fams = spec.get("ipFamilies") or []
    ip_field = "clusterIPs" if cips else "clusterIP"
    for i, ip in enumerate(ips):
        path = ("spec", ip_field, i) if cips else ("spec", "clusterIP")
        fam = family(ip)
        if i < len(fams) and fams[i] != fam:
            rep.add(o, path, f"{show(ip)} is an {fam} address but spec.ipFamilies[{i}] is {fams[i]}; "
                    "make them agree (ipFamilies lists the families in clusterIPs order)")
        if i == 1 and family(ips[0]) == fam:
            rep.add(o, path, f"both clusterIPs are {fam}; a dual-stack Service has one IPv4 and one IPv6 address")
    if len(ips) == 2 and len(fams) == 1:
        rep.add(o, ("spec", "ipFamilies"), "lists one family but clusterIPs has two addresses; list both families")
    if spec.get("ipFamilyPolicy") == "SingleStack" and max(len(ips), len(fams)) > 1:
        rep.add(o, ("spec", "ipFamilyPolicy"), "is SingleStack but the Service has two families; use PreferDualStack or RequireDualStack")
    if spec.get("ipFamilyPolicy") == "RequireDualStack" and not headless and len(ips) == 1:
        rep.add(o, ("spec", "ipFamilyPolicy"), f"is RequireDualStack but the Service has only the {family(ips[0])} clusterIP "
                f"{show(ips[0])} and nftrec allocates none, so only {family(ips[0])} is programmed; add the other family's "
                "address to spec.clusterIPs, or use PreferDualStack or SingleStack", WARNING)
    if not headless and not ips:
        rep.add(o, ("spec", "clusterIP"), "no clusterIP is set and nftrec allocates none, so this Service gets no ClusterIP rules; "
                'set spec.clusterIP (from your service CIDR), or clusterIP: None for a headless Service', WARNING)
    ports = spec.get("ports") or []
    if not ports and not headless:
        rep.add(o, ("spec", "ports"), "a Service needs at least one port; add spec.ports")
    names: dict[str, int] = {}
    pp: dict[tuple, int] = {}
    for i, p in enumerate(ports):
        name, proto = p.get("name", ""), p.get("protocol", "TCP")
        if len(ports) > 1 and not name:
            rep.add(o, ("spec", "ports", i), "a Service with several ports must name every port; add a name")
        if name and name in names:
            rep.add(o, ("spec", "ports", i, "name"), f"port name {show(name)} is already used by spec.ports[{names[name]}]; names must be unique")
        names.setdefault(name, i)
        if (p["port"], proto) in pp:
            rep.add(o, ("spec", "ports", i, "port"), f"port {p['port']}/{proto} is already listed in spec.ports[{pp[(p['port'], proto)]}]; list it once")
        pp.setdefault((p["port"], proto), i)
        if p.get("nodePort") and stype == "ClusterIP":
            rep.add(o, ("spec", "ports", i, "nodePort"), "nodePort is only used by NodePort and LoadBalancer Services; remove it or change spec.type")
        if not p.get("nodePort") and stype == "NodePort":
            rep.add(o, ("spec", "ports", i), "no nodePort is set and nftrec allocates none, so this port gets no NodePort rules; "
                    "add nodePort (e.g. in 30000-32767)", WARNING)
    external = stype in ("NodePort", "LoadBalancer") or bool(spec.get("externalIPs"))
    if spec.get("externalTrafficPolicy") == "Local" and not external:
        rep.add(o, ("spec", "externalTrafficPolicy"), "Local only applies to Services reachable from outside "
                "(NodePort, LoadBalancer or with externalIPs); remove it or change spec.type")
    if spec.get("healthCheckNodePort") and not (stype == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"):
        rep.add(o, ("spec", "healthCheckNodePort"), "is only used by LoadBalancer Services with externalTrafficPolicy Local; remove it")
    aff = spec.get("sessionAffinityConfig", {}).get("clientIP", {}).get("timeoutSeconds")
    if aff is not None and spec.get("sessionAffinity", "None") != "ClientIP":
        # SetDefaults_Service drops it before validation, so the API server accepts it
        rep.add(o, ("spec", "sessionAffinityConfig"), "is ignored because sessionAffinity is not ClientIP (Kubernetes drops it "
                "too); set sessionAffinity: ClientIP or remove this", WARNING)


def _check_slice(rep: Report, o: Obj) -> None:
    _unique_port_names(rep, o, o.doc.data.get("ports") or [], ("ports",))
    for i, ep in enumerate(o.doc.data.get("endpoints") or []):
        hints = ep.get("hints") or {}
        for key, what in (("forZones", "zone"), ("forNodes", "node")):
            seen: dict[str, int] = {}
            for j, h in enumerate(hints.get(key) or []):
                name = h["name"]
                if name in seen:
                    rep.add(o, ("endpoints", i, "hints", key, j, "name"),
                            f"{what} {show(name)} is already hinted in endpoints[{i}].hints.{key}[{seen[name]}]; "
                            f"list each {what} once")
                seen.setdefault(name, j)


def _slice_addresses(rep: Report, o: Obj) -> None:
    """Each address against the slice's addressType (Kubernetes: IsValidIPv4Address /
    IsValidIPv6Address + ValidateNonSpecialIP). Runs even when the schema found other
    errors, so that every problem is reported at once; tolerates any shape."""
    data = o.doc.data
    at = data.get("addressType")
    endpoints = data.get("endpoints")
    if at not in ("IPv4", "IPv6") or not isinstance(endpoints, list):
        return
    version = 4 if at == "IPv4" else 6
    for i, ep in enumerate(endpoints):
        addresses = ep.get("addresses") if isinstance(ep, dict) else None
        if not isinstance(addresses, list):
            continue
        for j, a in enumerate(addresses):
            if not isinstance(a, str):
                continue  # the schema reports the type
            ip = parse_ip(a)
            if ip is None or ip.version != version or special_ip(ip) is not None:
                rep.add(o, ("endpoints", i, "addresses", j), ip_message(a, at.lower(), version))


def _unique_port_names(rep: Report, o: Obj, ports: list, base: tuple) -> None:
    seen: dict[str, int] = {}
    for i, p in enumerate(ports):
        name = p.get("name", "")
        if name in seen:
            rep.add(o, base + (i, "name"), f"port name {show(name)} is already used by {field_path(base)}[{seen[name]}]; names must be unique")
        seen.setdefault(name, i)


def _check_endpoints(rep: Report, o: Obj) -> None:
    for s, subset in enumerate(o.doc.data.get("subsets") or []):
        _unique_port_names(rep, o, subset.get("ports") or [], ("subsets", s, "ports"))


def _check_service_cidr(rep: Report, o: Obj) -> None:
    cidrs = o.doc.data["spec"]["cidrs"]
    if len(cidrs) == 2 and parse_cidr(cidrs[0]).version == parse_cidr(cidrs[1]).version:
        rep.add(o, ("spec", "cidrs", 1), "both CIDRs are of one family; a dual-stack ServiceCIDR has one IPv4 and one IPv6 CIDR")


_PER_KIND = {"Service": _check_service, "EndpointSlice": _check_slice, "Endpoints": _check_endpoints,
             "ServiceCIDR": _check_service_cidr}


# --- YAML 1.1 booleans --------------------------------------------------------------------


def _is_yaml11_boolean(err) -> bool:
    """A plain yes/no/on/off/y/n... where the schema wants a boolean: kubectl (go-yaml,
    YAML 1.1) reads a boolean there, so nftrec does too (a quoted "yes" is a string to
    both, and stays an error)."""
    types = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    return err.validator == "type" and isinstance(err.instance, Yaml11Bool) and "boolean" in types


def _with_value(data, path: tuple, value):
    """data with the value at path replaced. The containers on the way are copied, not
    changed: YAML aliases may share them with fields where the text must stay a string."""
    if not path:
        return value
    copy = dict(data) if isinstance(data, dict) else list(data)
    copy[path[0]] = _with_value(data[path[0]], path[1:], value)
    return copy


def _read_as_boolean(rep: Report, o: Obj, path: tuple, text: Yaml11Bool) -> None:
    word = "true" if text.boolean else "false"
    o.doc.data = _with_value(o.doc.data, path, text.boolean)
    rep.add(o, path, f"{show(str(text))} is read as {word}, as kubectl reads it (YAML 1.1; YAML 1.2 would read the "
            f"string {show(str(text))}); write {word}", WARNING)


# --- checks across documents --------------------------------------------------------------


# An IPv4 address already in the form str(ipaddress.ip_address(x)) gives back: dotted
# decimal, no leading zeros. ipaddress accepts exactly these octets, so for a match the
# canonical form is the text itself; _cross meets one per Service and LoadBalancer IP,
# and skipping ipaddress there is most of its cost.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_V4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def _canonical_ip(ip: str) -> str:
    return ip if _CANONICAL_V4.fullmatch(ip) else str(parse_ip(ip))


def _pick(d, keys: tuple) -> dict:
    return {k: d[k] for k in keys if k in d} if isinstance(d, dict) else d


_SVC_SPEC = ("type", "clusterIPs", "clusterIP", "externalIPs")
_SVC_PORT = ("name", "protocol", "port", "nodePort", "targetPort")
_SLICE_PORT = ("name", "protocol")


def cross_view(kind: str, data: dict) -> dict | None:
    """The part of a valid document that `_cross` and probes.check_ports read, as a
    smaller document of the same shape: run on it, they find exactly what they find on
    the whole one as long as they report nothing about it (a report needs positions, i.e.
    the whole document). The intake cache keeps it per document so an unchanged file's
    documents need not be decoded (intake/cache.py). None for a Service with a probe
    annotation (check_ports reads it; rare enough to take the whole document).
    Keep in step with `_cross`: every key it reads is copied here."""
    if kind == "Service":
        if probe_annotation_text(data) is not None:
            return None
        spec = data.get("spec")
        out: dict = {}
        if isinstance(spec, dict):
            s = _pick(spec, _SVC_SPEC)
            if "ports" in spec:
                ports = spec["ports"]
                s["ports"] = [_pick(p, _SVC_PORT) for p in ports] if isinstance(ports, list) else ports
            out["spec"] = s
        elif "spec" in data:
            out["spec"] = spec
        status = data.get("status")
        if "status" in data:
            lb = status.get("loadBalancer") if isinstance(status, dict) else None
            if isinstance(lb, dict):
                ing = lb.get("ingress")
                lb = {"ingress": [_pick(i, ("ip", "ipMode")) for i in ing] if isinstance(ing, list) else ing} \
                    if "ingress" in lb else {}
            out["status"] = {"loadBalancer": lb} if isinstance(status, dict) and "loadBalancer" in status \
                else ({} if isinstance(status, dict) else status)
        return out
    if kind == "EndpointSlice":
        out = {"metadata": {"labels": {SERVICE_NAME_LABEL: data["metadata"]["labels"][SERVICE_NAME_LABEL]}}}
        if "addressType" in data:
            out["addressType"] = data["addressType"]
        if "ports" in data:
            ports = data["ports"]
            out["ports"] = [_pick(p, _SLICE_PORT) for p in ports] if isinstance(ports, list) else ports
        return out
    if kind == "Endpoints":
        subsets = data.get("subsets")
        if not isinstance(subsets, list):
            return {"subsets": subsets} if "subsets" in data else {}
        return {"subsets": [{"ports": [_pick(p, _SLICE_PORT) for p in s["ports"]] if isinstance(s.get("ports"), list)
                             else s.get("ports")} if isinstance(s, dict) and "ports" in s else
                            ({} if isinstance(s, dict) else s) for s in subsets]}
    return {}  # ServiceCIDR: not cross-checked


def _cross(rep: Report, objs: list[Obj]) -> None:
    services = {o.key: o for o in objs if o.kind == "Service"}
    # Service IPs: ClusterIPs, externalIPs and LoadBalancer IPs share one map keyed by
    # ip . protocol . port, so two Services may not claim the same triple.
    claimed: dict[tuple, tuple[Obj, str]] = {}
    node_ports: dict[tuple, tuple[Obj, str]] = {}
    for o in services.values():
        spec = o.doc.data.get("spec") or {}
        if spec.get("type") == "ExternalName":
            continue
        ips: list[tuple[str, tuple]] = []
        if spec.get("clusterIPs") and spec["clusterIPs"][0] != "None":
            ips += [(ip, ("spec", "clusterIPs", i)) for i, ip in enumerate(spec["clusterIPs"])]
        elif spec.get("clusterIP") not in (None, "", "None") and not spec.get("clusterIPs"):
            ips.append((spec["clusterIP"], ("spec", "clusterIP")))
        ips += [(ip, ("spec", "externalIPs", i)) for i, ip in enumerate(spec.get("externalIPs") or [])]
        for i, ing in enumerate(((o.doc.data.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []):
            if ing.get("ip") and ing.get("ipMode") != "Proxy":
                ips.append((ing["ip"], ("status", "loadBalancer", "ingress", i, "ip")))
        for ip, path in ips:
            canon = _canonical_ip(ip)
            for p in spec.get("ports") or []:
                k = (canon, p.get("protocol", "TCP"), p["port"])
                first = claimed.get(k)
                if first and first[0] is not o:
                    other = first[0]
                    rep.add(o, path, f"{canon} port {k[2]}/{k[1]} is already claimed by Service {other.label} "
                            f"({other.doc.file}:{locate(other.doc, ())[0]}, {field_path(first[1])}); give one of them another IP or port")
                else:
                    claimed.setdefault(k, (o, path))  # a path, spelled out only for a message
        for i, p in enumerate(spec.get("ports") or []):
            if p.get("nodePort") and spec.get("type") in ("NodePort", "LoadBalancer"):
                k = (p["nodePort"], p.get("protocol", "TCP"))
                first = node_ports.get(k)
                if first:
                    where = "this Service" if first[0] is o else f"Service {first[0].label}"
                    rep.add(o, ("spec", "ports", i, "nodePort"), f"nodePort {k[0]}/{k[1]} is already used by {where} "
                            f"({field_path(first[1])}); every NodePort must be unique per protocol")
                else:
                    node_ports[k] = (o, ("spec", "ports", i, "nodePort"))
    # slices -> Services, and every Service port's endpoints findable by port name
    slice_ports: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for o in objs:
        if o.kind == "EndpointSlice":
            svc = o.doc.data["metadata"]["labels"][SERVICE_NAME_LABEL]
            key, path = f"{o.namespace}/{svc}", ("metadata", "labels", SERVICE_NAME_LABEL)
            if o.doc.data.get("addressType") == "FQDN":
                continue
            ports = o.doc.data.get("ports") or []
        elif o.kind == "Endpoints":
            key, path = o.key, ("metadata", "name")
            ports = [p for s in o.doc.data.get("subsets") or [] for p in s.get("ports") or []]
        else:
            continue
        if key not in services:
            rep.add(o, path, f"there is no Service {safe_name(o.namespace)}/{safe_name(key.split('/', 1)[1])} in the manifests, "
                    "so these endpoints are unused; add the Service or fix the name", WARNING)
        for p in ports:
            slice_ports[key].add((p.get("name", ""), p.get("protocol", "TCP")))
    for key, o in services.items():
        if key not in slice_ports:
            continue  # no endpoints at all: kube-proxy rejects traffic; nothing to resolve
        for i, p in enumerate((o.doc.data.get("spec") or {}).get("ports") or []):
            name, proto = p.get("name", ""), p.get("protocol", "TCP")
            if (name, proto) in slice_ports[key]:
                continue
            tp = p.get("targetPort")
            shown = show(name) if name else "'' (unnamed)"
            if isinstance(tp, str):
                rep.add(o, ("spec", "ports", i, "targetPort"),
                        f"targetPort {show(tp)} is a name, and no EndpointSlice of this Service has a port named {shown} "
                        f"with protocol {proto} to resolve it; add that port (the Service port's name, with the container's port number) to its slices")
            else:
                rep.add(o, ("spec", "ports", i), f"no EndpointSlice of this Service has a port named {shown} with protocol {proto}, "
                        "so this port has no endpoints; name the slice port like the Service port", WARNING)
    rep.problems.extend(check_probe_ports(services, slice_ports))


# --- driver -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentCheck:
    """What one document's own checks found; depends on nothing but the document, so
    the watch loop caches it per parsed document."""

    obj: Obj | None  # None: no object to build (unknown kind, or not identifiable)
    problems: tuple[Problem, ...]
    unknown_kind: str | None  # the kind, when the document was skipped as unknown


def check_document(doc: Document) -> DocumentCheck:
    """Schema and per-kind checks of one document."""
    rep = Report()
    unknown: dict[str, list[Document]] = {}
    o = _identify(doc, rep, unknown)
    if o is not None:
        booleans = []
        for err in validator(o.kind).iter_errors(doc.data):
            if _is_yaml11_boolean(err):
                booleans.append((tuple(err.absolute_path), err.instance))
            else:
                schema_problem(rep, o, err)
        for path, text in booleans:  # after the schema pass: it iterates over doc.data
            _read_as_boolean(rep, o, path, text)
        if o.kind == "EndpointSlice":
            _slice_addresses(rep, o)
        # warnings (the booleans above) do not block, nor unknown fields: settle() decides them
        if not any(p.is_error and not p.code for p in rep.problems):
            _PER_KIND[o.kind](rep, o)
        if any(p.is_error and not p.code for p in rep.problems):
            o.valid = False
    return DocumentCheck(o, tuple(rep.problems), next(iter(unknown), None))


def settle(problems: list[Problem], *, fields: str = "strict", strict: bool = False) -> list[Problem]:
    """The problems as the modes have them. Unknown fields (code UNKNOWN_FIELD) are errors
    under fields="strict", warnings under "warn", left out under "ignore"; `strict`
    (--strict) makes every other warning an error. The checks themselves never depend on
    the modes, so their results (and the intake cache's) serve every mode."""
    fields = fields.lower()
    if fields not in FIELD_VALIDATION:
        raise ValueError(f"field validation must be Strict, Warn or Ignore, not {fields!r}")
    out = []
    for p in problems:
        if p.code == UNKNOWN_FIELD:
            if fields == "ignore":
                continue
            p = replace(p, severity=ERROR if fields == "strict" else WARNING)
        elif strict and p.severity == WARNING:
            p = replace(p, severity=ERROR, message=p.message + " (--strict makes this warning an error)")
        out.append(p)
    return out


def check_tree(load_problems: list[Problem], documents: list[Document], results: list[DocumentCheck],
               *, strict: bool = False, fields: str = "strict") -> Checked:
    """The whole-tree part: duplicates, skipped-kind notices, cross-document checks, then
    the modes (settle). `results[i]` is `check_document(documents[i])`."""
    rep = Report()
    rep.problems.extend(load_problems)
    unknown: dict[str, list[Document]] = {}
    objs: list[Obj] = []
    seen: dict[tuple, Obj] = {}
    for doc, res in zip(documents, results):
        rep.problems.extend(res.problems)
        if res.unknown_kind == "Fleet":
            rep.problems.append(_misplaced_fleet(doc))
        elif res.unknown_kind is not None:
            unknown.setdefault(res.unknown_kind, []).append(doc)
        if res.obj is None:
            continue
        # a copy: the duplicate check may mark it invalid; the cached one stays (Obj's
        # fields spelled out: dataclasses.replace is much slower, and this runs per object)
        c = res.obj
        o = Obj(c.doc, c.kind, c.namespace, c.name, c.valid)
        ident = (o.kind, o.namespace, o.name)
        if ident in seen and o.name:
            first = seen[ident]
            rep.add(o, ("metadata", "name"), f"{o.kind} {o.label} is defined twice; the first is at "
                    f"{first.doc.file}:{first.doc.source.line}; keep one")
            o.valid = False
            continue
        seen.setdefault(ident, o)
        if o.valid:
            objs.append(o)
    for kind, docs in unknown.items():
        d = docs[0]
        n = len(docs)
        msg = (f"{n} object{'s' if n != 1 else ''} of kind {safe_name(kind)} "
               f"{'were' if n != 1 else 'was'} skipped; nftrec reads only {', '.join(ACCEPTED)}")
        if strict:
            rep.problems.append(Problem(d.file, d.source.line, d.source.col, safe_name(kind), "", "", msg + " (--strict makes this an error; remove them or drop --strict)"))
        else:
            rep.problems.append(Problem(d.file, d.source.line, d.source.col, safe_name(kind), "", "", msg + " (--strict makes this an error)", NOTICE))
    _cross(rep, objs)
    problems = sorted(settle(rep.problems, fields=fields, strict=strict), key=lambda p: (p.file, p.line, p.col))
    return Checked(problems, objs, len(documents))


def _misplaced_fleet(doc: Document) -> Problem:
    """A Fleet read as a manifest: its directory is a fleet root below the one read, and
    read as a plain tree it would give this node every layer. An error, never a notice."""
    if doc.file == STDIN_DISPLAY:
        where = "a fleet needs its directory tree: pipe a tar archive, e.g. `git archive HEAD | nftrec validate -`"
    else:
        where = (f"its directory {os.path.dirname(doc.file) or '.'} is a fleet repository below the "
                 "manifest root: point nftrec at that directory, so that each node reads only its own layers")
    return Problem(doc.file, doc.source.line, doc.source.col, "Fleet", "", "", where, ERROR)


def check(loaded: LoadResult, *, strict: bool = False, fields: str = "strict") -> Checked:
    """Validate every loaded document; the valid objects come back for the model."""
    return check_tree(loaded.problems, loaded.documents, [check_document(d) for d in loaded.documents],
                      strict=strict, fields=fields)


def no_services(services: int, shown: str) -> Problem | None:
    """An error when a revision holds no Service at all: applying it removes every Service
    from the node, which is what an empty helm render, a wrong mount or an empty working
    directory looks like. Headless and ExternalName Services count; `--allow-empty` or
    `allowEmpty: true` (a node that runs none) let it through; `cleanup` removes all."""
    if services:
        return None
    return Problem("", 0, 0, "", "", "", f"no Services in {shown}: applying it would remove every Service from "
                   f"this node; `--allow-empty` (or `allowEmpty: true` in the node config) applies it, and "
                   f"`nftrec cleanup` removes everything", ERROR)
