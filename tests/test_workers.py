"""harness/run/workers.py: a call's value, exception, death (by signal or exit) and time limit each
come back as an Outcome, a fresh worker takes the next call, and a child command keeps to its limit."""

import atexit
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.run import workers


def square(x: int) -> int:
    return x * x


def pid() -> int:
    return os.getpid()


def raises() -> None:
    raise ValueError("bad input")


def killed_by(sig: int) -> None:
    print("last words", flush=True)
    os.kill(os.getpid(), sig)


def exits(code: int) -> None:
    os._exit(code)


def sleeps(seconds: float) -> None:
    print("going to sleep", flush=True)
    time.sleep(seconds)


def leaves_a_thread() -> None:
    """As a library may: a non-daemon thread that never ends (Python's finalisation waits for it)."""
    threading.Thread(target=threading.Event().wait, daemon=False).start()
    print("thread left running", flush=True)


def test_a_stopped_worker_exits_at_once_whatever_its_libraries_left_running():
    w = workers.Worker()
    try:
        assert w.call(leaves_a_thread, (), 60).kind == "ok"
        proc = w.proc
    finally:
        w.stop()
    assert proc.exitcode == 0  # it exited by itself; a worker Python finalised waits, and is killed (-9)


def finalised_writes(path: str) -> None:
    atexit.register(Path(path).write_text, "finalised")


@pytest.mark.parametrize("finalize", [True, False])
def test_only_a_worker_asked_to_finalize_runs_its_exit_handlers(tmp_path, finalize):
    w = workers.Worker(finalize=finalize)
    try:
        assert w.call(finalised_writes, (str(tmp_path / "exit"),), 60).kind == "ok"
        proc = w.proc
    finally:
        w.stop()
    assert (tmp_path / "exit").exists() == finalize and proc.exitcode == 0


def test_a_value_comes_back_and_the_worker_is_reused():
    w = workers.Worker(name="test-worker-0")
    try:
        assert w.call(square, (7,), 60) == workers.Outcome(kind="ok", value=49)
        first = w.call(pid, (), 60).value
        assert w.call(pid, (), 60).value == first != os.getpid() and w.started == 1
    finally:
        w.stop()


def test_an_exception_is_raised_with_its_traceback_and_the_worker_lives_on():
    w = workers.Worker()
    try:
        out = w.call(raises, (), 60)
        assert out.kind == "raised" and out.error_line == "ValueError: bad input"
        assert "Traceback" in out.error and "in raises" in out.error
        assert w.call(square, (3,), 60).value == 9 and w.started == 1
    finally:
        w.stop()


def test_a_worker_killed_by_a_signal_is_an_outcome_and_a_fresh_worker_goes_on():
    w = workers.Worker()
    try:
        before = w.call(pid, (), 60).value
        out = w.call(killed_by, (signal.SIGSEGV,), 60)
        assert out.kind == "died" and out.code == -signal.SIGSEGV
        assert workers.describe_exit(out.code) == "killed by signal SIGSEGV"
        assert "last words" in out.output and "Segmentation fault" in out.output  # faulthandler's
        assert w.call(pid, (), 60).value != before and w.started == 2
        out = w.call(exits, (7,), 60)
        assert out.kind == "died" and out.code == 7 and workers.describe_exit(7) == "exit status 7"
    finally:
        w.stop()


def test_a_call_past_its_time_limit_kills_the_worker_and_a_fresh_one_goes_on():
    w = workers.Worker()
    try:
        w.call(square, (1,), 60)  # started: the limit below is the call's alone
        slept = w.proc
        out = w.call(sleeps, (3600,), 1)
        assert out.kind == "timeout" and "going to sleep" in out.output
        assert not slept.is_alive() and w.proc is None
        assert w.call(square, (5,), 60).value == 25 and w.started == 2
    finally:
        w.stop()


