"""The harness's layers point down: its import graph (harness/ and references/, read with ast,
imports inside functions and under TYPE_CHECKING included) has no circle, and an import runs back
up the floors (docs/design.md, "Layers") only where the design names it. The command line stays a
thin parser: harness/cli.py under 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Bottom to top: a module may import from its own floor and the floors below it.
FLOORS = (
    "references", "harness", "deprecated", "core", "backends", "search", "checks",
    "api", "batch", "case", "modes", "report", "run", "mutants", "hunts", "tools", "cli", "__main__",
)
# The imports that run back up, each explained in docs/design.md.
UPWARD = {
    ("harness.checks.model.table", "harness.run.workers"),
    ("harness.report.environment", "harness.run.cache_dir"),
}
CLI_MAX_LINES = 400


def modules(root: Path) -> dict[str, Path]:
    """Every module of harness/ and references/ under `root`, by dotted name (a package by its own)."""
    out = {}
    for top in ("harness", "references"):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The module `name` is, or is inside (an imported function's module); None outside the tree."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules of the tree."""
    edges: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            edges[mod] |= {t for t in (_known(n, known) for n in names) if t and t != mod}
    return edges


def floor(module: str) -> int:
    parts = module.split(".")
    name = parts[0] if parts[0] == "references" else "harness" if len(parts) == 1 else parts[1]
    return FLOORS.index(name)


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in edges.items() for b in targets if floor(b) > floor(a)}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_floor():
    assert all(floor(m) >= 0 for m in modules(ROOT))


def test_no_import_circle():
    assert circles(imports(modules(ROOT))) == []


def test_only_the_documented_imports_run_up_the_floors():
    assert upward(imports(modules(ROOT))) == UPWARD
    design = (ROOT / "docs" / "design.md").read_text()
    for low, high in UPWARD:
        assert f"{low} -> {high}" in design, f"docs/design.md does not explain {low} -> {high}"


def test_the_command_line_stays_thin():
    lines = len((ROOT / "harness" / "cli.py").read_text().splitlines())
    assert lines < CLI_MAX_LINES, f"harness/cli.py has {lines} lines: move what it does out of it"


def test_the_checks_find_a_circle_and_an_upward_import(tmp_path):
    """The graph's own checks fail on a tree that breaks the rules."""
    for name, text in {
        "harness/__init__.py": "",
        "harness/core/__init__.py": "",
        "harness/core/a.py": "from harness.core import b\n",
        "harness/core/b.py": "def f():\n    from harness.core.a import x\n",
        "harness/run/__init__.py": "",
        "harness/run/c.py": "",
        "harness/core/d.py": "import typing\nif typing.TYPE_CHECKING:\n    from harness.run import c\n",
        "references/__init__.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = imports(modules(tmp_path))
    assert circles(edges) == [["harness.core.a", "harness.core.b"]]
    assert upward(edges) == {("harness.core.d", "harness.run.c")}
