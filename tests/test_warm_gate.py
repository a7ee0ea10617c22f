"""The warm-up beside the check (harness/run/speed/warm_gate.py): a backend's parts wait for its JIT
libraries, the others start at once, and `check` on CUDA starts it unless told not to. Order of
events only (an events log shared by the processes), never durations."""

from __future__ import annotations

import io
import os
import shutil
import sys
import threading

import pytest

from harness.cli import main
from harness.run import check, parallel, pytest_command
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
