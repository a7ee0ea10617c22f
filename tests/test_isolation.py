"""Crash and hang isolation: a dying, raising or sleeping backend becomes a CRASH or HANG result, the
run goes on with a fresh worker, and the suite and the mutant hunts report it as such."""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import backends
from harness.backends.torch_native import TorchNative
from harness.checks.numeric import check_case
from harness.core.results import CaseResult
from harness.mutants import by_name, hunt
from harness.run import isolation
from harness.run.speed import settings
from harness.run.suite import Target, run_family
from tests.helpers import case

GOOD = case("EXTEND", ((5, 3),), window_left=2)
EXACT = case("DECODE", ((40, 1),), window_left=7, hybrid_swa_pool=True, swa_pool_exact=True, page_size=16)


class Aborts(TorchNative):
    """A kernel that takes the process down, as a fatal CUDA error can."""

    def run(self, batch):
        os.abort()


class AbortsAmongManyModules(TorchNative):
    """Aborts in a process that has loaded ~400 extension modules (a GPU host's Python loads ~175):
    faulthandler lists them all after its "Fatal Python error" line."""

    def run(self, batch):
        for i in range(400):
            sys.modules[f"attn_harness_fake_extension_{i:03d}"] = torch._C
        os.abort()


class Segfaults(TorchNative):
    def run(self, batch):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


class Sleeps(TorchNative):
    """A kernel that never returns (a deadlock) on cases with seed 7, and works on the others."""

    def run(self, batch):
        if batch.case.seed == 7:
            time.sleep(3600)
        return super().run(batch)


class CompilesPastTheLimit(TorchNative):
    """A first use of a JIT variant whose build outlasts the case's limit: a compiler child (a process
    named nvcc) still running; its pid is written to `pid_file` so that the test can end it."""

    def __init__(self, nvcc: str, pid_file: str) -> None:
        super().__init__()
        self.nvcc, self.pid_file = nvcc, pid_file

    def run(self, batch):
        child = subprocess.Popen([self.nvcc, "600"])
        Path(self.pid_file).write_text(str(child.pid))
        time.sleep(3600)


class RaisesCudaError(TorchNative):
    def run(self, batch):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.fixture
def runner():
    # A backend's first case in a worker may take long (imports; on a GPU, kernel compilation); the
    # hanging case below comes after a normal one, so the short limit applies to it.
    r = isolation.IsolatedRunner(timeout=5, first_timeout=120)
    yield r
    r.close()


def test_crash_and_hang_are_results_and_the_run_goes_on(runner):
    seq = [
        (TorchNative(), "pass"), (Aborts(), "crash"), (TorchNative(), "pass"), (Sleeps(), "pass"),
        (Sleeps(), "hang"), (TorchNative(), "pass"), (Segfaults(), "crash"), (RaisesCudaError(), "crash"),
        (TorchNative(), "pass"),
    ]
    results = [
        runner.run(check_case, b, GOOD.replace(seed=7 * (i == 4)), "cpu") for i, (b, _) in enumerate(seq)
    ]
    assert [r.status for r in results] == [want for _, want in seq], [r.reason for r in results]
    abort, hang, segv, raised = results[1], results[4], results[6], results[7]
    assert "killed by signal SIGABRT" in abort.reason and "Fatal Python error: Aborted" in abort.reason
    assert "no result within 5s" in hang.reason
    assert "killed by signal SIGSEGV" in segv.reason and "Segmentation fault" in segv.reason
    assert "test_isolation.py" in segv.reason  # faulthandler's stack names the crashing frame
    assert "RuntimeError: CUDA error: an illegal memory access" in raised.reason
    assert "traceback" in raised.extra
    # One worker for the first cases, then a fresh one after each of the four crashes or hangs only:
    # healthy cases reuse the worker they find.
    assert runner.worker.started == 5


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_hang_while_compiling_says_so(tmp_path):
    nvcc, pid_file = tmp_path / "nvcc", tmp_path / "pid"
    nvcc.symlink_to(shutil.which("sleep"))
    runner = isolation.IsolatedRunner(timeout=5, first_timeout=10)  # the backend's first case: 10 s
    try:
        res = runner.run(check_case, CompilesPastTheLimit(str(nvcc), str(pid_file)), GOOD, "cpu")
    finally:
        runner.close()
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # orphaned by the worker's kill
    assert res.status == "hang"
    assert "no result within 10s while compiling (its worker was running nvcc x1" in res.reason


def test_a_crash_keeps_its_fatal_line_after_a_long_extension_module_list(runner):
    res = runner.run(check_case, AbortsAmongManyModules(), GOOD, "cpu")
    assert res.status == "crash" and "killed by signal SIGABRT" in res.reason
    assert "Fatal Python error: Aborted" in res.reason
    assert "attn_harness_fake_extension_" not in res.reason and "(list dropped)" in res.reason


def excused_crash(backend, case, device):
    """What a check returns when a known library issue excuses a crash: xfail, keeping the traceback."""
    return CaseResult(
        status="xfail", backend=backend.name, device=device, case=case, reason="known issue x",
        extra={"traceback": "T"},
    )


def test_a_crash_a_known_issue_excuses_still_retires_its_worker(runner):
    """The backend raised (its CUDA context may be gone) even though the result is xfail: the next
    case gets a fresh worker, started as the fault is reported."""
    first = runner.run(case_process, TorchNative(), GOOD, "cpu").extra["pid"]
    assert runner.worker.started == 1
    assert runner.run(excused_crash, TorchNative(), GOOD, "cpu").status == "xfail"
    assert runner.worker.started == 2
    assert runner.run(case_process, TorchNative(), GOOD, "cpu").extra["pid"] != first
    assert runner.worker.started == 2


