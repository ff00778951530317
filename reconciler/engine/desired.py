"""The front half of the pipeline, shared by render, plan, apply and watch:
manifests + node config → validated model → desired ruleset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from reconciler import logs, progress
from reconciler.intake import Inventory, NodeConfig
from reconciler.compile import NftSyntaxError, Ruleset

if TYPE_CHECKING:
    from reconciler.intake import ManifestSource


@dataclass(frozen=True)
class Desired:
    inventory: Inventory
    config: NodeConfig
    ruleset: Ruleset | None  # None: read with compile=False, compiled by plan/apply (apply.plan_desired)
    input_digest: str | None = None  # content digest of the manifest tree read
    config_digest: str | None = None  # intake.config_digest of `config` (after discovery)
    verdict: object = None  # intake.Verdict of the revision's signature when `verify` is set
    trust: str | None = None  # how `verify` accepted it (desired.trust_of)
    source: ManifestSource | None = None  # what was read (a saved plan verifies its revision there again)

    @property
    def revision(self) -> str:
        return self.inventory.revision


def _in_target(netns: str | None, fn):
    """`fn` as a function that runs in the namespace nftrec acts on, not the host's."""
    if netns is None:
        return fn

    def in_netns():
        from reconciler.kernel import NamespaceThread  # no nft context: only the namespace

        thread = NamespaceThread(netns)
        try:
            return thread.call(fn)
        finally:
            thread.close()

    return in_netns


def node_ip_discovery(netns: str | None):
    """Discover the node's primary IPs in the namespace nftrec acts on, not the host's."""
    from reconciler.intake import discover_node_ips

    return _in_target(netns, discover_node_ips)


def node_address_discovery(netns: str | None):
    """List the node's interface addresses (nodePortAddresses) in the target namespace."""
    from reconciler.intake import discover_host_addresses

    return _in_target(netns, discover_host_addresses)


def load_config(config_path: Path | None, netns: str | None, *, interfaces: bool = True,
                cache_dir: Path | None = None, nft=None, fields: str | None = None):
    """(the effective node config, problems): what compile sees, with node IPs, (unless
    `interfaces` is False: render) the interface addresses discovered in the target
    namespace, and the spellings its nft accepts (nft_spelling; through `nft`, the caller's
    open Interface, if any). The no-op fast path digests exactly this. `cache_dir`: the
    node config's settings cache (intake.read_settings), and the discovery remembered there
    (Remembered). `fields`: --field-validation, which overrides the config's fieldValidation."""
    from dataclasses import replace

    from reconciler.intake import load_node_config

    ips, addresses = node_ip_discovery(netns), node_address_discovery(netns) if interfaces else None
    if cache_dir is not None:
        remembered = Remembered(cache_dir / f"discovery-{netns or 'host'}.json", netns)
        ips = remembered.wrap("nodeIPs", ips)
        addresses = remembered.wrap("hostAddresses", addresses) if addresses is not None else None
    cfg, problems = load_node_config(str(config_path) if config_path else None, discover_ips=ips,
                                     discover_addresses=addresses, cache_dir=cache_dir)
    # render too: its script is for this nft (a dry run in the namespace; nftrec's own
    # spellings when nft cannot be asked)
    cfg = replace(cfg, field_validation=fields) if fields else cfg
    return replace(cfg, spelling=nft_spelling(netns, cache_dir, nft)), problems


def nft_spelling(netns: str | None, cache_dir: Path | None, nft=None):
    """The spellings the target namespace's nft accepts (kernel.Spellings: probed once, then
    remembered in `cache_dir`). Through `nft` when given: libnftables before 1.0 cannot
    have two contexts in one process (Libnftables), so a caller holding one passes it;
    else a context of its own, closed before returning. nftrec's own spellings when no
    context can be made (the command that needs one says why)."""
    from reconciler.intake import NftSpelling
    from reconciler.kernel import Libnftables, NftError, SecondContext, Spellings, netns_cookie

    store = Spellings(cache_dir / f"nft-{netns or 'host'}.json" if cache_dir is not None else None)
    if nft is not None:
        try:
            return store.get(nft)
        except NftError as e:
            logs.log.debug(f"nft spellings not probed ({e}); assuming nftrec's own")
            return NftSpelling()
    try:
        known = store.lookup(_in_target(netns, netns_cookie)())  # a remembered answer: no context
    except (NftError, OSError):
        known = None
    if known is not None:
        return known
    try:
        own = Libnftables(netns)
    except SecondContext:
        raise
    except (NftError, OSError) as e:
        logs.log.debug(f"nft spellings not probed ({e}); assuming nftrec's own")
        return NftSpelling()
    try:
        return store.get(own)
    except NftError as e:  # not remembered: the command says why when it uses nft itself
        logs.log.debug(f"nft spellings not probed ({e}); assuming nftrec's own")
        return NftSpelling()
    finally:
        own.close()


