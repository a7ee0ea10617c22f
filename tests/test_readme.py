"""Every command in the README's shell blocks runs as the README says, on the CPU.

A command that would take minutes runs narrowed (one backend, one family, a few examples) by
arguments appended to the README's own, so the words a user types are the ones tested. Commands
that need a GPU say "GPU only" in their comment; the list of those is pinned here, so a command
added to the README is either run by this test or declared GPU-only on purpose.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import case

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
GPU_ONLY = {'make check ARGS="--gpus 0,1"'}
ONE_FAMILY = ["--backend", "torch_native", "--family", "decode"]

# README command -> (arguments appended to narrow it, whether it runs in a scratch directory)
NARROWED: dict[str, tuple[list[str], bool]] = {
    "make check": ([*ONE_FAMILY, "--reports", "{tmp}/reports"], False),
    "make test": (["-k", "test_the_source_version_is_pyproject_s"], False),
    "python -m harness list": ([], False),
    "python -m harness check --backend torch_native --family decode": ([], True),
    "pytest -k swa": (["--collect-only", "-q"], False),
    "pytest -k prefix": (["--collect-only", "-q"], False),
    "pytest -k graph": (["--collect-only", "-q"], False),
    "python -m harness repro case.json --backend torch_native": ([], True),
    "python -m harness report reports/latest/results.json": ([], True),
    'make mutants ARGS="--backend torch_native --first-family"': (
        ["--mutant", "window_short", "--max-examples", "20", "--json", "{tmp}/mutants.json"],
        False,
    ),
    'make bench ARGS="--section throughput --cases 32"': (
        ["--device", "cpu", "--backend", "torch_native", "--cases", "4", "--repeat", "1"]
        + ["--json", "{tmp}/b.json"],
        False,
    ),
    'make check ARGS="--require fa4,flashinfer_paged"': (["--reports", "{tmp}/reports"], False),
    "make warmup": ([], False),
    "attn-harness check --backend torch_native --family decode": ([], True),
}


def readme_commands(text: str) -> dict[str, str]:
    """Each command line of the shell blocks -> its comment ('' when it has none)."""
    found = {}
    for block in BLOCK.findall(text):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            if command.strip():
                found[command.strip()] = comment.strip(" #")
    return found


def argv(command: str, extra: list[str]) -> list[str]:
    """The README command as this interpreter runs it, `extra` appended (to ARGS for make)."""
    words = shlex.split(command)
    if words[0] == "make":
        args = next((w for w in words if w.startswith("ARGS=")), "ARGS=")
        words = [w for w in words if w != args]
        joined = " ".join([args.removeprefix("ARGS="), *map(shlex.quote, extra)]).strip()
        make_vars = [f"PYTHON={sys.executable}", "INSTALL=no"] + ([f"ARGS={joined}"] if joined else [])
        return [*words, *make_vars]
    if words[0] == "python":
        return [sys.executable, *words[1:], *extra]
    if words[0] == "pytest":
        return [sys.executable, "-m", "pytest", *words[1:], *extra]
    script = Path(sys.executable).parent / words[0]
    return [str(script), *words[1:], *extra]


def run(command: str, tmp: Path) -> subprocess.CompletedProcess:
    extra, scratch = NARROWED[command]
    env = dict(os.environ, ATTN_HARNESS_CACHE=str(tmp / "cache"))
    return subprocess.run(
        argv(command, [e.replace("{tmp}", str(tmp)) for e in extra]),
        cwd=tmp if scratch else ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_readme_command_is_run_here_or_declared_gpu_only():
    commands = readme_commands(README.read_text())
    gpu = {c for c, comment in commands.items() if comment.startswith("GPU only")}
    assert gpu == GPU_ONLY
    assert set(commands) - gpu == set(NARROWED)


def test_the_parsing_sees_a_command_added_to_a_block():
    text = README.read_text().replace("make warmup ", "make lint\nmake warmup ", 1)
    assert set(readme_commands(text)) - set(readme_commands(README.read_text())) == {"make lint"}
    assert argv('make bench ARGS="--section x"', ["--cases", "4"])[-1] == "ARGS=--section x --cases 4"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One directory for the commands that run outside the checkout: a check's report is read back
    by `report`, and `repro` finds its case.json there."""
    tmp = tmp_path_factory.mktemp("readme")
    (tmp / "case.json").write_text(case("DECODE", ((40, 1), (7, 1))).to_json())
    return tmp


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_make_check(tmp_path):
    out = ok(run("make check", tmp_path))
    assert "decode" in out and "pass" in out
    assert (tmp_path / "reports" / "latest" / "results.json").exists()


def test_make_test(tmp_path):
    assert "1 passed" in ok(run("make test", tmp_path))


def test_harness_list(tmp_path):
    out = ok(run("python -m harness list", tmp_path))
    assert "torch_native" in out and "fa4" in out


@pytest.mark.parametrize("script", ["python -m harness", "attn-harness"])
def test_one_backend_one_family_writes_the_report_under_the_current_directory(scratch, script):
    ok(run(f"{script} check --backend torch_native --family decode", scratch))
    results = json.loads((scratch / "reports" / "latest" / "results.json").read_text())
    assert {r["backend"] for r in results["results"]} == {"torch_native"}
    assert {r["status"] for r in results["results"]} >= {"pass"}


def test_report_re_renders_the_latest(scratch):
    latest = scratch / "reports" / "latest"
    if not latest.exists():
        ok(run("python -m harness check --backend torch_native --family decode", scratch))
    (latest / "index.html").unlink()
    ok(run("python -m harness report reports/latest/results.json", scratch))
    assert (latest / "index.html").exists()


def test_repro_replays_a_case_file(scratch):
    assert "pass" in ok(run("python -m harness repro case.json --backend torch_native", scratch)).lower()


@pytest.mark.parametrize("keyword", ["swa", "prefix", "graph"])
def test_pytest_k_selects_what_the_readme_says(tmp_path, keyword):
    out = ok(run(f"pytest -k {keyword}", tmp_path))
    ids = [line for line in out.splitlines() if "::" in line]
    assert ids and all(keyword in i for i in ids)
    if keyword == "swa":  # every family that has windows
        assert {i.split("::")[0] for i in ids} >= {"cases/test_decode.py", "cases/test_extend.py"}


def test_make_mutants_catches_what_it_hunts(tmp_path):
    ok(run('make mutants ARGS="--backend torch_native --first-family"', tmp_path))
    rows = json.loads((tmp_path / "mutants.json").read_text())["rows"]
    assert rows and all(r["outcome"].startswith("caught") for r in rows)


def test_make_bench_measures(tmp_path):
    ok(run('make bench ARGS="--section throughput --cases 32"', tmp_path))
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [r["backend"] for r in doc["throughput"]] == ["torch_native"] and doc["throughput"][0]["checked"]


def test_require_exits_2_naming_what_is_missing(tmp_path):
    result = run('make check ARGS="--require fa4,flashinfer_paged"', tmp_path)
    assert result.returncode == 2 and "fa4" in result.stdout + result.stderr
    assert not (tmp_path / "reports").exists()


def test_make_warmup_on_a_cpu_has_nothing_to_compile(tmp_path):
    assert "nothing to compile" in ok(run("make warmup", tmp_path))
