"""Several GPUs, faked on the CPU: which GPU each part of `check --jobs` sees, and which GPU the
isolation layer inside a process pins its worker to. A CUDA check's pytest process spawns its isolation
worker as it starts (harness/run/speed/prestart.py), without waiting for the worker's imports, and the
isolation layer takes that worker for its GPU."""

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.backends import BACKENDS_ENV
from harness.backends.torch_native import TorchNative
from harness.checks import footprint
from harness.checks.numeric import check_case
from harness.cli import main
from harness.run import check, isolation, parallel, pytest_command, workers
from harness.run.speed import prestart, schedule, settings, warm_gate
from tests.helpers import IdleGate, case

CHILD = """
import json, os, sys
path = sys.argv[sys.argv.index("--harness-results") + 1]
rec = dict(status="pass", backend=os.environ["B"], device="cuda", family="decode", mode="DECODE",
           features=[], reason=os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
doc = dict(format="attn-harness-results", version=1, run={}, environment={}, results=[rec])
open(path, "w").write(json.dumps(doc))
"""


def test_each_part_sees_only_its_slots_gpu_and_the_longest_start_first_round_the_gpus(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    plan = schedule.plan({"e": 5, "a": 40, "b": 39, "c": 38, "d": 37}, 4, ["3", "5"])
    env = {**os.environ, "PYTHONPATH": str(pytest_command.ROOT), "CUDA_VISIBLE_DEVICES": "3,5"}
    out = io.StringIO()
    child = [sys.executable, str(tmp_path / "child.py")]
    parts = parallel.run(child, env, "B", plan, tmp_path / "parts", tmp_path, out=out)
    assert [p.name for p in parts] == ["a", "b", "c", "d", "e"]
    started = [p.child.started for p in parts]
    assert started == sorted(started)  # started in the plan's order
    assert [p.gpu for p in parts[:4]] == ["3", "5", "3", "5"]  # the four longest: round the GPUs
    assert all(p.code == 0 and p.records[0]["reason"] == p.gpu for p in parts)  # what each one saw
    assert parts[4].gpu in ("3", "5") and parts[4].slot in range(4)
    said = out.getvalue()
    assert all(f"{p.name}: 1 record: 1 pass (" in said and f"GPU {p.gpu})" in said for p in parts)
    lines = parallel.gpu_lines(parts, 1.0)
    assert lines[0].startswith("GPU 3: busy ") and "a " in lines[0] and "c " in lines[0]
    assert lines[1].startswith("GPU 5: busy ") and "b " in lines[1] and "d " in lines[1]
    assert lines[2].startswith("wall 1 s; busy per GPU: 3 ") and "; longest part " in lines[2]
    records = parallel.part_records(parts)
    assert records[0]["part"] == "a" and records[0]["gpu"] == "3" and records[0]["exit_status"] == 0
    starts = [r["start_s"] for r in records]  # when each started, after the run's first start
    assert starts == sorted(starts) and 0 <= starts[0]
    assert parts[4].start_s >= min(p.start_s + p.seconds for p in parts[:4])  # it waited for a slot


def test_without_gpus_the_parts_keep_the_environment_they_were_given(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    plan = schedule.plan({"a": 1, "b": 1}, 2, [])
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = str(pytest_command.ROOT)
    child = [sys.executable, str(tmp_path / "child.py")]
    parts = parallel.run(child, env, "B", plan, tmp_path / "parts", tmp_path, out=io.StringIO())
    assert [(p.gpu, p.records[0]["reason"]) for p in parts] == [(None, "unset"), (None, "unset")]
    lines = parallel.gpu_lines(parts, 2.0)
    assert lines[0].startswith("the CPU: busy ") and lines[1].startswith("wall 2 s; busy ")
    assert "per GPU" not in lines[1]


def early_worker(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether the pytest command spawns its isolation worker as it starts: prestart's module loaded
    ahead of the harness's plugin (which imports torch), and asked to."""
    plugins = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-p"]
    loaded = "harness.run.speed.prestart" in plugins
    if loaded:
        assert plugins.index("harness.run.speed.prestart") < plugins.index("harness.run.pytest_plugin")
    assert loaded == (env.get(settings.PRESTART_ENV) == "1")
    return loaded


@pytest.fixture
def two_gpus(monkeypatch):
    """A CUDA machine with GPUs 0 and 1 visible and 32 cores, as far as `check` can tell."""
    monkeypatch.setattr(check, "default_device", lambda: "cuda")
    monkeypatch.setattr(isolation, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(check.os, "cpu_count", lambda: 32)
    monkeypatch.setattr(footprint, "available", lambda device: 256 << 30)  # --jobs is not capped
    seen = {}

    def fake_parallel(job, gate=None, say=print):  # noqa: ANN001, ANN202
        cmd, env = job.cmd, job.env
        seen.update(jobs=job.jobs, gpus=job.gpus, visible=env.get("CUDA_VISIBLE_DEVICES"))
        seen.update(threads=env.get("OMP_NUM_THREADS"), early=early_worker(cmd, env))
        seen.update(compile_threads=env.get(parallel.COMPILE_THREADS), nvcc_jobs=env.get(parallel.NVCC_JOBS))
        seen.update(quick="--harness-quick-exit" in cmd)
        return 0

    def fake_run(cmd, cwd, env):  # noqa: ANN001, ANN202
        seen.update(jobs=1, visible=env.get("CUDA_VISIBLE_DEVICES"), threads=env.get("OMP_NUM_THREADS"))
        seen.update(early=early_worker(cmd, env), quick="--harness-quick-exit" in cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(check, "run_parallel", fake_parallel)
    monkeypatch.setattr(check, "run_pytest", fake_run)
    monkeypatch.setattr(warm_gate, "WarmGate", IdleGate)
    return seen


@pytest.mark.parametrize(
    ("args", "jobs", "gpus"),
    [([], 16, ["0", "1"]), (["--gpus", "1"], 8, ["1"]), (["--gpus", "1,0", "--jobs", "3"], 3, ["1", "0"])],
)
def test_check_spreads_over_every_visible_gpu_unless_told_and_scales_its_jobs(
    two_gpus, tmp_path, args, jobs, gpus
):
    assert main(["check", "--reports", str(tmp_path), *args]) == 0
    assert two_gpus["jobs"] == jobs and two_gpus["gpus"] == gpus
    assert two_gpus["quick"]  # each part ends as soon as pytest is done (pytest_plugin.quick_exit)
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert two_gpus["visible"] == (",".join(gpus) if "--gpus" in args else inherited)


def test_one_process_on_the_gpus_given_sees_only_them(two_gpus, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["check", "--reports", str(tmp_path), "--gpus", "1", "--jobs", "1"]) == 0
    assert two_gpus == {"jobs": 1, "visible": "1", "threads": None, "early": True, "quick": False}


@pytest.mark.parametrize(("given", "threads", "nvcc_jobs"), [(None, "1", "2"), ("6", "6", "6")])
def test_the_processes_of_a_cuda_check_get_one_cpu_thread_unless_the_user_chose(
    two_gpus, tmp_path, monkeypatch, given, threads, nvcc_jobs
):
    """16 parts' workers, each with torch's thread per core, oversubscribed a 32-core host
    (parallel.CUDA_PART_THREADS), inductor would start a compile process per core in each
    (parallel.COMPILE_THREADS), and a FlashInfer build cores + 2 nvcc (parallel.NVCC_JOBS); a user's
    choice of any is kept."""
    for name in ("OMP_NUM_THREADS", parallel.COMPILE_THREADS, parallel.NVCC_JOBS):
        monkeypatch.delenv(name, raising=False)
        if given:
            monkeypatch.setenv(name, given)
    assert main(["check", "--reports", str(tmp_path)]) == 0
    assert two_gpus["jobs"] == 16 and two_gpus["threads"] == threads
    assert two_gpus["compile_threads"] == threads and two_gpus["nvcc_jobs"] == nvcc_jobs


@pytest.mark.parametrize(
    ("args", "isolate", "early"),
    [([], None, True), (["--jobs", "1"], None, True), (["--device", "cpu", "--jobs", "2"], None, False),
     ([], "0", False)],
)
def test_the_processes_of_an_isolated_cuda_check_spawn_their_workers_as_they_start(
    two_gpus, tmp_path, monkeypatch, args, isolate, early
):
    if isolate is None:
        monkeypatch.delenv(settings.ISOLATE_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.ISOLATE_ENV, isolate)
    assert main(["check", "--reports", str(tmp_path), *args]) == 0
    assert two_gpus["early"] is early


def test_the_processes_of_a_cpu_check_keep_torchs_threads(two_gpus, tmp_path, monkeypatch):
    """A CPU check's references are float64 arithmetic on the host: its threads are its speed."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["check", "--reports", str(tmp_path), "--device", "cpu", "--jobs", "2"]) == 0
    assert two_gpus["jobs"] == 2 and two_gpus["threads"] is None


@pytest.mark.parametrize(
    ("value", "message"),
    [("0,2", "--gpus 0,2: '2' is not a visible GPU (visible: 0,1)"), ("1,1", "a GPU is named twice")],
)
def test_gpus_not_visible_or_repeated_are_one_line_errors(two_gpus, tmp_path, capsys, value, message):
    assert main(["check", "--reports", str(tmp_path), "--gpus", value]) == 2
    assert message in capsys.readouterr().err and not two_gpus


def test_gpus_on_a_cpu_check_is_an_error(tmp_path, capsys):
    assert main(["check", "--device", "cpu", "--gpus", "0", "--reports", str(tmp_path)]) == 2
    assert "--gpus 0: this check runs on the CPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("visible", "xdist", "expected"),
    [
        ("3", "", "3"),  # a part of check --jobs: its one GPU
        ("3", "gw2", "3"),  # xdist in a process that sees one GPU: every worker on it
        ("2,3", "", "2"),  # several GPUs, no xdist: the first, as cuda:0 is
        ("2,3", "gw1", "3"),
        ("2,3", "gw2", "2"),
        ("", "gw0", None),
        ("-1", "", None),
        ("4,-1,5", "gw1", "4"),  # CUDA reads no entry after an invalid one
    ],
)
def test_the_isolation_worker_is_pinned_to_the_gpu_this_process_should_drive(
    monkeypatch, visible, xdist, expected
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", xdist)
    assert isolation._process_gpu() == expected


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
        from harness.run.speed import prestart, settings

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
