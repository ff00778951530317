"""Where a command's manifests come from (an intake.ManifestSource): a directory as given,
or an `oci://` reference pulled into the state directory (intake.oci: every digest
checked, signatures before the layer under `verify`, unpacked safely) and read from the
artifact's own tree.
One-shot commands never publish: `<store>/current` is what a running `nftrec watch`
follows (daemon/fetcher.py publishes it), and a `validate` of another tag of the same
repository must not move it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from reconciler.engine.target import CommandError

if TYPE_CHECKING:
    from reconciler.intake import ManifestSource

KEEP = 3  # artifacts kept in a store besides the current and the last applied one (rollback)

_in_use: set[str] = set()  # digests this process is reading (`diff` of two artifacts): never pruned
_open = ExitStack()  # the sources a command reads, released when the process exits
atexit.register(_open.close)


def is_source(argument: str | Path | None) -> bool:
    """Whether a command argument names an OCI artifact (not a directory)."""
    from reconciler.intake import is_oci

    return is_oci(argument if isinstance(argument, str) else None)


def source_error(argument: str, e) -> CommandError:
    """A SourceError as the one line a command prints (its message says what to do)."""
    return CommandError(f"cannot fetch {argument} ({e.reason}): {e.message}; nothing was changed")


def reference(argument: str):
    """The parsed reference; a bad one is a CommandError naming it."""
    from reconciler.intake import SourceError, parse_reference

    try:
        return parse_reference(argument)
    except SourceError as e:
        raise source_error(argument, e) from None


def _writable(base: Path) -> bool:
    try:
        (base / "oci").mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(base / "oci", os.W_OK | os.X_OK)


@contextmanager
def manifest_root(argument: str, config_path: Path | None, state_dir: Path, *, private: bool = False,
                  verify: bool = False, last_applied: Callable[[], str | None] | None = None,
                  config_cache: Path | None = None) -> Iterator[ManifestSource]:
    """The ManifestSource to read for `argument`: a directory as given, or the tree of the
    artifact an `oci://` reference names now (resolved with one HEAD request, pulled unless
    already in `<state_dir>/oci/...`, old ones pruned but never the last applied one).
    `private` (validate, render, diff, trace: no root needed): when `state_dir` is not writable,
    a private temporary directory, removed afterwards. `verify` (plan, apply): with the node
    config's `verify`, cosign's signatures are checked before the layer is fetched (a refused
    artifact: ManifestSource.refused, nothing unpacked). `config_cache`: the node config's
    settings cache. A SourceError or an unusable `verify` is a CommandError naming the
    reference."""
    from reconciler.intake import ManifestSource

    if not is_source(argument):
        yield ManifestSource(argument, Path(argument))
        return
    from reconciler.intake import (OCI, Refused, SourceError, TrustError, load_node_config, named_digest, prune, pull,
                                   resolve, store_for, verifier_for)

    ref = reference(argument)
    temp = None
    base = Path(state_dir)
    if not _writable(base):
        if not private:
            raise CommandError(f"cannot write the state directory {base / 'oci'} to fetch {argument} into; "
                               f"run as root or give --state-dir")
        temp = base = Path(tempfile.mkdtemp(prefix="nftrec-oci-"))
    try:
        cfg, _ = load_node_config(str(config_path) if config_path else None, discover=False,
                                  cache_dir=None if temp else config_cache)
        check = None
        if verify and cfg.verify is not None:
            try:
                check = verifier_for(cfg.verify, OCI).require_signed
            except TrustError as e:
                raise CommandError(f"configuration error: {e}; nothing was changed") from None
        store = store_for(base, ref)
        try:
            digest = resolve(ref, cfg.oci)
            artifact = pull(ref, cfg.oci, store, digest=digest, signatures=check is not None, check=check)
        except SourceError as e:
            raise source_error(argument, e) from None
        except Refused as e:  # nothing fetched beyond the manifest and its signatures
            yield ManifestSource(argument, e.path, oci=True, refused=e.verdict)
            return
        _in_use.add(artifact.digest)
        protect = set(_in_use)
        kept = named_digest(last_applied()) if last_applied is not None else None
        if kept:
            protect.add(kept)
        try:
            prune(store, keep=KEEP, protect=frozenset(protect))
        except OSError:
            pass  # an old artifact left behind is no reason to fail the command
        yield ManifestSource(argument, artifact.path, oci=True)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def command_source(argument: str, config_path: Path | None, state_root: Path, target=None):
    """manifest_root for a command: with its Target (plan, apply) in the namespace's state
    directory, signatures pulled for `verify`, the last applied artifact kept; without one
    (validate, render, diff, trace) in the state root, or a private temporary directory."""
    from reconciler.engine.noop import config_cache_dir

    cache = config_cache_dir(state_root)
    if target is None:
        return manifest_root(argument, config_path, state_root, private=True, config_cache=cache)
    from reconciler.engine.state import read_status

    return manifest_root(argument, config_path, target.store().dir, verify=True, config_cache=cache,
                         last_applied=lambda: read_status(target.store()).last_applied_revision)


def open_source(argument: str, config_path: Path | None, state_root: Path, target=None) -> ManifestSource:
    """command_source's ManifestSource, its tree kept until the process exits (a private
    temporary copy is removed then)."""
    return _open.enter_context(command_source(argument, config_path, state_root, target))
