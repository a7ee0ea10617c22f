"""How a check's run as a whole ends, beyond its cases' verdicts: a check that checked nothing is
not green (exit 3, one line saying why), an environment fault is named before anything runs
(exit 2), --jobs is capped by the host, and a check leaves the checkout as it found it. A part's
pytest process (`check` passes --harness-quick-exit) ends as soon as pytest is done: its output and
results written and its exit status pytest's, without Python's finalisation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends import Backend, load
from harness.checks import footprint
from harness.cli import main
from harness.run import cache_dir, check, pytest_command

ABSENT_REASON = "its library (absentlib) is not installed"
STATE = (".pytest_cache", ".hypothesis")  # what pytest and hypothesis keep between runs


def absent() -> Backend:
    """torch_native as a plugin whose library is not installed here: every test of it skips."""
    backend = load("torch_native")
    backend.available = lambda device: ABSENT_REASON
    return backend


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    return env | {"ATTN_HARNESS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(pytest_command.ROOT)}


def test_a_check_that_checked_nothing_exits_3_and_says_why_in_one_line(tmp_path):
    argv = [sys.executable, "-m", "harness", "check", "--backend", "tests.test_check_outcome:absent"]
    argv += ["--family", "decode", "--no-progress", "--reports", str(tmp_path / "reports")]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=pytest_command.ROOT, env=_env(tmp_path),
                          timeout=600)
    assert proc.returncode == check.NOTHING_CHECKED == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "NOTHING CHECKED" in line]
    assert len(lines) == 1 and ABSENT_REASON in lines[0], proc.stderr
    page = (tmp_path / "reports" / "latest" / "index.html").read_text()
    assert "attn-harness report: NOTHING CHECKED" in page


@pytest.mark.parametrize("command", [["check"], ["repro", '{"mode": "DECODE", "requests": [{"prefix_len": 4, '
                                     '"extend_len": 1}]}'], ["warmup"]])
@pytest.mark.parametrize("how", ["flag", "variable"])
def test_an_unusable_cache_directory_is_one_line_and_exit_2_before_anything_runs(
    tmp_path, monkeypatch, capsys, command, how
):
    monkeypatch.delenv(cache_dir.ENV, raising=False)
    monkeypatch.setattr(check, "run_check", lambda *a: pytest.fail("the check ran"))
    for bad, why in (("/proc", "not writable"), (str(tmp_path / "no" / "such"), "no such directory")):
        if how == "flag":
            code = main([*command, "--cache-dir", bad])
        else:
            monkeypatch.setenv(cache_dir.ENV, bad)
            code = main(command)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        name = "--cache-dir" if how == "flag" else f"${cache_dir.ENV}"
        assert err.startswith(f"error: {name} {Path(bad).resolve()}: {why}"), err
    assert not (tmp_path / "no").exists()


def test_a_missing_cache_directory_under_an_existing_parent_is_created(tmp_path):
    assert cache_dir.problem(str(tmp_path / "new")) is None and (tmp_path / "new").is_dir()
    assert cache_dir.problem(None, {"HOME": str(tmp_path / "home")}) is None  # the default: parents too


@pytest.mark.parametrize(("cores", "gib", "asked", "jobs"), [(2, 64, 64, 2), (64, 5, 64, 2), (8, 64, 4, 4)])
def test_jobs_are_capped_by_cores_and_memory_in_one_line(monkeypatch, cores, gib, asked, jobs):
    monkeypatch.setattr(check.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(footprint, "available", lambda device: gib << 30)
    said = []
    assert check.jobs(asked, cuda=False, say=said.append) == jobs
    if jobs == asked:
        assert said == []
    else:
        assert said == [f"attn-harness check: --jobs {asked} capped to {jobs}: {cores} cores, {gib:.1f} GiB "
                        f"memory available ({check.GIB_PER_JOB:g} GiB a process)"]


def _state(root: Path) -> set[tuple[str, int]]:
    """Every file and directory under the checkout's pytest and hypothesis state, with its mtime."""
    out = set()
    for top in (root, root / "cases"):
        for name in STATE:
            for p in [top / name, *(top / name).rglob("*")] if (top / name).exists() else []:
                out.add((str(p), p.stat().st_mtime_ns))
    return out


@pytest.mark.parametrize("profile", ["ci", "dev"])  # dev keeps a hypothesis example database
def test_a_check_leaves_the_checkout_untouched(tmp_path, profile):
    root = pytest_command.ROOT
    before = _state(root)
    argv = [sys.executable, "-m", "harness", "check", "--backend", "torch_native", "--family", "decode"]
    argv += ["-k", "full", "--device", "cpu", "--profile", profile, "--no-progress", "--reports",
             str(tmp_path / "reports")]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _state(root) == before
    run = (tmp_path / "reports" / "latest").resolve()
    assert (run / ".pytest_cache").is_dir()  # `pytest cases --lf -o cache_dir=<run>/.pytest_cache`


ROOT = Path(__file__).resolve().parent.parent

SUITE = """
import atexit
import os
from pathlib import Path


def test_pass():
    atexit.register(Path(os.environ["EXIT_MARK"]).write_text, "finalised")


def test_fail():
    assert False, "a failure <sim>"
"""


@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize(
    ("select", "status", "last"), [("pass", 0, "1 passed"), ("", 1, "1 failed"), ("none", 5, "")]
)
def test_a_quick_exit_keeps_pytest_s_status_output_and_results_and_skips_finalisation(
    tmp_path, quick, select, status, last
):
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env |= {"PYTHONPATH": str(ROOT), "EXIT_MARK": str(tmp_path / "mark")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_suite.py"]
    cmd += ["--harness-results", str(tmp_path / "r.json"), *(["-k", select] if select else [])]
    cmd += ["--harness-quick-exit"] if quick else []
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert last in proc.stdout.splitlines()[-1] and "results: " in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["run"]["exit_status"] == status
    ran_pass = select in ("pass", "")  # test_pass registered an exit handler
    assert (tmp_path / "mark").exists() == (ran_pass and not quick)  # it ran: Python finalised
