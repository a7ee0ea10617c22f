"""python -m harness.checks.model.table: a worker that dies is a crash row, and the rest still runs."""

import os
from pathlib import Path

from harness.backends.torch_native import TorchNative
from harness.checks.model import check as M
from harness.checks.model import table as model_table
from harness.core.modes import Mode
from harness.run.workers import Worker

ROOT = Path(__file__).resolve().parent.parent


class _Dies(TorchNative):
    name = "dies"

    def run(self, batch):
        if batch.mode == Mode.DECODE:
            os._exit(7)  # as a process killed by an illegal memory access would vanish
        return super().run(batch)


def test_a_dying_worker_becomes_a_crash_row_and_the_next_job_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    jobs = [("tests.test_model_table:_Dies", "mistral"), ("torch_native", "mistral")]
    rows = model_table.run_jobs(jobs, "cpu", timeout=300)
    assert [(r.backend, r.status) for r in rows] == [
        ("tests.test_model_table:_Dies", "crash"),
        ("torch_native", "pass"),
    ]
    assert "worker exited with status 7" in rows[0].reason
    assert "bitwise equal" in rows[1].deterministic


def test_jobs_run_in_the_callers_worker_which_stays_running(monkeypatch):
    """The suite passes its isolation worker: the jobs run in that process (the dying job ends it,
    the next job starts it again) and it is left running for the suite's next case."""
    monkeypatch.chdir(ROOT)
    worker = Worker("model-table-test")
    try:
        worker.start()
        jobs = [("tests.test_model_table:_Dies", "mistral"), ("torch_native", "mistral")]
        rows = model_table.run_jobs(jobs, "cpu", timeout=300, worker=worker)
        assert [r.status for r in rows] == ["crash", "pass"]
        assert worker.started == 2  # its first process died in the first job; the second ran the next
        assert worker.proc is not None and worker.proc.is_alive()
    finally:
        worker.stop()


def test_fallback_summary_groups_steps_by_reason():
    text = M.fallback_summary({"decode 1": "no DECODE", "decode 2": "no DECODE", "verify tree": "no trees"})
    assert text == "decode 1, decode 2: no DECODE; verify tree: no trees"
