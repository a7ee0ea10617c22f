"""The JIT compile cache: its directory (harness/run/cache_dir.py): where it is by default, by
environment variable and by flag, that a library variable the user set wins, and that workers and the
check's pytest inherit it; and the warm-up that fills it beside the check (harness/run/speed/warm_gate.py):
a backend's parts wait for its JIT libraries, the others start at once, and `check` on CUDA starts it
unless told not to. Order of events only (an events log shared by the processes), never durations."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness import cli
from harness.cli import main
from harness.report import environment
from harness.run import cache_dir, check, parallel, pytest_command, workers
from harness.run.speed import schedule, warm_gate
from tests import warmup_fake
from tests.helpers import IdleGate, fresh_cache

CHILD = """
import json, os, pathlib, sys
root, backend = pathlib.Path(os.environ["EVENTS_ROOT"]), os.environ["B"]
with open(root / "events.log", "a") as log:
    log.write(f"part {backend}\\n")
    log.write(f"nice {backend} {os.nice(0)}\\n")
if backend == "plain":  # the gated ninja module waits for this: the plain part ran mid-build
    (root / "gate").touch()
path = sys.argv[sys.argv.index("--harness-results") + 1]
rec = dict(status="pass", backend=backend, device="cuda", family="decode", mode="DECODE", features=[],
           reason="")
doc = dict(format="attn-harness-results", version=1, run={}, environment={}, results=[rec])
open(path, "w").write(json.dumps(doc))
"""


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache directory for this test (restored afterwards)."""
    return fresh_cache(monkeypatch, tmp_path)


@pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja executable here")
def test_a_backend_starts_after_its_library_and_the_others_while_it_builds(cache, tmp_path):
    """The ninja module waits until the plain backend's part has run, so the plain part ran during
    the build; the library's own backend, first in the plan, started only after its link."""
    cache.mkdir(parents=True)
    (tmp_path / "child.py").write_text(CHILD)
    lines: list[str] = []
    backends = ["fake_ninja_backend", "plain"]
    gate = warm_gate.WarmGate([warmup_fake.ninja_library(["gated"])], "gpu", 2, backends, lines.append)
    plan = schedule.plan({"fake_ninja_backend": 11, "plain": 10}, 2, [])
    assert [p.backend for p in plan.parts] == backends  # the plan would start the gated one first
    assert not gate.ready("fake_ninja_backend") and gate.ready("plain")
    assert gate.nice() == warm_gate.warmup.BESIDE_NINJA_NICE  # a ninja build is pending
    env = {**os.environ, "PYTHONPATH": str(pytest_command.ROOT), "EVENTS_ROOT": str(cache)}
    gate.start()
    child = [sys.executable, str(tmp_path / "child.py")]
    out = io.StringIO()
    gated = {"ready": gate.ready, "nice": gate.nice}
    parts = parallel.run(child, env, "B", plan, tmp_path / "parts", tmp_path, out=out, **gated)
    summary = gate.join()
    events = warmup_fake.events(cache)
    order = [events.index(e) for e in ("part plain", "ninja linked gated", "part fake_ninja_backend")]
    assert order == sorted(order), events
    assert [p.name for p in parts] == ["plain", "fake_ninja_backend"]  # in start order
    assert all(p.code == 0 for p in parts) and gate.ready("fake_ninja_backend") and gate.nice() == 0
    base = os.nice(0)  # the plain part yielded to the build; the gated one started after it, at ours
    assert f"nice plain {base + warm_gate.warmup.BESIDE_NINJA_NICE}" in events
    assert f"nice fake_ninja_backend {base}" in events
    assert any(line.startswith("warmup: fakeninja done in ") for line in lines), lines
    assert summary[-1].startswith("warmup: 1 variants compiled in ")
    assert summary[-1].endswith(" beside the check")


