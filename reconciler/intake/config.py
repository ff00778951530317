"""The node config: one small YAML file per node, outside the manifest repo.

`load_node_config(path)` reads, validates (schemas/nodeconfig.json: unknown keys are
errors except `x-` ones) and fills in defaults: nodeName = hostname, nodeIPs = the
primary address per family found with pyroute2 (none found: that family is left out).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import replace
from pathlib import Path
from typing import Callable

from reconciler.intake import model
from reconciler.intake.healthchecks import parse_health_check
from reconciler.intake.load import Document, SourceFile, locate, plain_data
from reconciler.intake.parse import MAX_FILE_BYTES, Refused, check_shape, decode_text, yaml_error
from reconciler.intake.problems import ERROR, Problem, show

DEFAULT_PATH = "/etc/nftrec/config.yaml"
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: str | int | float) -> float:
    """Go-style durations ("1s", "500ms", "1m30s", "1h") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    if not text or _DURATION_RE.sub("", text) != "":
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_RE.findall(text))


def discover_node_ips(ipr=None) -> tuple[str, ...]:
    """The primary address per family: the source address of the default route (its
    `src`, else the kernel's choice towards its gateway, else the first global address of
    its device), else the first global address. No address: the family is left out.
    `ipr`: an open pyroute2 IPRoute (of the namespace to look in); default: a new one."""
    if ipr is None:
        from pyroute2 import IPRoute  # imported late: validate/render never need it

        with IPRoute() as ipr:
            return discover_node_ips(ipr)
    from reconciler.intake.schema_files import parse_ip

    out = []
    for af in (socket.AF_INET, socket.AF_INET6):
        found = None
        for r in ipr.get_default_routes(family=af):
            found = r.get_attr("RTA_PREFSRC")
            gw, oif = r.get_attr("RTA_GATEWAY"), r.get_attr("RTA_OIF")
            if not found and gw:
                try:  # a route lookup only: RTM_GETROUTE sends no packet
                    found = next((x.get_attr("RTA_PREFSRC") for x in ipr.route("get", dst=gw, family=af)), None)
                except Exception:
                    found = None
            if not found and oif:
                found = _first_global(ipr, af, index=oif)
            if found:
                break
        found = found or _first_global(ipr, af)
        if found and parse_ip(found) is not None:
            out.append(str(parse_ip(found)))
    return tuple(out)