# iproute2's JSON view of everything address discovery reads (intake.discover_node_ips,
# discover_host_addresses): links (index -> name), addresses (with their flags: a deprecated
# or tentative IPv6 address changes the source address a route lookup picks), routes of
# every table (default routes, their prefsrc and gateway; what `route get` resolves),
# nexthop objects (a route may name one) and the policy rules of both families.
_IP_BATCH = "link show\naddr show\nroute show table all\nnexthop show\nrule show\n"
# fields that count down or move without changing any address or route
_VOLATILE = frozenset({"valid_life_time", "preferred_life_time", "expires", "used"})


def network_fingerprint(netns: str | None) -> str | None:
    """A digest of the target namespace's links, addresses, routes and rules as `ip -j`
    lists them, or None when `ip` cannot tell (then discovery runs). A change detector
    only: /proc/net has no complete view (no prefsrc, no interface of a local address),
    and one `ip -batch` process is cheaper than importing pyroute2, which discovery uses."""
    import hashlib
    import json
    import subprocess

    ns = ["-n", netns] if netns else []
    h = hashlib.sha256()
    try:
        for argv, stdin in ((["ip", *ns, "-j", "-batch", "-"], _IP_BATCH), (["ip", *ns, "-6", "-j", "rule", "show"], None)):
            p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=10)
            if p.returncode != 0 or p.stderr:
                return None
            text, at = p.stdout, 0
            while text[at:].strip():  # -batch: one JSON document per command, one per line
                rest = text[at:].lstrip()
                doc, at = json.JSONDecoder().raw_decode(text, len(text) - len(rest))
                h.update(json.dumps(_stable(doc), sort_keys=True).encode() + b"\0")
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return h.hexdigest()


def _stable(doc):
    if isinstance(doc, dict):
        return {k: _stable(v) for k, v in doc.items() if k not in _VOLATILE}
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


class Remembered:
    """Address discovery remembered across runs while network_fingerprint() of the target
    namespace stays the same: a no-op `plan` then needs neither pyroute2 nor its netlink
    dumps. A fingerprint is taken before and after a discovery and the result kept only
    when both agree, so a change during the discovery is never remembered as the old
    state. The file is JSON (data, never code); a damaged one is ignored."""

    def __init__(self, path: Path, netns: str | None, fingerprint=network_fingerprint):
        self.path, self.netns, self._fingerprint = path, netns, fingerprint
        self._fp: str | None = None
        self._taken = False

    def fingerprint(self) -> str | None:
        if not self._taken:
            self._fp, self._taken = self._fingerprint(self.netns), True
        return self._fp

    def wrap(self, key: str, discover):
        def remembered():
            fp = self.fingerprint()
            entry = self._read() if fp is not None else {}
            if fp is not None and entry.get("fingerprint") == fp and key in entry:
                logs.log.debug(f"{key}: the namespace's links, addresses and routes are unchanged; "
                               f"using the addresses discovered before ({self.path})")
                return _decode(key, entry[key])
            value = discover()
            if fp is not None and self._fingerprint(self.netns) == fp:
                kept = entry if entry.get("fingerprint") == fp else {"format": 1, "fingerprint": fp}
                self._write({**kept, key: [list(v) if isinstance(v, tuple) else v for v in value]})
            return value

        return remembered

    def _read(self) -> dict:
        import json

        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            logs.log.debug(f"ignoring {self.path}: {e}")
            return {}
        ok = isinstance(doc, dict) and doc.get("format") == 1 and isinstance(doc.get("fingerprint"), str)
        for key in ("nodeIPs", "hostAddresses"):
            if ok and key in doc and _decode(key, doc[key]) is None:
                ok = False
        if not ok:
            logs.log.debug(f"ignoring {self.path}: not a discovery record of this nftrec")
            return {}
        return doc

    def _write(self, doc: dict) -> None:
        import json

        from reconciler.atomic import atomic_write

        try:
            atomic_write(self.path, json.dumps(doc, sort_keys=True).encode(), 0o600, durable=False)
        except OSError as e:
            logs.log.debug(f"discovery not remembered ({e})")


