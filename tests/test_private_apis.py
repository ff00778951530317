"""intake/parse.py and intake/schemas.py use internals of ruamel.yaml and jsonschema. The
versions installed are inside pyproject.toml's bounds, and on a version that lacks an
internal the check at import raises a clear error instead of parsing or validating
differently."""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

from reconciler.intake import parse, schemas

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself requires tomli before 3.11 (its ini reader)
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _bounds(name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [spec] = [d for d in deps if re.match(rf"{re.escape(name)}\s*[<>=]", d)]
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"{name} needs a lower and an upper bound in pyproject.toml: {spec}"
    return _version(low.group(1)), _version(high.group(1))


@pytest.mark.parametrize("name", ["ruamel.yaml", "jsonschema"])
def test_the_installed_version_is_inside_the_tested_bounds(name):
    low, high = _bounds(name)
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:  # Python 3.9 does not normalize the name: ruamel_yaml-0.19.dist-info
        installed = metadata.version(name.replace(".", "_"))
    assert low <= _version(installed) < high


def test_the_checks_pass_on_the_installed_versions():
    parse.check_ruamel()
    schemas.check_jsonschema()


def test_a_ruamel_without_an_internal_is_refused_loudly(monkeypatch):
    from ruamel.yaml.scanner import Scanner

    monkeypatch.delattr(Scanner, "check_plain")
    with pytest.raises(RuntimeError, match=r"ruamel\.yaml .* lacks Scanner\.check_plain.*tested bounds"):
        parse.check_ruamel()


def test_a_jsonschema_without_an_internal_is_refused_loudly(monkeypatch):
    from jsonschema.exceptions import ValidationError

    owner = next(c for c in ValidationError.__mro__ if "_set" in vars(c))
    monkeypatch.delattr(owner, "_set")
    with pytest.raises(RuntimeError, match=r"jsonschema .* lacks ValidationError\._set.*tested bounds"):
        schemas.check_jsonschema()


_WITHOUT_LIBYAML = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "_ruamel_yaml" or name.startswith("ruamel.yaml.clib"):
            raise ImportError("no libyaml here")
sys.meta_path.insert(0, Block())
from reconciler.intake import parse
assert not parse.FAST, "the C loader was still found"
sys.argv = ["nftrec"] + sys.argv[1:]
from reconciler.cli import main
main()
"""


def test_without_libyaml_every_example_reads_as_with_it(tmp_path):
    """Without ruamel.yaml.clib (PyPy, a platform without its wheel) the pure-Python
    loader stands in, and every example validates to the same report."""
    import subprocess
    import sys

    examples = Path(__file__).resolve().parents[1] / "examples"
    env = {**os.environ, "NFTREC_INTAKE_CACHE": "off"}
    for d in sorted(p for p in examples.iterdir() if p.is_dir()):
        args = ["validate", str(d), "-o", "json"]
        fast = subprocess.run([sys.executable, "-m", "reconciler.cli", *args], capture_output=True, text=True, env=env)
        pure = subprocess.run([sys.executable, "-c", _WITHOUT_LIBYAML, *args], capture_output=True, text=True, env=env)
        assert pure.stderr.count("Traceback") == 0, pure.stderr
        assert (pure.returncode, pure.stdout) == (fast.returncode, fast.stdout), d.name
