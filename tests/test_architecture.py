"""The package layout is the pipeline (docs/architecture.md), and this keeps it so.

Read from the source with `ast` (no import runs), every import counts, including the
ones inside functions:
- a stage imports only itself and lower stages (intake < compile < kernel < engine <
  daemon < commands (typer) < cli (the entry point); `reconciler` and `reconciler.logs`
  are below everything);
- another stage is imported through its package (`from reconciler.intake import X`),
  and only names that package lists in `__all__`; never its submodules;
- the module graph has no cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"

# Lower rank = earlier in the pipeline. Modules not listed take their stage's rank.
RANKS = {"reconciler": 0, "reconciler.logs": 0, "reconciler.progress": 0, "reconciler.atomic": 0, "reconciler.heap": 0,
         "reconciler.compat": 0, "reconciler.clock": 0,
         "reconciler.intake": 1, "reconciler.compile": 2,
         "reconciler.kernel": 3, "reconciler.engine": 4, "reconciler.daemon": 5, "reconciler.commands": 6,
         "reconciler.options": 6, "reconciler.fleetcommands": 6,
         "reconciler.tracecommands": 6, "reconciler.cli": 7}


def module_name(root: Path, path: Path) -> str:
    parts = (root.name,) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(name: str, top: str) -> str:
    """`reconciler.engine.apply` -> `reconciler.engine`; top-level modules are their own stage."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else top


def read_tree(root: Path) -> tuple[dict[str, list[tuple[int, str, tuple[str, ...]]]], dict[str, set[str] | None]]:
    """{module: [(line, imported module, names)]}, {package: its __all__ or None}."""
    top = root.name
    modules = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    exported: dict[str, set[str] | None] = {}
    for name, path in modules.items():
        if path.name == "__init__.py":
            exported[name] = None
            for node in trees[name].body:
                if not (isinstance(node, ast.Assign) and "__all__" in ast.unparse(node.targets[0])):
                    continue
                if isinstance(node.value, ast.Call):  # __all__, __getattr__ = lazy_exports(__name__, {...})
                    exported[name] = {n for names in ast.literal_eval(node.value.args[1]).values() for n in names}
                else:
                    exported[name] = set(ast.literal_eval(node.value))
    imports: dict[str, list] = {}
    for name, path in modules.items():
        tree = trees[name]
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == top or a.name.startswith(top + "."):
                        found.append((node.lineno, a.name, ()))
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.level:
                    raise AssertionError(f"{path}:{node.lineno}: relative import; write `from {top}....` in full")
                if node.module != top and not node.module.startswith(top + "."):
                    continue
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    # `from pkg import module`, unless pkg exports a name that shadows it
                    if sub in modules and a.name not in (exported.get(node.module) or ()):
                        found.append((node.lineno, sub, ()))
                    else:
                        found.append((node.lineno, node.module, (a.name,)))
        imports[name] = found
    return imports, exported