def _decode(key: str, value):
    """The recorded value as discovery returns it, or None when it is not one."""
    if not isinstance(value, list):
        return None
    if key == "nodeIPs":
        return tuple(value) if all(isinstance(v, str) for v in value) else None
    if all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in value):
        return tuple((a, b) for a, b in value)
    return None


class InvalidInput(Exception):
    """The manifests or the node config have errors (each already logged)."""

    record = True  # recorded as the revision's failed attempt (status shows it)

    def __init__(self, revision: str, errors: int, directory: Path):
        self.revision, self.errors = revision, errors
        again = " with the same input" if str(directory) == "-" else ""  # stdin is not there to read again
        super().__init__(f"{errors} error(s) in the input of revision {revision or '-'}; nothing was "
                         f"changed. Run `nftrec validate {directory}`{again} for the full report.")


class Unverified(InvalidInput):
    """`verify` refused the revision (record: True), or cannot be used as configured."""

    def __init__(self, revision: str, message: str, *, record: bool = True):
        Exception.__init__(self, message)
        self.revision, self.errors, self.record = revision, 1, record


def after_verify(directory: Path) -> None:
    """Called between the verification and the parse (a test seam: a writer's swap)."""


def judge(verifier, directory: Path, baseline, allow_rollback: bool = False, held=None):
    """`verifier`'s Verdict on the revision at `directory` against `baseline` (an
    intake.Baseline: commits.rollback_baseline). With no baseline (nothing applied yet)
    a good signature is enough: trusted on first use, said in a warning (the operator
    checks that revision), and recorded (trust_of) so that `status` says so too."""
    extra = {"held": held} if held is not None else {}  # git's: the blobs the watch holds already
    verdict = verifier.check(directory, baseline, allow_rollback=allow_rollback, **extra)
    if verdict.ok and baseline is None:
        logs.log.warning(f"{verdict.describe()}; trusted on first use: no applied revision is recorded (state: "
                         "commits.jsonl, status.json), so nothing could be checked for a rollback; make sure "
                         "this is the revision you meant to apply")
    elif verdict.rollback_allowed:  # said once, in the log the operator keeps
        logs.log.warning(verdict.describe())
    elif verdict.ok and verdict.message:  # which rollback rule let it through (history cut off)
        logs.log.info(verdict.describe())
    return verdict


def trust_of(verdict, baseline) -> str | None:
    """How a revision was accepted under `verify`, as the records keep it: signed,
    first-use (no baseline) or allow-rollback; None without `verify`."""
    if verdict is None:
        return None
    return "first-use" if baseline is None else "allow-rollback" if verdict.rollback_allowed else "signed"


def check_signed(config: NodeConfig, source: ManifestSource, baseline, allow_rollback: bool):
    """(the intake.Verdict on the revision of `source`, trust_of it) when `verify` is set,
    else (None, None); Unverified when it is refused or `verify` cannot be used (nothing
    read or applied). `baseline`: commits.rollback_baseline. The verifier is the source
    kind's, never chosen by what lies in the tree."""
    if config.verify is None:
        return None, None
    from reconciler.intake import TrustError

    if source.refused is not None:  # an OCI artifact refused before its layer was fetched
        verdict = source.refused
        raise Unverified(verdict.revision, f"{verdict.describe()}; nothing was changed")
    try:
        with source.verifier(config.verify) as verifier:
            verdict = judge(verifier, source.root, baseline, allow_rollback)
    except TrustError as e:
        raise Unverified("", f"configuration error: {e}; nothing was changed", record=False) from None
    if not verdict.ok:
        raise Unverified(verdict.revision, f"{verdict.describe()}; nothing was changed")
    return verdict, trust_of(verdict, baseline)


