"""A check stopped by SIGINT (Ctrl-C) or SIGTERM (a time limit) is no verdict, in one process or in
--jobs N: it exits 130, its report is headed INTERRUPTED and names what it did not check,
`reports/latest` stays where it was, and no traceback is printed. Real subprocesses, stopped after
the check has shown its first record: the order of events, never a duration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.report import INDEX, RESULTS, results_json, verdict
from harness.run import check, parallel, pytest_command
from tests.helpers import sigint_as_in_a_terminal

BACKENDS = ("--backend", "torch_native", "--backend", "torch_split")
FAMILIES = ("--family", "prefix", "--family", "decode", "--family", "prefill")


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """`check` in its own session (as a shell starts a command: Ctrl-C goes to its process group),
    with an earlier run that `latest` points at."""
    reports = tmp_path / "reports"
    (reports / "earlier").mkdir(parents=True)
    (reports / "latest").symlink_to("earlier")
    argv = [sys.executable, "-m", "harness", "check", "--device", "cpu", "--profile", "ci", "--no-probe"]
    argv += [*FAMILIES, "--reports", str(reports), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env["ATTN_HARNESS_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(pytest_command.ROOT)  # this checkout's harness, from any directory
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=env, start_new_session=True, preexec_fn=sigint_as_in_a_terminal)
    return proc, reports


def _ctrl_c(proc: subprocess.Popen) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground process group
    return proc.communicate(timeout=300)


def _interrupted_run(proc: subprocess.Popen, reports: Path, out: str, err: str) -> dict:
    """The checks every interrupted run passes; its results document."""
    assert proc.returncode == check.INTERRUPTED == 130, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err, out[-3000:] + err[-3000:]
    assert os.readlink(reports / "latest") == "earlier"  # not moved to the partial run
    run_dir = next(d for d in reports.iterdir() if d.name not in ("earlier", "latest"))
    data = results_json.load(run_dir / RESULTS)
    assert data["run"]["exit_status"] == check.INTERRUPTED  # the report's, not pytest's 2 (bad input here)
    assert verdict.verdict(data).startswith("INTERRUPTED")
    assert "attn-harness report: INTERRUPTED" in (run_dir / INDEX).read_text()
    assert "INTERRUPTED" in err and str(run_dir / INDEX) in err
    return data


def test_an_interrupted_check_exits_130_with_a_report_headed_interrupted(tmp_path):
    proc, reports = _start(tmp_path, "--backend", "torch_native")
    seen = []
    for line in proc.stdout:  # the first progress line comes with the first record
        seen.append(line)
        if " records (" in line:
            break
    assert seen and " records (" in seen[-1], "".join(seen) + proc.communicate()[1]
    out, err = _ctrl_c(proc)
    data = _interrupted_run(proc, reports, "".join(seen) + out, err)
    assert data["results"] and verdict.verdict(data) == "INTERRUPTED (passed so far)"  # what it checked
    not_run = verdict.unchecked(data)
    assert len(not_run) == 1 and not_run[0].startswith("torch_native@cpu: "), not_run
    assert "tests not run" in not_run[0]


def test_a_check_given_sigterm_by_a_time_limit_keeps_what_it_checked(tmp_path):
    """`timeout` (and a CI runner at its limit) sends SIGTERM to the check's process alone: the check
    stops as on Ctrl-C and writes the records it has, headed INTERRUPTED, instead of losing them."""
    proc, reports = _start(tmp_path, "--backend", "torch_native")
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if " records (" in line:
            break
    assert seen and " records (" in seen[-1], "".join(seen) + proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    data = _interrupted_run(proc, reports, "".join(seen) + out, err)
    assert data["results"] and verdict.verdict(data) == "INTERRUPTED (passed so far)"


def test_an_interrupted_parallel_check_exits_130_with_a_report_headed_interrupted(tmp_path):
    if check.job_cap()[0] < 2:
        pytest.skip(f"this host runs one process at once: {check.job_cap()[1]}")
    proc, reports = _start(tmp_path, *BACKENDS, "--jobs", "2")
    logs = reports.glob("*/parts/*.log")
    while not any(" records (" in log.read_text() for log in logs):  # a part has shown a record
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
        logs = reports.glob("*/parts/*.log")
    out, err = _ctrl_c(proc)
    data = _interrupted_run(proc, reports, out, err)
    assert verdict.unchecked(data), data["run"]


def test_a_parallel_check_given_sigterm_by_a_time_limit_keeps_what_it_checked(tmp_path):
    """SIGTERM to the parent alone: it stops its parts as on Ctrl-C, and their records are kept."""
    if check.job_cap()[0] < 2:
        pytest.skip(f"this host runs one process at once: {check.job_cap()[1]}")
    proc, reports = _start(tmp_path, *BACKENDS, "--jobs", "2")
    logs = reports.glob("*/parts/*.log")
    while not any(" records (" in log.read_text() for log in logs):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
        logs = reports.glob("*/parts/*.log")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    data = _interrupted_run(proc, reports, out, err)
    assert data["results"], data["run"]


def test_what_an_interrupted_parallel_check_did_not_run_is_named_part_by_part(tmp_path):
    never = parallel.Part(backend="flex_eager", results=tmp_path / "a.json", log=tmp_path / "a.log")
    stopped = parallel.Part(backend="torch_native", results=tmp_path / "b.json", log=tmp_path / "b.log")
    stopped.child, stopped.interrupted = object(), True
    stopped.run = {"interrupted": {"not_run": ["torch_native@cpu: 3 of 4 tests not run (decode)"]}}
    lost = parallel.Part(backend="torch_split", results=tmp_path / "c.json", log=tmp_path / "c.log")
    lost.child, lost.interrupted = object(), True
    done = parallel.Part(backend="flex", results=tmp_path / "d.json", log=tmp_path / "d.log")
    done.child = object()
    assert parallel.not_run([never, stopped, lost, done]) == [
        "flex_eager: never started",
        "torch_native@cpu: 3 of 4 tests not run (decode)",
        "torch_split: stopped; its results were lost",
    ]