def test_a_warmup_that_raises_opens_the_gate_and_says_why(monkeypatch):
    lines: list[str] = []

    def explode(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the warm-up itself broke")

    monkeypatch.setattr(warm_gate.warmup, "run", explode)
    library = warmup_fake.ninja_library(["a"])
    gate = warm_gate.WarmGate([library], "gpu", 1, ["fake_ninja_backend"], lines.append)
    gate.start()
    summary = gate.join()
    assert gate.ready("fake_ninja_backend")
    why = "RuntimeError: the warm-up itself broke"
    assert f"warmup: stopped: {why}; the check compiles what it needs itself" in lines
    assert summary[-1].endswith(f"; stopped: {why}")


def test_a_stamped_library_opens_the_gate_before_start_returns_without_importing_it(cache, monkeypatch):
    """A restored cache: the stamped library's backend may start as soon as the gate is started (so
    the parts start in the plan's order), its library never asked whether it imports; a library
    without a stamp is still warmed in the thread, and the summary keeps the chosen order."""
    warm = warmup_fake.library(["a"])
    assert warm_gate.warmup.main([warm], "gpu", None, 1, True, str(cache), lambda line: None) == 0

    def never(*args):  # noqa: ANN002, ANN202
        raise AssertionError("a stamped library was imported")

    warm.unavailable = never
    other = warmup_fake.ninja_library(["gated"])
    released, real_run = threading.Event(), warm_gate.warmup.run

    def held_run(libraries, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        assert released.wait(60)
        return real_run(libraries, *args, **kwargs)

    monkeypatch.setattr(warm_gate.warmup, "run", held_run)
    lines: list[str] = []
    gate = warm_gate.WarmGate([warm, other], "gpu", 1, ["fake_backend", "fake_ninja_backend"], lines.append)
    gate.start()
    assert gate.ready("fake_backend") and not gate.ready("fake_ninja_backend")
    assert any(line.startswith("warmup: fake: warmed on ") for line in lines)
    released.set()
    gate.join()
    assert gate.ready("fake_ninja_backend") and [t.library for t in gate.tallies] == ["fake", "fakeninja"]
    assert (gate.tallies[0].cached, gate.tallies[0].compiled) == (1, 0)


@pytest.fixture
def cuda_check(monkeypatch):
    """`check` on a faked CUDA machine: the gates it made, and whether the parallel run got one."""
    seen: dict = {}

    def fake_parallel(job, gate=None, say=print):  # noqa: ANN001, ANN202
        seen["gate_given"] = gate is not None
        return 0

    monkeypatch.setattr(check, "default_device", lambda: "cuda")
    monkeypatch.setattr(check.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(IdleGate, "made", [])
    monkeypatch.setattr(warm_gate, "WarmGate", IdleGate)
    monkeypatch.setattr(check, "run_parallel", fake_parallel)
    return seen


def test_check_on_cuda_warms_up_its_own_backends_beside_it(cuda_check, tmp_path):
    assert main(["check", "--reports", str(tmp_path), "--backend", "torch_native", "--backend", "fa4"]) == 0
    assert IdleGate.made == [("gpu", ["torch_native", "fa4"])] and cuda_check == {"gate_given": True}


def test_no_warmup_starts_no_gate(cuda_check, tmp_path):
    assert main(["check", "--reports", str(tmp_path), "--no-warmup"]) == 0
    assert IdleGate.made == [] and cuda_check == {"gate_given": False}


class _CompilingGate(IdleGate):
    def compiled(self) -> int:
        return 3


@pytest.mark.parametrize(("gate", "saved"), [(None, True), (IdleGate, True), (_CompilingGate, False)])
def test_part_times_are_kept_for_the_schedule_only_when_nothing_compiled_beside_them(
    monkeypatch, tmp_path, cache, gate, saved
):
    """Parts that shared the cores with the warm-up's compiles ran slower than the check costs: their
    times would mislead the next run's schedule (harness/run/speed/costs.py), so they are not saved."""
    from harness.run.speed import costs

    def fake_run(cmd, env, backends_env, plan, parts_dir, cwd, **kwargs):  # noqa: ANN001, ANN003, ANN202
        part = parallel.Part(
            backend="torch_native",
            results=parts_dir / "t.json",
            log=parts_dir / "t.log",
            code=0,
            seconds=42.0,
        )
        return [part]

    monkeypatch.setattr(parallel, "run", fake_run)
    given = None if gate is None else gate(None, "gpu", 1, ["torch_native"], print)
    run_dir, names = tmp_path / "run", ["torch_native"]
    job = check.Prepared(cmd=["pytest"], env={}, names=names, jobs=1, gpus=[], run_dir=run_dir,
                         profile="gpu", results=None, selection="sel", cwd=tmp_path, command_line="check")
    assert check.run_parallel(job, given) == 0
    timings = cache / costs.TIMINGS
    assert timings.is_file() is saved
    if saved:
        assert "42.0" in timings.read_text()


@pytest.mark.parametrize(
    "narrowing", [["-k", "swa"], ["--family", "decode"], ["-m", "swa"], ["--mode", "EXTEND"]]
)
def test_a_narrowed_check_starts_no_gate_and_says_so(cuda_check, tmp_path, capsys, narrowing):
    """The warm-up compiles what the whole profile draws: beside `check -k swa` it would cost more
    than the narrowed check compiles by itself."""
    assert main(["check", "--reports", str(tmp_path), *narrowing]) == 0
    assert IdleGate.made == [] and cuda_check == {"gate_given": False}
    assert "no warm-up beside a check narrowed by -k, -m, --family or --mode" in capsys.readouterr().out


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
