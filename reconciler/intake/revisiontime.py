"""A revision's time, from which its rollout waves open (intake/rollout.py): the git
commit's committer time, read in-process from the object store (no git process, no
repository config), or the OCI artifact's `created` annotation (RFC 3339, parsed
strictly). With `verify` the verdict's signed time is taken as is. A plain directory
has no time (None): `decide` then opens the node's wave at once.
"""

from __future__ import annotations

import re
from pathlib import Path

from reconciler.intake.signatures import Verdict

_COMMIT = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


class RevisionTimeError(Exception):
    """The revision names a commit or an artifact whose time cannot be read."""


def revision_time(root: Path, revision: str, verdict: Verdict | None = None) -> float | None:
    """Unix seconds of `revision` (as git.revision_of names the tree at `root`): the
    verdict's signed time when `verdict` passed; an artifact's `created` (None when it has
    none); a commit's committer time (`<commit>+dirty:...`: the commit's); None for a
    plain directory's `sha256:` digest. RevisionTimeError when the commit cannot be read
    or `created` is not RFC 3339 (a revision with a time that cannot be read never opens
    every wave by accident)."""
    from reconciler.intake import oci

    if verdict is not None and verdict.ok and verdict.time is not None:
        return float(verdict.time)
    digest = oci.named_digest(revision)
    if digest is not None:
        artifact = oci.source_artifact(root)
        if artifact is None or artifact.digest != digest:
            return None  # a plain directory's content digest
        return _created(artifact)
    commit = revision.split("+dirty:")[0]
    if not _COMMIT.fullmatch(commit):
        return None
    return float(_commit_time(root, commit))


def _created(artifact) -> float | None:
    from reconciler.intake.cosign import created_at

    if not artifact.created.strip():
        return None
    when = created_at(artifact.created)
    if when is None:
        raise RevisionTimeError(f"artifact {artifact.name} has a created annotation that is not an RFC 3339 time "
                                f"({artifact.created.strip()[:64]!r}); push it again with a time such as "
                                "2026-12-06T10:00:00Z")
    return when.timestamp()


def _commit_time(root: Path, commit: str) -> int:
    from reconciler.intake.gitobjects import ObjectError, Store, find_checkout

    try:
        checkout = find_checkout(Path(root).resolve())
    except OSError as e:
        raise RevisionTimeError(f"cannot find the git checkout of {root} ({e})") from None
    if checkout is None:
        raise RevisionTimeError(f"{root} is not in a git checkout, so commit {commit[:12]}'s time cannot be read")
    try:
        with Store(checkout.common) as store:
            return store.commit(commit).commit_time
    except ObjectError as e:
        raise RevisionTimeError(f"cannot read the time of commit {commit[:12]}: {e}") from None
