"""The one process layer: spawned workers that survive what they run, and commands run as children.

- `Worker`: a spawned Python process (spawn, never fork: a forked CUDA context is unusable) that
  imports what it needs once, then runs the calls sent to it over a pipe, its stdout and stderr in a
  log file. A call comes back as an `Outcome`: its value, the exception it raised, the worker's
  death (exit status or signal, and the tail of its output: faulthandler prints the Python stack of
  a segfault there), or a timeout (the worker is killed). A dead or killed worker is replaced by a
  fresh one on the next call, so the remaining work goes on.
- `concurrently` / `spread`: several workers at once, from one thread each.
- `Child`: a command (pytest, a measurement) as a child process with its output in a log file, a
  time limit, and a polite stop (SIGINT) before a forced one.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import multiprocessing as mp
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from harness.run import compilers

STARTUP_TIMEOUT = 300.0  # spawning a worker and importing torch and the harness
LOG_TAIL = 3000  # characters of a call's output kept in its Outcome
FATAL = "Fatal Python error:"  # faulthandler's first line when the process dies of a signal
# faulthandler's last line: every extension module loaded (~175 names on a GPU host's Python).
_MODULE_LIST = re.compile(r"^Extension modules: .*?(?:\(total: (\d+)\))?$", re.MULTILINE)

T = TypeVar("T")
R = TypeVar("R")
Call = tuple[Callable[..., Any], tuple]  # a function importable by name in the worker, and its arguments


class WorkerError(RuntimeError):
    """The harness itself failed in a worker (it could not start, or the harness raised): a bug."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def output_tail(text: str, limit: int = LOG_TAIL) -> str:
    """The end of a worker's output, at most about `limit` characters. faulthandler's list of
    extension modules is cut to its count (on a GPU host it alone would fill the tail), and its
    "Fatal Python error" line is kept wherever it sits: it is the crash's reason."""
    text = _MODULE_LIST.sub(lambda m: f"Extension modules: {m.group(1) or 'some'} (list dropped)", text)
    tail = text[-limit:]
    fatal = next((line for line in text.splitlines() if line.startswith(FATAL)), None)
    if fatal and fatal not in tail:
        tail = f"{fatal}\n[...]\n{tail[len(fatal) + 7 :]}"
    return tail.strip()


@dataclass(kw_only=True)
class Outcome:
    """One call in a worker: `ok` (value), `raised` (error: its traceback), `died` (code: the exit
    status, negative for a signal) or `timeout` (the worker was killed); output: the tail of what
    the worker printed during the call; compiling: for a timeout, the compilers that were running
    then (harness/run/compilers.py), "" if none."""

    kind: str
    value: Any = None
    error: str = ""
    code: int | None = None
    output: str = ""
    compiling: str = ""

    @property
    def error_line(self) -> str:
        """The exception of a `raised` call in one line (`RuntimeError: ...`)."""
        return (self.error.strip().splitlines() or [""])[-1]


# --- the worker process -------------------------------------------------------------------------


def _serve(
    conn: Connection, log_path: str, preload: tuple[str, ...], nice: int, warm: Call | None, finalize: bool
) -> None:
    """The worker's loop, at `nice` below its parent's priority: fn(*args) for each (fn, args)
    received, until None or the pipe closes; `warm` first, once "ready" is sent. Then Python's
    finalisation if `finalize`, else a quick exit."""
    if nice:
        os.nice(nice)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()
    for module in preload:  # the imports are paid before "ready"
        importlib.import_module(module)
    conn.send("ready")
    if warm is not None:  # the first call waits in the pipe; a death here is that call's outcome
        try:
            warm[0](*warm[1])
        except Exception:  # the calls that follow meet the same error and report it
            traceback.print_exc()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            msg = None
        if msg is None:
            if finalize:
                return
            quick_exit()
        fn, args = msg
        try:
            conn.send(("ok", fn(*args)))
        except Exception:
            conn.send(("raised", traceback.format_exc()))