def test_a_calls_output_is_its_own():
    w = workers.Worker()
    try:
        w.call(sleeps, (0,), 60)
        out = w.call(killed_by, (signal.SIGABRT,), 60)
        assert out.kind == "died" and "going to sleep" not in out.output and "last words" in out.output
    finally:
        w.stop()


def test_spread_keeps_item_order_and_uses_every_runner():
    used: list[str] = []
    both = threading.Barrier(2, timeout=60)  # each runner's first item waits for the other's

    def run(runner: str, item: int) -> int:
        if runner not in used:
            used.append(runner)
            both.wait()
        return item * 10

    assert workers.spread(["a", "b"], list(range(6)), run) == [0, 10, 20, 30, 40, 50]
    assert sorted(used) == ["a", "b"]


def test_a_child_command_ends_or_is_killed_at_its_limit(tmp_path: Path):
    log = tmp_path / "child.log"
    assert workers.run_child([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], log, 60) == 3
    assert log.read_text().strip() == "hi"
    assert workers.run_child([sys.executable, "-c", "import time; time.sleep(3600)"], log, 0.5) is None


def test_the_output_tail_keeps_the_fatal_line_and_drops_the_module_list():
    modules = ", ".join(f"ext_{i:03d}" for i in range(500))
    stack = "\n".join(f'  File "/x/y{i}.py", line {i} in f{i}' for i in range(300))
    text = f"Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n{stack}\n\n"
    text += f"Extension modules: {modules} (total: 500)\n"
    tail = workers.output_tail(text, limit=1000)
    assert tail.startswith("Fatal Python error: Aborted\n[...]\n") and len(tail) <= 1000
    assert tail.endswith("Extension modules: 500 (list dropped)") and "ext_499" not in tail
    assert workers.output_tail("short output\n") == "short output"


WARMED: list[str] = []


def warm_up(what: str) -> None:
    WARMED.append(what)
    if what == "bad":
        raise ValueError("warm-up failed")


def warmed() -> list[str]:
    return WARMED


@pytest.mark.parametrize("what", ["imports", "bad"])
def test_a_workers_warm_call_runs_before_its_first_call_and_its_error_only_reaches_the_log(what):
    w = workers.Worker(warm=(warm_up, (what,)))
    try:
        w.start()
        assert w.call(warmed, (), 60).value == [what] and w.started == 1
        with open(w.log_path) as log:
            assert ("ValueError: warm-up failed" in log.read()) == (what == "bad")
    finally:
        w.stop()


def test_a_worker_that_cannot_be_spawned_raises_one_error_and_stops_cleanly(monkeypatch):
    """multiprocessing refuses to spawn from a script without a __main__ guard:
    one WorkerError naming why, and the worker left stopped, so a later stop() (and the one at exit)
    does not raise."""
    import multiprocessing.context

    def refuse(self):  # noqa: ANN001, ANN202 - multiprocessing's text starts on a new line, indented
        raise RuntimeError(
            "\n        An attempt has been made to start a new process before\n        the current"
        )

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    w = workers.Worker("unspawnable", preload=())
    with pytest.raises(workers.WorkerError) as raised:
        w.start()
    why = "RuntimeError: An attempt has been made to start a new process before the current"
    assert str(raised.value) == f"worker could not be spawned: {why}"  # one line: a record keeps the first
    assert w.proc is None and w.conn is None and w.log_path is None
    w.stop()


def test_a_child_and_a_worker_can_run_at_a_lower_priority(tmp_path):
    """Child(nice=N) and Worker(nice=N) run N below this process (the warm-up's pool and the check's
    processes yield to a ninja build that way)."""
    base = os.nice(0)
    child = workers.Child([sys.executable, "-c", "import os; print(os.nice(0))"], tmp_path / "c.log", nice=3)
    assert child.wait(60) == 0 and (tmp_path / "c.log").read_text().strip() == str(base + 3)
    worker = workers.Worker("nice-test", nice=2)
    try:
        out = worker.call(os.nice, (0,), 60)
    finally:
        worker.stop()
    assert out.kind == "ok" and out.value == base + 2
