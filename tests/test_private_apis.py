"""intake/parse.py and intake/schemas.py use internals of ruamel.yaml and jsonschema. The
versions installed are inside pyproject.toml's bounds, and on a version that lacks an
internal the check at import raises a clear error instead of parsing or validating
differently."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from reconciler.intake import parse, schemas

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
    assert low <= _version(metadata.version(name)) < high


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
