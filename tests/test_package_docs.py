"""What the Debian package generates at build time (debian/docs.py) cannot drift from the
program: nftrec(8) names every command and every option of the CLI's click tree, nftrec.yaml(5)
every key of the node config schema, the /etc/nftrec/config.yaml sample is comments only and
gives exactly the defaults, and the completion files are typer's scripts for the program."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def docs():
    spec = importlib.util.spec_from_file_location("nftrec_debian_docs", TOP / "debian" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    docs.generate(out)
    return out


def unroff(path: Path) -> str:
    return path.read_text(encoding="utf-8").replace("\\-", "-").replace("\\e", "\\").replace("\\&", "")


def click_tree():
    """(command path, option names) of every command, the top group's own options first."""
    import typer

    from reconciler.cli import typer_app

    def walk(command, path):
        yield path, [o for p in command.params if p.param_type_name == "option" and not p.hidden
                     for o in p.opts + p.secondary_opts]
        if hasattr(command, "list_commands"):
            ctx = command.context_class(command)
            for name in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, name), path + [name])

    return list(walk(typer.main.get_command(typer_app()), ["nftrec"]))


def test_man_8_has_every_command_and_option(generated):
    page = unroff(generated / "man" / "nftrec.8")
    sections = page.split("\n.SS ")
    tree = click_tree()
    assert len(tree) > 15
    for path, opts in tree:
        name = " ".join(path)
        where = sections[0] if len(path) == 1 else next((s for s in sections[1:] if s.startswith(name + "\n")), None)
        assert where is not None, f"{name} has no section in nftrec(8)"
        for opt in opts:
            assert f"\\fB{opt}" in where or f", {opt}" in where, f"{name} {opt} is missing from nftrec(8)"


def test_man_5_has_every_schema_key(docs, generated):
    page = unroff(generated / "man" / "nftrec.yaml.5")
    schema = json.loads((TOP / "schemas" / "nodeconfig.json").read_text())
    keys = [key for key, _ in docs.schema_keys(schema)]
    assert {"nodeName", "verify.mode", "healthChecks[].cmd", "status.sshKey"} <= set(keys)
    for top in schema["properties"]:
        assert top in keys
    for key in keys:
        assert f"\n.TP\n\\fB{key}\\fR\n" in page, f"{key} is missing from nftrec.yaml(5)"


def test_man_pages_render_without_warnings(generated):
    for page in ("nftrec.8", "nftrec.yaml.5"):
        r = subprocess.run(["man", "--warnings", "-l", "-E", "UTF-8", str(generated / "man" / page)],
                           capture_output=True, text=True, env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin"})
        if r.returncode != 0 and "not found" in r.stderr:
            pytest.skip("man is not installed")
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_config_sample_is_comments_only_and_gives_the_defaults(generated, tmp_path):
    from reconciler.intake.config import load_node_config

    sample = generated / "config.yaml"
    lines = sample.read_text().splitlines()
    assert lines and all(line.startswith("#") for line in lines)
    assert any(line.startswith("# removalGuard:") for line in lines)  # README's reference block, commented
    fixed = dict(discover=False, hostname=lambda: "edge-test")
    config, problems = load_node_config(str(sample), **fixed)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    defaults, _ = load_node_config(str(empty), **fixed)
    assert not problems
    assert config == defaults


def test_completion_files_are_typers_scripts(generated):
    for shell, path in {"bash": "bash-completion/completions/nftrec", "zsh": "zsh/vendor-completions/_nftrec",
                        "fish": "fish/vendor_completions.d/nftrec.fish"}.items():
        text = (generated / "completions" / path).read_text()
        assert "_NFTREC_COMPLETE" in text, shell
        cli = Path(sys.executable).parent / "nftrec"
        if cli.exists():
            shown = subprocess.run([str(cli), "--show-completion", shell], capture_output=True, text=True).stdout
            assert text.strip() == shown.strip(), shell