def violations(root: Path, ranks: dict[str, int]) -> list[str]:
    top = root.name
    imports, exported = read_tree(root)
    out = []

    def rank(name: str) -> int:
        return ranks.get(name, ranks.get(stage_of(name, top), 99))

    for mod, found in imports.items():
        here = stage_of(mod, top)
        for line, target, names in found:
            there = stage_of(target, top)
            where = f"{mod} (line {line}) imports {target}" + (f".{names[0]}" if names else "")
            if there == here:
                if target == here and mod != here and here != top:
                    out.append(f"{where}: within a stage, import the submodule, not the package "
                               f"(the package's __init__ imports this module: a cycle)")
                continue
            if rank(target) > rank(mod):
                out.append(f"{where}: a lower stage ({here}) must not import a higher one ({there})")
            if target != there and there != top and there in exported:
                out.append(f"{where}: another stage is imported through its package, "
                           f"`from {there} import ...`, not through its submodules")
            elif target == there and there in exported and there != top:
                public = exported[there]
                for n in names:
                    if public is None or n not in public:
                        out.append(f"{where}: {n} is not in {there}.__all__; export it there if "
                                   f"other stages need it")
    # cycles, over every import edge (a package's __init__ included)
    graph = {m: sorted({t for _, t, _ in found if t in imports and t != m}) for m, found in imports.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                out.append("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def test_the_package_keeps_its_layers_and_has_no_import_cycle():
    assert violations(PACKAGE, RANKS) == []


def test_every_module_belongs_to_a_known_stage():
    imports, _ = read_tree(PACKAGE)
    unknown = sorted(m for m in imports if stage_of(m, "reconciler") not in RANKS)
    assert unknown == [], f"add the new stage to RANKS and docs/architecture.md: {unknown}"


def test_the_checker_finds_an_upward_import_a_private_name_and_a_cycle(tmp_path):
    """The rules above must be able to fail: a small tree breaking each one."""
    root = tmp_path / "reconciler"
    files = {
        "__init__.py": "",
        "intake/__init__.py": "from reconciler import lazy_exports\n"
                              "__all__, __getattr__ = lazy_exports(__name__, {'load': ('read',)})\n",
        "intake/load.py": "def read(): pass\n",
        # intake reaches up into engine, inside a function: still counted
        "intake/validate.py": "def f():\n    from reconciler.engine import run\n",
        "engine/__init__.py": "from reconciler.engine.apply import run\n__all__ = ['run']\n",
        # engine takes a private name through a submodule, and imports its own package
        "engine/apply.py": "from reconciler.intake.load import _private\nfrom reconciler.engine import run\n"
                           "def run(): pass\n",
        "engine/plan.py": "from reconciler.engine.state import x\n",
        "engine/state.py": "from reconciler.engine.plan import y\n",  # plan <-> state
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = "\n".join(violations(root, RANKS))
    assert "reconciler.intake.validate (line 2) imports reconciler.engine.run: a lower stage" in found
    assert "imports reconciler.intake.load._private: another stage is imported through its package" in found
    assert "within a stage, import the submodule" in found
    assert "import cycle: reconciler.engine.plan -> reconciler.engine.state -> reconciler.engine.plan" in found
    # and a clean tree is clean
    (root / "intake/validate.py").write_text("from reconciler.intake.load import read\n")
    (root / "engine/apply.py").write_text("from reconciler.intake import read\ndef run(): pass\n")
    (root / "engine/state.py").write_text("y = 1\n")
    assert violations(root, RANKS) == []


def test_every_exported_name_resolves():
    """A typo in a package's export table would otherwise surface only when a command runs."""
    import importlib

    for stage in ("intake", "compile", "kernel", "engine", "daemon"):
        package = importlib.import_module(f"reconciler.{stage}")
        for name in package.__all__:
            assert getattr(package, name) is not None, f"reconciler.{stage}.{name}"


MAX_LINES = 600
# History belongs in commit messages: no issue, item or round numbers, no section signs
# pointing at documents outside the repository.
HISTORY = re.compile(r"issue [0-9]|item [0-9]|\bround\b(?!\()|§", re.IGNORECASE)  # round(x) is Python


def oversized(root: Path) -> list[str]:
    """Modules longer than MAX_LINES: one concern each, readable in one sitting."""
    sizes = {p: len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py"))}
    return [f"{p.relative_to(root.parent)}: {n} lines" for p, n in sizes.items() if n > MAX_LINES]


def history_lines(root: Path) -> list[str]:
    return [f"{p.relative_to(root.parent)}:{i}: {line.strip()}" for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]


def test_no_module_is_over_600_lines():
    assert oversized(PACKAGE) == []


def test_the_code_carries_no_history():
    assert history_lines(PACKAGE) == []


def test_the_size_and_history_checks_can_fail(tmp_path):
    root = tmp_path / "reconciler"
    root.mkdir()
    (root / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (root / "small.py").write_text("x = 1\n" * (MAX_LINES - 1) + "# see issue 7, round 2\n")
    assert oversized(root) == [f"reconciler/big.py: {MAX_LINES + 1} lines"]
    assert history_lines(root) == [f"reconciler/small.py:{MAX_LINES}: # see issue 7, round 2"]
