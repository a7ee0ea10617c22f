"""harness/run/compilers.py: a timeout says whether its worker was compiling, or other processes were,
read from a process table (a fake /proc here, and the real one through a worker)."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.run import compilers, workers


def fake_proc(root: Path, table: dict[int, tuple[int, str]]) -> Path:
    """A /proc with a stat file per process: 'pid (comm) S ppid ...'."""
    for pid, (ppid, comm) in table.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    (root / "self").mkdir()  # not a process: skipped
    return root


WORKER = 100
BUILDING = {
    1: (0, "init"),
    WORKER: (1, "python3"),
    101: (WORKER, "ninja"),
    102: (101, "nvcc"),
    103: (102, "cicc"),
    104: (102, "cicc"),
    200: (1, "python (part 2)"),
}


def test_a_worker_running_compilers_was_compiling(tmp_path):
    said = compilers.survey(WORKER, fake_proc(tmp_path, BUILDING))
    assert said.startswith("while compiling")
    assert "cicc x2" in said and "nvcc x1" in said and "ninja x1" in said


def test_compilers_of_another_process_are_what_the_case_may_have_waited_for(tmp_path):
    said = compilers.survey(200, fake_proc(tmp_path, BUILDING))
    assert said.startswith("while other processes were compiling") and "cicc x2" in said


def test_no_compiler_running_says_nothing(tmp_path):
    idle = {pid: row for pid, row in BUILDING.items() if row[1] not in compilers.COMPILERS}
    assert compilers.survey(WORKER, fake_proc(tmp_path, idle)) == ""
    assert compilers.survey(WORKER, tmp_path / "absent") == ""


def test_a_name_with_spaces_and_parentheses_is_read_whole(tmp_path):
    table = compilers.processes(fake_proc(tmp_path, {7: (1, "odd (name) here")}))
    assert table == {7: (1, "odd (name) here")}


def runs_a_compiler(path: str, pid_file: str) -> None:
    """As a JIT build does: a compiler as the worker's child, still running (its pid in `pid_file`)."""
    child = subprocess.Popen([path, "600"])
    Path(pid_file).write_text(str(child.pid))
    time.sleep(600)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_worker_killed_mid_compile_says_so(tmp_path):
    nvcc, pid_file = tmp_path / "nvcc", tmp_path / "pid"
    nvcc.symlink_to(shutil.which("sleep"))  # a process named nvcc
    w = workers.Worker()
    try:
        w.call(os.getpid, (), 60)  # started: the limit below is the call's alone
        out = w.call(runs_a_compiler, (str(nvcc), str(pid_file)), 3)
    finally:
        w.stop()
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # orphaned by the worker's kill
    assert out.kind == "timeout"
    assert out.compiling.startswith("while compiling") and "nvcc x1" in out.compiling