def discover_host_addresses(ipr=None) -> tuple[tuple[str, str], ...]:
    """Every address on the node's interfaces as (ifname, address), sorted: the input of
    kube-proxy's GetNodeIPs (net.InterfaceAddrs: every interface, `lo` included, every
    scope). `ipr` as in discover_node_ips."""
    if ipr is None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return discover_host_addresses(ipr)
    from reconciler.intake.schema_files import parse_ip

    names = {link["index"]: link.get_attr("IFLA_IFNAME") or str(link["index"]) for link in ipr.get_links()}
    out = set()
    for a in ipr.get_addr():
        # IFA_LOCAL first: on a point-to-point link IFA_ADDRESS is the peer (as Go reads it)
        ip = parse_ip(a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS") or "")
        if ip is not None:
            out.add((names.get(a["index"], str(a["index"])), str(ip)))
    return tuple(sorted(out))


def _first_global(ipr, af: int, **match) -> str | None:
    for a in ipr.get_addr(family=af, **match):
        if a["scope"] == 0:  # RT_SCOPE_UNIVERSE: not link-local, not loopback
            return a.get_attr("IFA_ADDRESS")
    return None


def _problem(file: str, line: int, col: int, fld: str, message: str) -> Problem:
    return Problem(file, line, col, "NodeConfig", "", fld, message, ERROR)


def load_node_config(
    path: str | None,
    *,
    discover: bool = True,
    hostname: Callable[[], str] = socket.gethostname,
    discover_ips: Callable[[], tuple[str, ...]] = discover_node_ips,
    discover_addresses: Callable[[], tuple[tuple[str, str], ...]] | None = None,
    cache_dir: Path | None = None,
) -> tuple[model.NodeConfig, list[Problem]]:
    """(config, problems). path=None: DEFAULT_PATH if it exists, else all defaults.
    discover=False leaves nodeIPs empty when not configured (validate, render tests).
    discover_addresses (plan, apply, watch: in the target namespace) lists the node's
    interface addresses for nodePortAddresses; None: nodeIPs stand in for them (render).
    `cache_dir`: keep the checked settings there, keyed by the file's bytes (read_settings)."""
    shown = str(path) if path is not None else DEFAULT_PATH
    exists = path is not None or Path(DEFAULT_PATH).is_file()
    settings, problems = read_settings(shown if exists else None, cache_dir)
    if settings is None:
        return _defaults(hostname, (), shown), problems
    node_ips = tuple(settings["nodeIPs"])
    discovered = False
    if not settings["hasNodeIPs"] and discover:
        try:
            node_ips = discover_ips()
            discovered = True
        except Exception as e:  # discovery is best effort; say so, do not fail
            problems.append(Problem(shown, 0, 0, "NodeConfig", "", "nodeIPs",
                                    f"could not discover this node's addresses ({show(str(e))}); set nodeIPs", "warning"))
    host_addresses = None
    if discover and discover_addresses is not None:
        try:
            host_addresses = tuple(discover_addresses())
        except Exception as e:  # best effort: nodeIPs stand in, as for render
            problems.append(Problem(shown, 0, 0, "NodeConfig", "", "nodePortAddresses",
                                    f"could not list this node's interface addresses ({show(str(e))}); "
                                    f"nodeIPs stand in for them", "warning"))
    periods = settings["periods"]
    cfg = model.NodeConfig(
        node_name=settings["nodeName"] or _hostname(hostname),
        node_labels=tuple(sorted(settings["nodeLabels"].items())),
        node_ips=node_ips,
        cluster_cidrs=tuple(settings["clusterCIDRs"]),
        service_cidrs=tuple(settings["serviceCIDRs"]),
        node_port_addresses=tuple(settings["nodePortAddresses"]),
        host_addresses=host_addresses,
        node_ips_discovered=discovered,
        masquerade_all=settings["masqueradeAll"],
        masquerade_bit=settings["masqueradeBit"],
        table_name=settings["tableName"],
        layout=settings["layout"],
        zone=settings["zone"],
        derive_topology_hints=settings["deriveTopologyHints"],
        field_validation=settings["fieldValidation"],
        allow_empty=settings["allowEmpty"],
        removal_guard=settings["removalGuard"],
        min_sync_period=periods["minSyncPeriod"],
        sync_period=periods["syncPeriod"],
        full_sync_period=periods["fullSyncPeriod"],
        health_checks=tuple(model.HealthCheck(kind, target) for kind, target in settings["healthChecks"]),
        health_check_timeout=periods["healthCheckTimeout"],
        verify=model.Verify(v["mode"], tuple(v["keys"]), v["allowRollback"]) if (v := settings["verify"]) else None,
        oci=model.OciSettings(**settings["oci"]),
        status=model.StatusSettings(st["remote"], st["sshKey"]) if (st := settings["status"]) else None,
        source=model.Source(shown, 1, 1) if settings["fromFile"] else model.Source("<defaults>"),
    )
    return cfg, problems


# --- the checked settings, and their cache ---------------------------------------------------
#
# Reading the node config means ruamel's position-keeping ("rt") loader and the JSON Schema validator,
# whose imports cost as much as the rest of a no-op `plan`. The settings of a file that had
# no problem at all are kept in the state directory (intake/store.py), keyed by the file's
# bytes and the code digest, so an unchanged file is read and hashed, not parsed or
# validated. A file with any problem is never cached: it is checked, and reported, every
# time. Discovery and the default node name (the hostname) are not part of the settings:
# they are looked up on every run.

_CACHE_KEEP = 8  # entries kept (one per config file content; a node has one or two)
_SETTINGS_TYPES = {
    "nodeName": str, "nodeLabels": dict, "hasNodeIPs": bool, "nodeIPs": list, "clusterCIDRs": list, "serviceCIDRs": list,
    "nodePortAddresses": list, "masqueradeAll": bool, "masqueradeBit": int, "tableName": str, "layout": str,
    "zone": str, "deriveTopologyHints": bool, "fieldValidation": str, "allowEmpty": bool, "removalGuard": int,
    "periods": dict, "healthChecks": list, "fromFile": bool, "verify": (dict, type(None)),
    "oci": dict, "status": (dict, type(None)),
}
_OCI_TYPES = {"interval": float, "insecure": bool, "ca_file": str, "credentials_file": str, "max_size": int}
_SIZE_UNITS = {"": 1, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
_PERIODS = (("minSyncPeriod", 1.0), ("syncPeriod", 30.0), ("fullSyncPeriod", 3600.0), ("healthCheckTimeout", 30.0))


def parse_size(value: int | str) -> int:
    """A size in bytes: a number, or one with a unit as Kubernetes writes them (100Mi, 1Gi,
    500M); the schema has checked the spelling."""
    m = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|K|M|G)?", str(value))
    return int(m.group(1)) * _SIZE_UNITS[m.group(2) or ""] if m else int(value)


def read_settings(path: str | None, cache_dir: Path | None = None) -> tuple[dict | None, list[Problem]]:
    """(the config file's checked settings, problems); None when it cannot be used (an
    unreadable file, a schema error: the defaults stand in). path=None: no file, the
    defaults. With `cache_dir`, problem-free settings are kept there and reused."""
    problems: list[Problem] = []
    raw = b""
    if path is not None:
        raw = _read_bytes(path, problems)
        if raw is None:
            return None, problems
    if cache_dir is None:
        return _check(path, raw)
    from reconciler.intake.store import Cache, Corrupt, decode, entry_key

    cache = Cache(cache_dir, "node config cache", _CACHE_KEEP)
    key = entry_key("nodeconfig", b"defaults" if path is None else b"file\0" + raw)
    lines = cache.get(key)
    if lines is not None:
        try:
            settings = decode(lines[0], dict) if len(lines) == 1 else None
        except Corrupt:
            settings = None
        if _valid_settings(settings):
            cache.finish()
            return settings, problems
        cache.ignore(key, "not the settings of a node config file")
    settings, problems = _check(path, raw)
    if settings is not None and not problems and _valid_settings(json.loads(json.dumps(settings))):
        cache.put(key, [settings])  # only what a read gives back as it was
        cache.finish()
    return settings, problems


def _valid_settings(s: object) -> bool:
    if not isinstance(s, dict) or set(s) != set(_SETTINGS_TYPES):
        return False
    if any(type(s[k]) not in (t if isinstance(t, tuple) else (t,)) for k, t in _SETTINGS_TYPES.items()):
        return False
    strings = s["nodeIPs"] + s["clusterCIDRs"] + s["serviceCIDRs"] + s["nodePortAddresses"]
    return (all(isinstance(x, str) for x in strings)
            and all(isinstance(hc, list) and len(hc) == 2 and all(isinstance(x, str) for x in hc)
                    for hc in s["healthChecks"])
            and set(s["periods"]) == {k for k, _ in _PERIODS}
            and all(type(v) is float for v in s["periods"].values())
            and (s["verify"] is None or (set(s["verify"]) == {"mode", "keys", "allowRollback"}
                                         and all(isinstance(k, str) for k in s["verify"]["keys"])))
            and set(s["oci"]) == set(_OCI_TYPES) and all(type(s["oci"][k]) is t for k, t in _OCI_TYPES.items())
            and (s["status"] is None or (set(s["status"]) == {"remote", "sshKey"} and type(s["status"]["remote"]) is str
                                         and type(s["status"]["sshKey"]) in (str, type(None)))))


def _check(path: str | None, raw: bytes) -> tuple[dict | None, list[Problem]]:
    """Parse and validate: (settings, problems), settings None on a schema error."""
    from reconciler.intake.schema_errors import Obj, Report, schema_problem
    from reconciler.intake.schema_files import parse_cidr, parse_ip
    from reconciler.intake.schemas import validator

    problems: list[Problem] = []
    shown = path if path is not None else DEFAULT_PATH
    data, src = _read(shown, raw, problems) if path is not None else ({}, None)
    if problems:
        return None, problems
    doc = Document(data, model.Source(shown, 1, 1), shown, 0, (), src)
    rep = Report()
    o = Obj(doc, "NodeConfig", "", "")
    for err in validator("NodeConfig").iter_errors(data):
        schema_problem(rep, o, err, own=True)
    problems = [Problem(p.file, p.line, p.col, "NodeConfig", "", p.field, p.message, p.severity) for p in rep.problems]
    guard = data.get("removalGuard")
    if type(guard) is int:  # a count is not a share of the node's Services
        problems = [p if p.field != "removalGuard" else replace(p, message=f"is a share of the applied Services: write "
                    f"{guard}% (100% turns the guard off); a count of Services is not accepted") for p in problems]
    periods = {}
    for key, default in _PERIODS:
        periods[key] = default
        if key in data and not any(p.field == key for p in problems):
            periods[key] = parse_duration(data[key])
            if key != "minSyncPeriod" and periods[key] <= 0:
                line, _ = _locate(doc, key)
                problems.append(_problem(shown, line, 1, key, f"must be longer than 0s; use e.g. {'1h' if key == 'fullSyncPeriod' else '30s'}"))
    oci = dict(data.get("oci") or {})
    interval = 60.0
    if "interval" in oci and not any(p.field.startswith("oci") for p in problems):
        interval = parse_duration(oci["interval"])
        if interval <= 0:
            line, col = locate(doc, ("oci", "interval"))
            problems.append(_problem(shown, line, col, "oci.interval", "must be longer than 0s; use e.g. 1m"))
    problems.sort(key=lambda p: (p.line, p.col))
    if any(p.is_error for p in problems):
        return None, problems
    node_ips = [str(parse_ip(ip)) for ip in data.get("nodeIPs") or []]
    if len(node_ips) == 2 and (":" in node_ips[0]) == (":" in node_ips[1]):
        line, col = _locate(doc, "nodeIPs")
        problems.append(_problem(shown, line, col, "nodeIPs", "lists two addresses of one family; give at most one IPv4 and one IPv6 address"))
    npa = data.get("nodePortAddresses") or []
    if "primary" in npa and len(npa) != 1:
        line, col = locate(doc, ("nodePortAddresses", npa.index("primary")))
        problems.append(_problem(shown, line, col, f"nodePortAddresses[{npa.index('primary')}]",
                                 "can't use both 'primary' and CIDRs (kube-proxy's rule): give [primary] "
                                 "alone, or CIDRs that include the primary address"))
    health_checks = []
    for i, item in enumerate(data.get("healthChecks") or []):
        (kind, value), = item.items()  # the schema allows one key per item
        try:
            hc = parse_health_check(kind, value)
            health_checks.append([hc.kind, hc.target])
        except ValueError as e:
            line, col = locate(doc, ("healthChecks", i))
            problems.append(_problem(shown, line, col, f"healthChecks[{i}].{kind}", str(e)))
    settings = {
        "nodeName": str(data.get("nodeName") or ""),
        "nodeLabels": {str(k): str(v) for k, v in (data.get("nodeLabels") or {}).items()},
        "hasNodeIPs": "nodeIPs" in data,
        "nodeIPs": node_ips,
        "clusterCIDRs": [str(parse_cidr(c)) for c in data.get("clusterCIDRs") or []],
        "serviceCIDRs": [str(parse_cidr(c)) for c in data.get("serviceCIDRs") or []],
        "nodePortAddresses": [a if a == "primary" else str(parse_cidr(a)) for a in npa] or ["primary"],
        "masqueradeAll": bool(data.get("masqueradeAll", False)),
        "masqueradeBit": int(data.get("masqueradeBit", 14)),
        "tableName": str(data.get("tableName", "nftrec")),
        "layout": str(data.get("layout", "sharded")),
        "zone": str(data.get("zone", "")),
        "deriveTopologyHints": bool(data.get("deriveTopologyHints", True)),
        "fieldValidation": str(data.get("fieldValidation", "Strict")).lower(),
        "allowEmpty": bool(data.get("allowEmpty", False)),
        "removalGuard": int(str(data.get("removalGuard", "50%")).rstrip("%")),
        "periods": {k: float(v) for k, v in periods.items()},
        "healthChecks": health_checks,
        "fromFile": bool(data),
        "verify": None if "verify" not in data else {
            "mode": str(data["verify"].get("mode", "HEAD")),
            "keys": [str(k) for k in data["verify"]["keys"]],
            "allowRollback": bool(data["verify"].get("allowRollback", False)),
        },
        "oci": {"interval": float(interval), "insecure": bool(oci.get("insecure", False)),
                "ca_file": str(oci.get("caFile", "")), "credentials_file": str(oci.get("credentialsFile", "")),
                "max_size": parse_size(oci.get("maxSize", 100 << 20))},
        "status": None if "status" not in data else {
            "remote": str(data["status"]["remote"]),
            "sshKey": str(data["status"]["sshKey"]) if "sshKey" in data["status"] else None,
        },
    }
    return settings, problems


def _locate(doc: Document, key: str) -> tuple[int, int]:
    return locate(doc, (key,))


def _hostname(hostname: Callable[[], str]) -> str:
    return hostname().split(".")[0].lower() if hostname() else "localhost"


def _defaults(hostname, node_ips, shown) -> model.NodeConfig:
    return model.NodeConfig(node_name=_hostname(hostname), node_ips=node_ips)


def _read_bytes(path: str, problems: list[Problem]) -> bytes | None:
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        problems.append(_problem(path, 0, 0, "", f"cannot read the node config ({e.strerror}); check --config"))
        return None
    if len(raw) > MAX_FILE_BYTES:
        problems.append(_problem(path, 0, 0, "", f"this file is over the {MAX_FILE_BYTES}-byte limit; a node config is a few lines"))
        return None
    return raw


def _read(path: str, raw: bytes, problems: list[Problem]) -> tuple[dict, SourceFile | None]:
    """The config as plain data, and the file kept for locate()."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        text = decode_text(raw)
        yaml = YAML(typ="rt")  # tiny file: the "rt" loader keeps positions
        docs = [d for d in yaml.load_all(text) if d is not None]
        for d in docs:
            check_shape(d, 1, 1)  # alias bombs, depth, non-string keys
    except Refused as r:
        problems.append(_problem(path, r.line, r.col, "", r.message))
        return {}, None
    except YAMLError as e:
        r = yaml_error(e)
        problems.append(_problem(path, r.line, r.col, "", r.message))
        return {}, None
    except RecursionError:
        problems.append(_problem(path, 0, 0, "", "nesting is too deep; a node config is a flat mapping"))
        return {}, None
    if len(docs) > 1:
        problems.append(_problem(path, 0, 0, "", "holds several YAML documents; a node config is one mapping"))
        return {}, None
    src = SourceFile(path, path, text)
    if not docs:
        return {}, src
    if not isinstance(docs[0], dict):
        problems.append(_problem(path, 1, 1, "", "must be a mapping (nodeName: ..., nodeIPs: [...]), not a list or a single value"))
        return {}, None
    return plain_data(docs[0]), src
