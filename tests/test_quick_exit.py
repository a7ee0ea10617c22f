"""A part's pytest process (`check` passes --harness-quick-exit) ends as soon as pytest is done:
its output and results written and its exit status pytest's, without Python's finalisation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
