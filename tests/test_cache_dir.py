"""The cache directory (harness/run/cache_dir.py): where it is by default, by environment variable and
by flag, that a library variable the user set wins, and that workers and the check's pytest inherit it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.report import environment
from harness.run import cache_dir, check, workers
from tests import warmup_fake

VARS = tuple(var for _, var, _ in cache_dir.LIBRARIES)
BYTECODE_VARS = (cache_dir.BYTECODE_VAR, cache_dir.NO_BYTECODE)
ALL = (cache_dir.ENV, cache_dir.OWNED_ENV, cache_dir.FA4_SWITCH, "XDG_CACHE_HOME", *VARS, *BYTECODE_VARS)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """The process environment without any cache variable (restored afterwards), HOME in tmp_path.
    Each is set before it is deleted: monkeypatch restores only what it saw, and a variable `apply`
    adds that was absent before (a $PYTHONPYCACHEPREFIX, say) would otherwise outlive the test and
    reach every process the later tests start."""
    for name in ALL:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def derived(root: Path) -> dict[str, str]:
    return {var: str(root / sub) for _, var, sub in cache_dir.LIBRARIES}


def test_default_is_under_the_home_cache_and_turns_fa4s_disk_cache_on(tmp_path):
    env = {"HOME": str(tmp_path)}
    cache_dir.apply(environ=env)
    root = tmp_path / ".cache" / "attn-harness"
    assert {v: env[v] for v in VARS} == derived(root)
    assert env[cache_dir.FA4_SWITCH] == "1"
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(root / "flashinfer")
    assert not any(e.user for e in cache_dir.entries(env))


def test_xdg_then_the_variable_then_the_flag(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cache_dir.root(env) == tmp_path / "xdg" / "attn-harness"
    env[cache_dir.ENV] = str(tmp_path / "var")
    assert cache_dir.root(env) == tmp_path / "var"
    cache_dir.apply(str(tmp_path / "flag"), env)
    assert env[cache_dir.ENV] == str(tmp_path / "flag")  # the children see the flag's root
    assert {v: env[v] for v in VARS} == derived(tmp_path / "flag")


def test_a_relative_root_is_made_absolute_for_the_children(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"HOME": str(tmp_path), cache_dir.ENV: "rel"}
    cache_dir.apply(None, env)
    assert env[cache_dir.ENV] == str(tmp_path / "rel")


def test_a_library_variable_the_user_set_wins_and_list_says_so(tmp_path):
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/mine/inductor", cache_dir.FA4_SWITCH: "0"}
    cache_dir.apply(str(tmp_path / "c"), env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/mine/inductor"
    assert env[cache_dir.FA4_SWITCH] == "0"
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "c" / "triton")
    user = [e.var for e in cache_dir.entries(env) if e.user]
    assert user == ["TORCHINDUCTOR_CACHE_DIR"]
    text = "\n".join(cache_dir.describe(env))
    assert "/mine/inductor  (set by the user ($TORCHINDUCTOR_CACHE_DIR)" in text
    assert "FA4's disk cache is off" in text
    assert "TORCHINDUCTOR_CACHE_DIR=/mine/inductor" in cache_dir.summary(env)


def test_a_child_given_another_root_rederives_what_the_harness_set(tmp_path):
    """The bench's cold start runs a check with --cache-dir TMP under a parent that applied the
    default: the parent's values are the harness's, not the user's, so they move to TMP."""
    env = {"HOME": str(tmp_path), "TRITON_CACHE_DIR": "/mine/triton"}
    cache_dir.apply(None, env)
    cache_dir.apply(str(tmp_path / "cold"), env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cold" / "inductor")
    assert env["TRITON_CACHE_DIR"] == "/mine/triton"
    assert env[cache_dir.FA4_SWITCH] == "1"


def test_the_flag_reaches_the_environment_list_and_the_report(clean_env, capsys):
    root = clean_env / "flagged"
    assert cli.main(["warmup", "--cache-dir", str(root)]) == 0  # no CUDA here: nothing to compile
    assert "nothing to compile" in capsys.readouterr().out
    assert cache_dir.root() == root
    assert cli.main(["list", "--backend", "torch_native"]) == 0
    out = capsys.readouterr().out
    assert f"cache directory: {root}" in out and str(root / "inductor") in out
    assert environment.collect()["compile cache"] == str(root)


def test_a_cache_dir_that_is_a_file_is_one_line_exit_2(clean_env, capsys):
    f = clean_env / "file"
    f.write_text("")
    assert cli.main(["check", "--cache-dir", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --cache-dir {f}: not a directory"


def test_a_spawned_worker_inherits_the_cache_directory(clean_env):
    cache_dir.apply(str(clean_env / "w"))
    worker = workers.Worker("cache-dir-test")
    try:
        out = worker.call(warmup_fake.environ, (ALL,), 120)
    finally:
        worker.stop()
    assert out.kind == "ok", out.error or out.output
    assert {v: out.value[v] for v in VARS} == derived(clean_env / "w")
    assert out.value[cache_dir.ENV] == str(clean_env / "w")


def test_the_checks_pytest_process_inherits_it(clean_env, monkeypatch):
    seen = {}

    def fake_run(cmd, cwd=None, env=None):  # noqa: ANN001, ANN202
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 5)

    monkeypatch.setattr(check, "run_pytest", fake_run)
    argv = ["check", "--cache-dir", str(clean_env / "p"), "--reports", str(clean_env / "r"), "--jobs", "1"]
    assert cli.main(argv) == 2  # the fake pytest "collected nothing"
    assert {v: seen[v] for v in VARS} == derived(clean_env / "p")
    assert seen[cache_dir.FA4_SWITCH] == "1"


# --- Python's bytecode ---------------------------------------------------------------------------


def _package(where: Path, name: str) -> Path:
    """A one-file package `name` under `where` (on sys.path for the test), without any bytecode."""
    (where / name).mkdir(parents=True)
    (where / name / "__init__.py").write_text("VALUE = 1\n")
    return where / name / "__init__.py"


def test_bytecode_is_missing_only_without_a_pyc_and_with_nothing_to_write_one(tmp_path, monkeypatch):
    source = _package(tmp_path, "pkg_nobytecode")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cache_dir.bytecode_missing({cache_dir.NO_BYTECODE: "1"}, "pkg_nobytecode")
    assert not cache_dir.bytecode_missing({}, "pkg_nobytecode")  # the first import writes it beside
    pyc = source.parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"")
    assert not cache_dir.bytecode_missing({cache_dir.NO_BYTECODE: "1"}, "pkg_nobytecode")
    assert not cache_dir.bytecode_missing({cache_dir.NO_BYTECODE: "1"}, "no_such_package_here")


def test_without_bytecode_the_children_keep_theirs_under_the_root(tmp_path, monkeypatch):
    var = cache_dir.BYTECODE_VAR
    monkeypatch.setattr(cache_dir, "bytecode_missing", lambda env, package="torch": True)
    env = {"HOME": str(tmp_path), cache_dir.NO_BYTECODE: "1"}
    cache_dir.apply(str(tmp_path / "c"), env)
    assert env[var] == str(tmp_path / "c" / "pycache") and cache_dir.NO_BYTECODE not in env
    assert any(e.var == var and not e.user for e in cache_dir.entries(env))
    assert any("Python bytecode" in line and "no bytecode beside" in line for line in cache_dir.describe(env))
    cache_dir.apply(str(tmp_path / "cold"), env)  # the bench's cold start: its own fresh root
    assert env[var] == str(tmp_path / "cold" / "pycache")
    mine = {"HOME": str(tmp_path), cache_dir.NO_BYTECODE: "1", var: "/mine/pyc"}
    cache_dir.apply(None, mine)
    assert mine[var] == "/mine/pyc" and mine[cache_dir.NO_BYTECODE] == "1"  # the user's choice stays
    monkeypatch.setattr(cache_dir, "bytecode_missing", lambda env, package="torch": False)
    kept = {"HOME": str(tmp_path), cache_dir.NO_BYTECODE: "1"}
    cache_dir.apply(None, kept)
    assert var not in kept and kept[cache_dir.NO_BYTECODE] == "1"
    assert not any(e.var == var for e in cache_dir.entries(kept))


def test_a_child_started_with_the_applied_environment_writes_its_bytecode_there(tmp_path, monkeypatch):
    """The point of it: a second process reads what the first compiled (a child of a process whose
    environment forbids bytecode writes nothing anywhere)."""
    source = _package(tmp_path / "src", "pkg_child")
    monkeypatch.setattr(cache_dir, "bytecode_missing", lambda env, package="torch": True)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path / "src")}
    base[cache_dir.NO_BYTECODE] = "1"
    env = dict(base)
    cache_dir.apply(str(tmp_path / "c"), env)
    for given in (base, env):
        subprocess.run([sys.executable, "-c", "import pkg_child"], env=given, check=True)
    mirrored = tmp_path / "c" / "pycache" / str(source.parent).lstrip("/")
    assert [p.name for p in mirrored.glob("*.pyc")] == [f"__init__.{sys.implementation.cache_tag}.pyc"]
    assert not (source.parent / "__pycache__").exists()


def test_the_check_process_itself_uses_the_bytecode_cache_only_when_the_harness_set_it(
    clean_env, monkeypatch
):
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(cache_dir, "bytecode_missing", lambda env, package="torch": False)
    cli.use_cache_dir(str(clean_env / "a"))
    assert sys.pycache_prefix is None and sys.dont_write_bytecode
    monkeypatch.setattr(cache_dir, "bytecode_missing", lambda env, package="torch": True)
    cli.use_cache_dir(str(clean_env / "b"))
    assert sys.pycache_prefix == str(clean_env / "b" / "pycache") and not sys.dont_write_bytecode
