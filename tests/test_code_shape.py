"""The house's shape rules, read from the source with ast: short functions and named records.

A function over MAX_LINES lines needs a reason on its def line (`def f(...):  # long: why`), and a
dataclass with more than MAX_POSITIONAL fields is built by keyword only (`kw_only=True`), so a
call site names what it sets and a new field cannot shift the others.
"""

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