def load_desired(directory: Path, config_path: Path | None, *, strict: bool = False, fields: str | None = None,
                 netns: str | None = None, interfaces: bool = True, cache_dir: Path | None = None,
                 compile: bool = True, config_cache: Path | None = None, signed: tuple | None = None,
                 source: ManifestSource | None = None, refuse_empty: bool = False,
                 identity: Callable | None = None) -> Desired:
    """Read, validate and compile, logging every problem. Raises InvalidInput when the
    input has errors: invalid input is never applied. interfaces=False (render): the
    node's interface addresses are not listed; nodeIPs stand in for them. `cache_dir`:
    the intake cache; `config_cache`: the node config's (load_config). compile=False (plan,
    apply): the ruleset is left None, for apply.plan_desired to compile against the last
    applied one (only what changed). `signed` (plan, apply): (the rollback baseline,
    allow rollback) for check_signed on `source` (default: `directory` as a directory
    argument), run before the manifests are read: with a git checkout, what is parsed is
    then the verified commit's files (Verdict.files). `refuse_empty` (plan, apply): no
    Service at all is an error unless the node config sets allowEmpty (intake.no_services).
    `identity` (render: --node, --labels): a function of the node config that sets who
    the node is (intake/nodeidentity.py); a fleet root is read as that node's."""
    from reconciler.compile import compile_ruleset
    from reconciler.intake import (ManifestSource, config_digest, display_root, identity_of, no_services, read_inventory,
                                   read_verified)

    config, config_problems = load_config(config_path, netns, interfaces=interfaces, cache_dir=config_cache,
                                          fields=fields)
    if identity is not None:
        config = identity(config)
    verdict = trust = None
    source = source or ManifestSource(str(directory), Path(directory))
    if signed is not None and not any(p.is_error for p in config_problems):
        verdict, trust = check_signed(config, source, *signed)
        after_verify(directory)
    if verdict is not None and verdict.files is not None:  # exactly the verified commit's bytes
        result = read_verified(verdict.files, strict=strict, fields=config.field_validation, cache_dir=cache_dir,
                               identity=identity_of(config))
    else:
        result = read_inventory(directory, strict=strict, fields=config.field_validation, cache_dir=cache_dir,
                                identity=identity_of(config))
    if verdict is not None and result.inventory.revision != verdict.revision:  # git-sync swapped in between
        raise Unverified(result.inventory.revision, f"revision {result.inventory.revision[:12]} was published while "
                         f"revision {verdict.revision[:12]} was verified; it was not applied: run again")
    problems = list(config_problems) + list(result.problems)
    if refuse_empty and not config.allow_empty and not any(p.is_error for p in problems):
        problems += filter(None, [no_services(len(result.inventory.services), display_root(directory))])
    for p in problems:
        logs.problem(p)
    errors = sum(p.severity == "error" for p in problems)
    if errors:
        raise InvalidInput(result.inventory.revision, errors, directory)
    if not compile:
        _warn_loopback(config)
        return Desired(result.inventory, config, None, result.digest, config_digest(config, strict=strict), verdict,
                       trust, source)
    try:
        with progress.step(f"compiling {len(result.inventory.services)} Services"):
            ruleset = compile_ruleset(result.inventory, config)
    except NftSyntaxError as e:  # defence in depth: validation should have refused it
        logs.log.error(f"{directory}: refusing input that would reach nft unsafely: {e}")
        raise InvalidInput(result.inventory.revision, 1, directory) from None
    _warn_loopback(config)
    return Desired(result.inventory, config, ruleset, result.digest, config_digest(config, strict=strict), verdict,
                       trust, source)


def _warn_loopback(config: NodeConfig) -> None:
    """kube-proxy logs loopback addresses inside nodePortAddresses and skips them."""
    from reconciler.compile import FAMILIES, select_nodeport_ips

    for family in FAMILIES:
        try:
            sel = select_nodeport_ips(config.node_port_addresses, config.node_ips,
                                      config.host_addresses if config.host_addresses is not None
                                      else tuple(("nodeIPs", ip) for ip in config.node_ips), family)
        except ValueError:
            return
        if sel.loopback:
            logs.log.warning(f"nodePortAddresses includes localhost ({', '.join(sel.loopback)}) but localhost "
                             f"NodePorts are not supported; skipped, as kube-proxy does")
