"""The house's shape rules, read from the source with ast: short functions, named records
and layers.

A function over MAX_LINES lines needs a reason on its def line (`def f(...):  # long: why`), and a
dataclass with more than MAX_POSITIONAL fields is built by keyword only (`kw_only=True`), so a
call site names what it sets and a new field cannot shift the others.

The harness's layers point down: its import graph (harness/ and references/, read with ast,
imports inside functions and under TYPE_CHECKING included) has no circle, and an import runs back
up the floors (docs/design.md, "Layers") only where the design names it. The command line stays a
thin parser: harness/cli.py under 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ("harness", "references")
MAX_LINES = 60
MAX_POSITIONAL = 4
REASON = "# long:"


def sources() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def long_functions(path: Path) -> list[str]:
    """Functions over MAX_LINES lines (decorators excluded) whose def line gives no reason."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length > MAX_LINES and REASON not in lines[node.lineno - 1]:
            found.append(f"{_label(path)}:{node.lineno} {node.name} ({length} lines)")
    return found


def _dataclass_decorator(node: ast.ClassDef) -> ast.expr | None:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return deco
    return None


def _init_fields(node: ast.ClassDef) -> list[str]:
    """The fields a constructor takes: annotated names, less ClassVars and `field(init=False)`."""
    names = []
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        if isinstance(stmt.value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in stmt.value.keywords
        ):
            continue
        names.append(stmt.target.id)
    return names


def _keyword_only(deco: ast.expr, node: ast.ClassDef) -> bool:
    if isinstance(deco, ast.Call) and any(
        k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in deco.keywords
    ):
        return True
    annotated = [s for s in node.body if isinstance(s, ast.AnnAssign)]
    return bool(annotated) and "KW_ONLY" in ast.unparse(annotated[0].annotation)


def positional_records(path: Path) -> list[str]:
    """Dataclasses with more than MAX_POSITIONAL fields that can still be built positionally."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        deco = _dataclass_decorator(node)
        if deco is None:
            continue
        fields = _init_fields(node)
        if len(fields) > MAX_POSITIONAL and not _keyword_only(deco, node):
            found.append(f"{_label(path)}:{node.lineno} {node.name} ({len(fields)} fields)")
    return found


def test_no_long_function_without_a_reason():
    found = [f for p in sources() for f in long_functions(p)]
    assert not found, (
        f"functions over {MAX_LINES} lines without '{REASON} <why>' on the def line:\n" + "\n".join(found)
    )


def test_records_with_many_fields_are_keyword_only():
    found = [f for p in sources() for f in positional_records(p)]
    assert not found, f"dataclasses over {MAX_POSITIONAL} fields without kw_only=True:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * MAX_LINES, ["f"]),
        (f"def f():  {REASON} a table, one row a line\n" + "    x = 1\n" * MAX_LINES, []),
        ("def f():\n" + "    x = 1\n" * (MAX_LINES - 1), []),
    ],
)
def test_long_function_rule_reads_the_def_line(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [f.split()[1] for f in long_functions(path)] == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("@dataclass\nclass R:\n" + "".join(f"    f{i}: int\n" for i in range(5)), ["R"]),
        ("@dataclass(frozen=True)\nclass R:\n" + "".join(f"    f{i}: int\n" for i in range(5)), ["R"]),
        ("@dataclass(kw_only=True)\nclass R:\n" + "".join(f"    f{i}: int\n" for i in range(5)), []),
        ("@dataclass\nclass R:\n    _: KW_ONLY\n" + "".join(f"    f{i}: int\n" for i in range(5)), []),
        ("@dataclass\nclass R:\n" + "".join(f"    f{i}: int\n" for i in range(4)), []),
        (
            "@dataclass\nclass R:\n    c: ClassVar[int] = 0\n"
            + "".join(f"    f{i}: int\n" for i in range(4)),
            [],
        ),
    ],
)
def test_record_rule_counts_constructor_fields(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [f.split()[1] for f in positional_records(path)] == expected


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