def case_process(backend, case, device):
    """A check that reports the process it ran in and when that process started, in seconds since
    boot (/proc/self/stat's start time, as /proc/uptime counts)."""
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    started = ticks / os.sysconf("SC_CLK_TCK")
    return CaseResult(
        status="pass", backend=backend.name, device=device, case=case,
        extra={"pid": os.getpid(), "started": started},
    )


def _children() -> set[int]:
    """This process's live child processes but multiprocessing's resource tracker (started with the
    first spawned process, it outlives them)."""
    out = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                tracker = b"resource_tracker" in f.read()
        except (OSError, ValueError):
            continue
        if int(ppid) == os.getpid() and state != "Z" and not tracker:
            out.add(int(entry))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_after_a_fault_the_next_faults_replacement_is_already_started(runner):
    """From the first fault on, a spare process starts beside the worker: the case after the second
    fault runs in a process started as the first fault was reported, and closing the runner ends
    both."""
    before = _children()
    pids = [runner.run(case_process, TorchNative(), GOOD, "cpu").extra["pid"]]
    assert runner.run(check_case, RaisesCudaError(), GOOD, "cpu").status == "crash"
    with open("/proc/uptime") as f:
        first_fault_reported = float(f.read().split()[0])
    pids.append(runner.run(case_process, TorchNative(), GOOD, "cpu").extra["pid"])
    assert runner.run(check_case, RaisesCudaError(), GOOD, "cpu").status == "crash"
    third = runner.run(case_process, TorchNative(), GOOD, "cpu")
    pids.append(third.extra["pid"])
    assert len(set(pids)) == 3 and third.extra["started"] <= first_fault_reported
    assert len(_children() - before) == 2  # the worker and its spare
    runner.close()
    assert _children() - before == set()


def test_pool_spreads_cases_over_workers_and_isolates_each():
    pool = isolation.WorkerPool("cpu", size=2)  # the default limits: only a hang would meet them
    try:
        cases = [GOOD, GOOD.replace(seed=1), GOOD.replace(seed=2), GOOD.replace(seed=3)]
        res = pool.map(check_case, TorchNative(), cases, "cpu")
        assert [r.status for r in res] == ["pass"] * 4
        assert [r.case for r in res] == cases
        assert all(r.worker.started == 1 for r in pool.runners)  # both workers ran, neither restarted
    finally:
        pool.close()


def test_the_suite_reports_a_crash_as_a_failed_test(monkeypatch):
    monkeypatch.setenv(settings.ISOLATE_ENV, "1")
    records = []
    t = Target("tests.test_isolation:Aborts", "cpu", "prefill", "full")
    with pytest.raises(AssertionError, match="CRASH: the worker process died"):
        run_family(t, records.append)
    assert records and records[0].status == "crash"
    assert all(r is records[0] for r in records)  # hypothesis's replays came from the memo: one run


def test_an_exact_pool_untranslated_read_crashes_and_the_hunt_reports_it(monkeypatch):
    monkeypatch.setenv(settings.ISOLATE_ENV, "1")
    d = hunt(by_name("torch_native~swa_untranslated_exact"), "decode", max_examples=5)
    assert d.caught and d.status == "crash" and d.examples == 1
    assert "IndexError" in d.reason and "out of bounds" in d.reason


def test_in_process_a_backend_exception_is_a_crash_result():
    res = check_case(by_name("torch_native~swa_untranslated_exact").make(), EXACT, "cpu")
    assert res.status == "crash" and "IndexError" in res.reason and "(at pool.py:" in res.reason
    assert "Traceback" in res.extra["traceback"]


def test_isolation_is_on_for_cuda_and_by_request(monkeypatch):
    monkeypatch.delenv(settings.ISOLATE_ENV, raising=False)
    assert isolation.enabled("cuda") and not isolation.enabled("cpu")
    monkeypatch.setenv(settings.ISOLATE_ENV, "1")
    assert not isolation.enabled("cpu")  # read once, where the process started
    settings.reset()
    assert isolation.enabled("cpu")
    monkeypatch.setenv(settings.ISOLATE_ENV, "0")
    settings.reset()
    assert not isolation.enabled("cuda")


def test_exit_descriptions():
    assert isolation.describe_exit(-6) == "killed by signal SIGABRT"
    assert isolation.describe_exit(3) == "exit status 3"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
)
def test_gpu_exact_pool_untranslated_read_is_a_crash_and_the_run_continues():
    """The issue's demonstration: on CUDA, reading an exact-size SWA pool with untranslated slots is a
    device-side assert (torch_native indexes with bounds checks); the next case runs in a fresh worker."""
    mutant = by_name("torch_native~swa_untranslated_exact").make()
    runner = isolation.IsolatedRunner()
    try:
        res = [runner.run(check_case, b, EXACT, "cuda") for b in (TorchNative(), mutant, TorchNative())]
    finally:
        runner.close()
    print("\n".join(f"{r.backend}: {r.status.upper()}: {r.reason[:300]}" for r in res))
    assert [r.status for r in res] == ["pass", "crash", "pass"]
    crash = res[1].reason + res[1].extra.get("worker_output", "")
    assert "CUDA error" in crash or "device-side assert" in crash or "illegal memory access" in crash
    assert runner.worker.started == 2


def test_the_probe_of_a_failure_runs_in_the_isolation_worker(monkeypatch):
    """The mask probe reruns the backend: where cases are isolated it runs in the worker too, so a
    backend that takes its process down leaves the probe's error, not a dead pytest process."""
    monkeypatch.setenv(settings.ISOLATE_ENV, "1")
    aborts = backends.load("tests.test_isolation:Aborts")
    out = isolation.probe_failure(aborts, case("DECODE", ((40, 1),)), "cpu")
    assert out["runs"] == 0 and "died" in out["error"]