def quick_exit(code: int = 0) -> None:
    """End this process with `code` after flushing its output, without Python's finalisation: for a
    worker (its results are sent) and a check's part (its results written). The caches their calls
    fill (inductor, Triton, FA4's CuTe DSL, FlashInfer's modules) are written as each compile ends.
    The finalisation (atexit handlers, waiting for any thread a library left running, tearing down
    modules) delayed the end of every pytest process of a check: a worker with a compiled library
    loaded could outlast `stop`'s wait and be killed."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        stream.flush()
    os._exit(code)


# --- the parent's side --------------------------------------------------------------------------


@contextmanager
def _environ(changes: dict[str, str]) -> Iterator[None]:
    """Set environment variables while a worker is spawned (it inherits them)."""
    old = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_WORKERS: weakref.WeakSet = weakref.WeakSet()  # every Worker, so that exit stops them all
_SPAWNING = threading.Lock()  # Workers started from several threads (the warm-up's pools) set os.environ


class Worker:
    """One spawned worker process, started on first use (or earlier: `spawn`) and replaced after it
    dies or is killed.

    `env`: variables it starts with (CUDA_VISIBLE_DEVICES: one GPU); `name`: its process name
    (multiprocessing.current_process().name inside it); `preload`: modules it imports before it
    reports ready; `warm`: a call it makes once ready, before the first call sent to it (which waits
    for it; its error goes to the log); `nice`: how much lower its priority is than this process's
    (as Child's); `finalize`: end with Python's finalisation rather than at once (the warm-up's
    compilers leave semaphores it releases; without it the resource tracker warns of them).
    `started` counts the processes started so far (1 + replacements): a caller that keeps state in
    the process sees a new one by a new count. `standby`: once replaced, keep the next replacement
    starting beside the process (`spawn`); `close` ends it too.
    """

    def __init__(
        self,
        name: str | None = None,
        env: dict[str, str] | None = None,
        preload: Sequence[str] = (),
        nice: int = 0,
        warm: Call | None = None,
        finalize: bool = False,
        standby: bool = False,
    ) -> None:
        _WORKERS.add(self)
        self.name = name
        self.env = env or {}
        self.preload = tuple(preload)
        self.warm = warm
        self.finalize = finalize
        self.nice = nice
        self._process: _Process | None = None  # the process serving calls now
        self.mark = 0  # the log's size when the last call began: its output starts there
        self.started = 0
        self.ready = False  # the running process has reported its imports done
        self.standby = standby
        self._spare: _Process | None = None  # the next replacement, already starting

    @property
    def proc(self) -> Any:
        """The running process (None when there is none)."""
        return None if self._process is None else self._process.proc

    @property
    def conn(self) -> Connection | None:
        """The parent's end of the running process's pipe."""
        return None if self._process is None else self._process.conn

    @property
    def log_path(self) -> str | None:
        """The running process's log file."""
        return None if self._process is None else self._process.log_path

    def start(self) -> None:
        """Start the process unless one is running (one that died while idle is replaced), and wait
        until it has imported its `preload`."""
        self.spawn()
        if self.ready:
            return
        if not self.conn.poll(STARTUP_TIMEOUT):
            tail = self.log_tail()
            self.stop(kill=True)
            raise WorkerError(f"worker did not start within {STARTUP_TIMEOUT:.0f}s\n{tail}")
        try:
            self.conn.recv()
        except EOFError:
            code = self._reap()
            tail = self.log_tail()
            self.stop()
            raise WorkerError(f"worker died while starting ({describe_exit(code)})\n{tail}") from None
        self.ready = True

    def spawn(self) -> None:
        """Start the process unless one is running, without waiting for its imports: `start` (and
        so every call) waits for them. Spawned early, a worker imports while its caller works. With
        `standby`, a replacement takes the spare started beside the process it replaces, and from the
        first replacement on another spare starts beside it: a worker replaced after each fault of a
        backend (a CUDA context that saw an illegal access is dead) found its next process importing
        torch and the library again, seconds a fault."""
        if self.proc is not None and not self.proc.is_alive():
            self.stop()
        if self.proc is not None:
            return
        spare, self._spare = self._spare, None
        if spare is not None and not spare.proc.is_alive():
            spare.end(kill=True)
            spare = None
        self._process = spare or self._launch()
        self.mark = 0
        self.started += 1
        if self.standby and self.started > 1:
            try:
                self._spare = self._launch()
            except WorkerError:  # no spare: the next replacement starts its own, as without standby
                self._spare = None

    def _launch(self) -> _Process:
        """A new process serving this worker's calls, started."""
        ctx = mp.get_context("spawn")
        fd, log_path = tempfile.mkstemp(prefix="attn-harness-worker-", suffix=".log")
        os.close(fd)
        parent, child = ctx.Pipe()
        with _SPAWNING, _environ(self.env):  # one spawn at a time: each sees only its own changes
            args = (child, log_path, self.preload, self.nice, self.warm, self.finalize)
            proc = ctx.Process(target=_serve, args=args, name=self.name, daemon=True)
            try:
                proc.start()
            except Exception as e:  # e.g. spawn from a script without a __main__ guard: no process
                child.close()
                parent.close()
                os.unlink(log_path)
                why = " ".join(str(e).split())  # one line: multiprocessing's text starts with one break
                raise WorkerError(f"worker could not be spawned: {type(e).__name__}: {why}") from e
        child.close()
        return _Process(proc, parent, log_path)

    def call(self, fn: Callable[..., Any], args: tuple, timeout: float) -> Outcome:
        """fn(*args) in the worker (fn importable by name there), within `timeout` seconds."""
        self.start()
        self.mark = self._log_size()
        self.conn.send((fn, args))
        if not self.conn.poll(timeout):
            output = self.log_tail()
            compiling = compilers.survey(self.proc.pid) if self.proc is not None else ""
            self.stop(kill=True)
            return Outcome(kind="timeout", output=output, compiling=compiling)
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            output = self.log_tail()
            self.stop()
            return Outcome(kind="died", code=code, output=output)
        if kind == "raised":
            return Outcome(kind=kind, error=value, output=self.log_tail())
        return Outcome(kind=kind, value=value)

    def _log_size(self) -> int:
        return os.path.getsize(self.log_path) if self.log_path and os.path.exists(self.log_path) else 0

    def log_tail(self) -> str:
        """The end of what the worker printed since the last call began."""
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            f.seek(self.mark)
            text = f.read()
        return output_tail(text)

    def _reap(self) -> int | None:
        self.proc.join(10)
        return self.proc.exitcode

    def stop(self, kill: bool = False) -> None:
        """End the worker's process (politely unless `kill`, then by force); the next call starts a
        fresh one (its spare, with `standby`)."""
        if self._process is not None:
            self._process.end(kill)
        self._process = None
        self.ready = False

    def close(self) -> None:
        """End the worker's process and its spare, which has served nothing (killed: it may still be
        importing, and would not read the pipe's request to exit before `stop`'s 2 s wait)."""
        self.stop()
        if self._spare is not None:
            self._spare.end(kill=True)
            self._spare = None


@dataclass
class _Process:
    """One process serving a Worker: the process, the parent's end of its pipe, its log file."""

    proc: Any
    conn: Connection
    log_path: str

    def end(self, kill: bool) -> None:
        """Ask it to exit (unless `kill`), give it 2 s, then kill it; close the pipe, remove the log."""
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        self.conn.close()
        if self.log_path and os.path.exists(self.log_path):
            os.unlink(self.log_path)


@atexit.register
def stop_all() -> None:
    """Stop every Worker of this process: at its exit, or before an exit that skips atexit."""
    for w in list(_WORKERS):
        w.close()


def concurrently(tasks: Sequence[Callable[[], T]]) -> list[T]:
    """Every task at once, each in its own thread (each drives its own worker); their results in
    order. The first exception is re-raised once all have ended."""
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = tasks[i]()
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tasks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def spread(runners: Sequence[R], items: Sequence[T], run: Callable[[R, T], Any]) -> list[Any]:
    """run(runner, item) for every item, each runner taking the next item when it is free; the
    results in item order. A runner whose run raised takes no more items; the error is re-raised."""
    todo: queue.Queue = queue.Queue()
    for i, item in enumerate(items):
        todo.put((i, item))
    results: list[Any] = [None] * len(items)

    def drain(runner: R) -> None:
        while True:
            try:
                i, item = todo.get_nowait()
            except queue.Empty:
                return
            results[i] = run(runner, item)

    concurrently([lambda r=r: drain(r) for r in runners])
    return results


# --- commands as child processes ----------------------------------------------------------------


class Child:
    """A command run as a child process, its stdout and stderr into `log`; `nice`: how much lower its
    priority (and its own children's) is than this process's; `session`: in a session of its own, out
    of reach of the terminal's Ctrl-C (its parent passes a SIGINT on)."""

    def __init__(
        self,
        cmd: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        nice: int = 0,
        session: bool = False,
    ) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        lower = (lambda: os.nice(nice)) if nice else None
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=lower,
                start_new_session=session,
            )
        self.log = log
        self.started = time.monotonic()
        self.started_at = time.time()  # the clock a child's results.json gives (run.configured_at)

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status once it ends; None if it still runs after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self) -> None:
        """Ask it to stop (SIGINT: pytest writes its results)."""
        self.proc.send_signal(signal.SIGINT)

    def stop(self, grace: float = 0.0) -> int:
        """Its exit status once it ends, killed if it still runs after `grace` seconds."""
        code = self.wait(grace)
        if code is None:
            self.proc.kill()
            code = self.proc.wait()
        return code


def run_child(cmd: list[str], log: Path, timeout: float) -> int | None:
    """`cmd` to its end: its exit status, or None when it ran past `timeout` seconds and was killed."""
    child = Child(cmd, log)
    code = child.wait(timeout)
    if code is None:
        child.stop()
    return code
