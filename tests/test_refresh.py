"""`plan --refresh` trusts nothing the state recorded: it lists the kernel and compiles
every Service from the inputs. With hand-made drift and an edit of the inputs it prints
the same plan whether the state directory holds the last apply's record, a damaged one,
or nothing at all, and nothing to do after a plain apply.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest


@pytest.mark.kernel
def test_refresh_plans_from_the_kernel_and_the_inputs_only(netns, tmp_path):
    from test_cli_kernel import _add_endpoint, copy_edge, nftrec, ok

    state = tmp_path / "state"
    d = copy_edge(tmp_path / "m")
    ok(nftrec("apply", str(d), state=state, ns=netns))
    assert "No changes" in ok(nftrec("plan", str(d), "--refresh", "--detailed-exitcode", state=state, ns=netns)).stdout
    # drift by hand (a Service chain flushed) and an edit of the inputs
    listed = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "nftrec"],
                            capture_output=True, text=True, check=True).stdout
    chain = re.search(r"chain (external-[A-Z2-7]{8}-\S+) \{", listed) or re.search(r"chain (service-\S+) \{", listed)
    subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "chain", "ip", "nftrec", chain.group(1)], check=True)
    _add_endpoint(d)

    def plan() -> str:
        return ok(nftrec("plan", str(d), "--refresh", "-v", "--detailed-exitcode", state=state, ns=netns), 2).stdout

    recorded = plan()
    assert chain.group(1) in recorded
    for entry in state.rglob("history/*"):  # a record that lies is not read
        entry.write_text(entry.read_text().replace('"goto ', '"jump '))
    assert plan() == recorded
    shutil.rmtree(state)  # no record at all
    assert plan() == recorded
