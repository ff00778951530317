"""Property: with `verify`, whatever is done to a signed checkout's worktree (files
modified, added, deleted, hidden from git with skip-worktree, untracked), the desired
ruleset is the signed commit's, or nothing is applied.

Real git and SSH keys; load_desired in a throwaway namespace (no commit to the kernel).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_verify_signed import SERVICE, Repo, config, git, needs_ssh, ssh_key

pytestmark = [pytest.mark.kernel, needs_ssh]

FILES = ("web.yaml", "a.yaml", "d/b.yaml", "d/e/c.yml")
EDITS = st.lists(st.tuples(st.sampled_from(["modify", "add", "delete", "skip-worktree", "untracked"]),
                           st.sampled_from(FILES), st.integers(20, 250)), min_size=1, max_size=6)


def service(name: str, ip: str) -> str:
    return SERVICE.format(ip=ip).replace("name: web", f"name: {name}")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("props")
    ops = ssh_key(tmp / "keys", "ops")
    repo = Repo(tmp)
    repo.use_ssh(ops)
    for i, f in enumerate(FILES[1:], 1):
        (repo.src / f).parent.mkdir(parents=True, exist_ok=True)
        (repo.src / f).write_text(service(f"s{i}", f"10.96.1.{i}"))
    sha = repo.commit("10.96.0.10")
    wt = repo.publish(sha)
    return repo, wt, config(tmp, ops.with_suffix(".pub"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS)
def test_worktree_edits_never_reach_the_ruleset(checkout, netns, edits):
    from reconciler.engine.desired import InvalidInput, load_desired

    repo, wt, cfg = checkout
    want = load_desired(repo.current, cfg, netns=netns, signed=(None, False))
    assert len(want.inventory.services) == len(FILES) and want.ruleset is not None
    try:
        for what, f, n in edits:
            path = wt / f
            if what == "modify" and path.exists():
                path.write_text(service(f"m{n}", f"10.96.2.{n}"))
            elif what == "add":
                extra = path.with_name(f"new-{n}.yaml")
                extra.parent.mkdir(parents=True, exist_ok=True)
                extra.write_text(service(f"n{n}", f"10.96.3.{n}"))
                git(wt, "add", str(extra.relative_to(wt)))
            elif what == "delete" and path.exists():
                path.unlink()
            elif what == "skip-worktree" and path.exists():
                git(wt, "update-index", "--skip-worktree", f)
                path.write_text(service(f"k{n}", f"10.96.4.{n}"))
            elif what == "untracked":
                extra = path.with_name(f"untracked-{n}.json")
                extra.parent.mkdir(parents=True, exist_ok=True)
                extra.write_text('{"kind": "Service"}')
        try:
            got = load_desired(repo.current, cfg, netns=netns, signed=(None, False))
        except InvalidInput:
            return  # nothing applied
        assert got.revision == want.revision and got.ruleset == want.ruleset
        assert got.inventory.services == want.inventory.services
    finally:
        git(wt, "update-index", "--no-skip-worktree", *FILES)
        git(wt, "reset", "-q", "--hard")
        git(wt, "clean", "-q", "-fdx")
