"""harness/run/speed/prestart.py: a CUDA check's pytest process spawns its isolation worker as it starts,
without waiting for the worker's imports, and the isolation layer takes that worker for its GPU."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.backends import BACKENDS_ENV
from harness.backends.torch_native import TorchNative
from harness.checks.numeric import check_case
from harness.run import isolation, workers
from harness.run.speed import prestart, settings
from tests.helpers import case

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_early():
    """prestart's module state, emptied before and after (its import in this process spawned none)."""
    prestart._EARLY.clear()
    yield prestart._EARLY
    for w in prestart._EARLY:
        w.stop(kill=True)
    prestart._EARLY.clear()


def test_spawn_returns_while_the_worker_imports_and_start_waits_for_it(tmp_path, monkeypatch):
    """The worker's preload waits for a file the test writes only after spawn() returned: a spawn
    that waited for the imports would never see it (the module gives up after 60 s and the worker dies)."""
    gate = tmp_path / "go"
    (tmp_path / "gated_import.py").write_text(
        textwrap.dedent(f"""
        import pathlib, time
        for _ in range(600):
            if pathlib.Path({str(gate)!r}).exists():
                break
            time.sleep(0.1)
        else:
            raise SystemExit("the gate never opened")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    w = workers.Worker(preload=("gated_import",))
    try:
        w.spawn()
        assert w.started == 1 and not w.ready and w.proc.is_alive()
        gate.write_text("")
        w.start()
        assert w.ready and w.started == 1
        assert w.call(os.getpid, (), 60).value == w.proc.pid
    finally:
        w.stop()
    assert not w.ready


@pytest.mark.parametrize(
    ("flag", "visible", "xdist", "pinned"),
    [
        ("1", "3", None, "3"),  # a part of check --jobs: its slot's GPU
        ("1", "2,3", None, "2"),  # a one-process check on several GPUs: the first, as isolation pins it
        ("1", None, None, "0"),  # every GPU visible
        ("1", "-1", None, None),  # no GPU: nothing to pin
        ("1", "3", "gw1", None),  # pytest-xdist picks GPUs by worker: the isolation layer's own choice
        (None, "3", None, None),  # not asked: a plain pytest run
        ("0", "3", None, None),
    ],
)
def test_the_worker_is_spawned_only_when_asked_pinned_where_isolation_pins_it(
    monkeypatch, no_early, flag, visible, xdist, pinned
):
    spawned = []
    monkeypatch.setattr(workers.Worker, "spawn", lambda self: spawned.append(self.env))
    given = {settings.PRESTART_ENV: flag, "CUDA_VISIBLE_DEVICES": visible, "PYTEST_XDIST_WORKER": xdist}
    for name, value in given.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    worker = prestart.start()
    assert settings.PRESTART_ENV not in os.environ  # read once: what this process starts later spawns nothing
    if pinned is None:
        assert worker is None and spawned == [] and no_early == []
    else:
        assert spawned == [{"CUDA_VISIBLE_DEVICES": pinned}] and no_early == [worker]
        assert worker.preload == prestart.PRELOAD == isolation.PRELOAD
        assert worker.warm == (prestart.warm, ())
        if xdist is None:  # the isolation layer's own choice, on a machine with two GPUs
            monkeypatch.setenv("PYTEST_XDIST_WORKER", "")
            monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
            assert prestart.worker_env(isolation._process_gpu()) == worker.env


class Stub:
    def __init__(self, env: dict) -> None:
        self.env, self.stopped = env, False

    def stop(self, kill: bool = False) -> None:
        self.stopped = kill


def test_claim_gives_the_worker_for_its_gpu_once_and_stops_one_for_another(no_early):
    mine = Stub({"CUDA_VISIBLE_DEVICES": "1"})
    no_early.append(mine)
    assert prestart.claim({"CUDA_VISIBLE_DEVICES": "1"}) is mine and not mine.stopped
    assert prestart.claim({"CUDA_VISIBLE_DEVICES": "1"}) is None
    other = Stub({"CUDA_VISIBLE_DEVICES": "0"})
    no_early.append(other)
    assert prestart.claim({"CUDA_VISIBLE_DEVICES": "1"}) is None and other.stopped and no_early == []


def test_an_isolated_runner_checks_its_cases_in_the_worker_spawned_early(no_early):
    early = workers.Worker(preload=prestart.PRELOAD)
    early.spawn()
    no_early.append(early)
    runner = isolation.IsolatedRunner()  # no GPU: the worker env {} the early one has
    try:
        assert runner.worker is early and no_early == []
        res = runner.run(check_case, TorchNative(), case("EXTEND", ((5, 3),), window_left=2), "cpu")
        assert res.status == "pass" and early.started == 1
    finally:
        runner.close()


def test_a_pytest_process_loading_the_module_first_hands_its_worker_to_the_isolation_layer(tmp_path):
    """The path `check` takes: `-p harness.run.speed.prestart` with the variable set spawns the worker as
    pytest loads its plugins; the suite's runner for the GPU takes that process (same pid), which
    loaded the part's backend before its first call (here the CUDA context it then creates fails, and
    only its log says so), and the worker itself neither sees the variable nor spawns another."""
    (tmp_path / "test_early.py").write_text(
        textwrap.dedent("""
        import os
        from harness.run import isolation
        from harness.run.speed import prestart

        def test_early_worker():
            (early,) = prestart._EARLY
            pid = early.proc.pid
            runner = isolation.runner_for("cuda")
            assert runner.worker is early and early.proc.pid == pid
            assert runner.worker.call(os.getenv, (settings.PRESTART_ENV,), 120).value is None
            assert runner.worker.call(os.getenv, ("CUDA_VISIBLE_DEVICES",), 120).value == "0"
            assert runner.worker.call(prestart.warmed, (), 120).value == ["torch_split"]
            assert runner.worker.started == 1
    """)
    )
    env = {**os.environ, settings.PRESTART_ENV: "1", "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": str(ROOT)}
    env[BACKENDS_ENV] = "torch_split"
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", *prestart.OPTIONS, "-p", "no:cacheprovider", "test_early.py"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
