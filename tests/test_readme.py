"""The README's output examples, run for real so they cannot go stale.

A checked example is a ```console block right after `<!-- check -->` (or `<!-- check: kernel -->`,
which needs root and gets a fresh network namespace). Each `$ ` line (with its `> ` continuation
lines) runs in bash from a scratch copy of examples/, with the venv's nftrec first on PATH and a
temporary NFTREC_STATE_DIR; the lines after it are its stdout and stderr. `--netns demo` and
`netns exec demo` name the throwaway namespace. Output is compared after `normalise`, the short
list of what legitimately varies. NFTREC_README_UPDATE=1 rewrites the blocks with real output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from nsutil import EXAMPLES, REPO, nft_spelling, throwaway_netns

from reconciler.intake import NftSpelling

README = REPO / "README.md"
MARK = re.compile(r"^<!-- check(?:: (kernel))? -->\n(`{3,})console\n(.*?)^\2\n", re.M | re.S)
NETNS = "demo"
UPDATE = os.environ.get("NFTREC_README_UPDATE") == "1"

# What legitimately differs between two runs, and nothing else.
VARIES = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)"), "<time>"),  # timestamps
    (re.compile(r"\b\d+(?:\.\d+)? ?ms\b"), "<ms>"),                                        # durations
    (re.compile(r"\bsha256:[0-9a-f]{12,64}\b"), "sha256:<digest>"),                          # content digests
    (re.compile(r"\bpid \d+\b"), "pid <pid>"),                                              # process ids
    (re.compile(r"\b[0-9a-f]{12}\b"), "<id>"),                                               # short commit ids
    (re.compile(r"\bSHA256:[A-Za-z0-9+/]{43}"), "SHA256:<key>"),                            # SSH key fingerprints
]


@dataclass
class Step:
    command: str   # what runs in bash, continuation lines joined with newlines
    output: str    # the README's text for its output


@dataclass
class Block:
    kernel: bool
    steps: list
    span: tuple    # the block body's offsets in the README, for update mode
    line: int


def blocks(text: str) -> list:
    found = []
    for m in MARK.finditer(text):
        steps, lines = [], m.group(3).splitlines()
        for ln in lines:
            if ln.startswith("$ "):
                steps.append(Step(ln[2:], ""))
            elif ln.startswith("> ") and steps and not steps[-1].output:
                steps[-1].command += "\n" + ln[2:]
            else:
                assert steps, f"README.md:{text.count(chr(10), 0, m.start()) + 1}: output before any `$ ` line"
                steps[-1].output += ln + "\n"
        found.append(Block(bool(m.group(1)), steps, m.span(3), text.count("\n", 0, m.start()) + 1))
    return found


def localise(out: str, scratch: Path, state: Path, ns: str | None) -> str:
    """The output as the README shows it: no temporary path, the namespace called `demo`."""
    out = out.replace(str(state), "$NFTREC_STATE_DIR").replace(str(scratch) + "/", "")
    return out.replace(ns, NETNS) if ns else out


def normalise(out: str) -> str:
    for pattern, replacement in VARIES:
        out = pattern.sub(replacement, out)
    return out


def run(block: Block, tmp: Path, ns: str | None) -> list:
    """Each step's real output, in a scratch directory holding a copy of examples/."""
    scratch, state = tmp / "work", tmp / "state"
    shutil.copytree(EXAMPLES, scratch / "examples", symlinks=True)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               NFTREC_STATE_DIR=str(state), PYTHONUNBUFFERED="1", NFTREC_PROGRESS="0", COLUMNS="200",
               HOME=str(tmp), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="ops", GIT_AUTHOR_EMAIL="ops@example",
               GIT_COMMITTER_NAME="ops", GIT_COMMITTER_EMAIL="ops@example")
    outs = []
    for step in block.steps:
        cmd = step.command
        if ns:
            cmd = cmd.replace(f"--netns {NETNS}", f"--netns {ns}").replace(f"netns exec {NETNS}", f"netns exec {ns}")
        proc = subprocess.run(["bash", "-c", cmd], cwd=scratch, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)
        outs.append(localise(proc.stdout, scratch, state, ns))
    return outs


def render(block: Block, outs: list) -> str:
    body = ""
    for step, out in zip(block.steps, outs):
        body += "$ " + step.command.replace("\n", "\n> ") + "\n" + out
    return body


def test_every_console_block_is_checked():
    """A `console` block is output, so it must be checked; commands alone go in `sh` blocks."""
    text = README.read_text()
    found = blocks(text)
    assert len(found) >= 5 and any(b.kernel for b in found)
    assert len(re.findall(r"^`{3,}console$", text, re.M)) == len(found), "a ```console block without <!-- check -->"


@pytest.mark.parametrize("index", [pytest.param(i, marks=[pytest.mark.kernel] if b.kernel else [], id=f"line{b.line}")
                                   for i, b in enumerate(blocks(README.read_text()))])
def test_readme_example(index, tmp_path):
    text = README.read_text()
    block = blocks(text)[index]
    if block.kernel:
        if nft_spelling() != NftSpelling():
            pytest.skip("the README shows what nft 1.0.1 or later does; this nft takes kube-proxy's spelling")
        with throwaway_netns() as ns:
            outs = run(block, tmp_path, ns)
    else:
        outs = run(block, tmp_path, None)
    if UPDATE:
        text = README.read_text()
        block = blocks(text)[index]
        README.write_text(text[:block.span[0]] + render(block, outs) + text[block.span[1]:])
        return
    want = normalise(render(block, [s.output for s in block.steps]))
    assert want == normalise(render(block, outs)), (
        f"README.md:{block.line}: the example's output differs from a real run; "
        "NFTREC_README_UPDATE=1 rewrites it if the change is meant")


def headings(text: str) -> set:
    """GitHub's anchors of the README's headings (outside code blocks)."""
    found, fence = set(), None
    for line in text.splitlines():
        m = re.match(r"^(`{3,})", line)
        if m and (fence is None or m.group(1) == fence):
            fence = None if fence else m.group(1)
        elif fence is None and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_readme_links_resolve_and_name_every_example():
    text = README.read_text()
    anchors = headings(text)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (REPO / path).exists(), f"README.md links to {target}, which does not exist"
        elif anchor:
            assert anchor in anchors, f"README.md links to #{anchor}, which no heading makes"
    for example in EXAMPLES.iterdir():
        name = f"examples/{example.name}" + ("/" if example.is_dir() else "")
        assert f"]({name})" in text, f"README.md never links {name}"
