"""Crash and hang isolation: cases run in persistent worker processes with a time limit per case.

A worker is a spawned Python process (spawn, never fork: a forked CUDA context is unusable) that
imports the harness once and then runs the checks sent to it over a pipe. The outcomes:
- the backend raised (a CUDA error, a device-side assert, an out-of-bounds index on the CPU):
  CRASH with the error text and the worker's last output;
- the worker died (segfault, abort, killed): CRASH with its exit signal and the tail of its stderr
  (faulthandler prints the Python stack there);
- no result within the time limit: HANG, and the worker is killed.
After a CRASH or HANG the worker is replaced (a CUDA context that saw an illegal access is dead) and
the run goes on with the next case. With several GPUs, `WorkerPool` keeps one worker per GPU.

Isolation is on for CUDA and off for the CPU unless ATTN_HARNESS_ISOLATE=1 (0 turns it off
everywhere); ATTN_HARNESS_CASE_TIMEOUT sets the time limit per case in seconds.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.backends.base import Backend
from harness.case import Case
from harness.checks.invariance import invariance_result
from harness.checks.numeric import check_case
from harness.results import CaseResult

ISOLATE_ENV = "ATTN_HARNESS_ISOLATE"
TIMEOUT_ENV = "ATTN_HARNESS_CASE_TIMEOUT"
DEFAULT_TIMEOUT = 120.0  # seconds per case
FIRST_CASE_TIMEOUT = 600.0  # a backend's first case in a worker may compile kernels (JIT)
STARTUP_TIMEOUT = 300.0  # spawning a worker and importing torch and the harness
LOG_TAIL = 3000  # characters of the worker's output kept in a CRASH or HANG result


class WorkerError(RuntimeError):
    """The harness itself failed in a worker (not the backend): a bug to fix, never a result."""


def enabled(device: str) -> bool:
    """Whether cases on `device` run isolated: CUDA yes, CPU no, unless ATTN_HARNESS_ISOLATE says."""
    value = os.environ.get(ISOLATE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return device == "cuda"


def case_timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)


# --- the worker process -------------------------------------------------------------------------


def _serve(conn, log_path: str) -> None:  # noqa: ANN001 - a multiprocessing Connection
    """The worker's loop. Its stdout and stderr go to log_path, so a crash's last words (a device-side
    assert, faulthandler's stack of a segfault) can be put into the CRASH result."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()
    importlib.import_module("harness.checks.numeric")  # the imports are paid before "ready"
    conn.send("ready")
    backends: dict[str, Backend] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        key, blob, fn, args = msg
        try:
            if blob is not None:
                backends[key] = pickle.loads(blob)
            conn.send(("ok", fn(backends[key], *args)))
        except Exception:
            conn.send(("raised", traceback.format_exc()))


# --- the parent's side --------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # "ok", "raised" (the harness failed in the worker), "died", "timeout"
    value: object = None
    text: str = ""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def backend_key(backend: Backend) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}:{backend.name}"


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


class Worker:
    """One spawned worker process; started on first use, replaced by `stop()` + the next call."""

    def __init__(self, gpu: str | None = None, first_timeout: float = FIRST_CASE_TIMEOUT) -> None:
        _WORKERS.add(self)
        self.gpu = gpu  # a CUDA_VISIBLE_DEVICES entry: the worker sees this GPU alone
        self.first_timeout = first_timeout
        self.proc = None
        self.conn = None
        self.log_path: str | None = None
        self.sent: set[str] = set()
        self.warm: set[str] = set()
        self.started = 0  # workers started so far (1 + replacements)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        fd, self.log_path = tempfile.mkstemp(prefix="attn-harness-worker-", suffix=".log")
        os.close(fd)
        parent, child = ctx.Pipe()
        env = {"CUDA_VISIBLE_DEVICES": self.gpu} if self.gpu is not None else {}
        with _environ(env):
            self.proc = ctx.Process(target=_serve, args=(child, self.log_path), daemon=True)
            self.proc.start()
        child.close()
        self.conn = parent
        self.sent, self.warm = set(), set()
        self.started += 1
        if not parent.poll(STARTUP_TIMEOUT):
            tail = self.log_tail()
            self.stop()
            raise WorkerError(f"worker did not start within {STARTUP_TIMEOUT:.0f}s\n{tail}")
        try:
            parent.recv()
        except EOFError:
            code = self._reap()
            tail = self.log_tail()
            self.stop()
            raise WorkerError(f"worker died while starting ({describe_exit(code)})\n{tail}") from None

    def log_tail(self) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        return text[-LOG_TAIL:].strip()

    def _reap(self) -> int | None:
        self.proc.join(10)
        return self.proc.exitcode

    def call(self, backend: Backend, fn: Callable, args: tuple, timeout: float) -> Outcome:
        """Run fn(backend, *args) in the worker within `timeout` seconds (longer for the backend's
        first case in this worker, which may compile kernels)."""
        if self.proc is not None and not self.proc.is_alive():
            self.stop()  # died while idle: start afresh rather than lose the case
        if self.proc is None:
            self._start()
        key = backend_key(backend)
        try:
            blob = None if key in self.sent else pickle.dumps(backend)
        except Exception as e:
            raise WorkerError(f"backend {backend.name} cannot be sent to a worker: {e}") from None
        limit = timeout if key in self.warm else max(timeout, self.first_timeout)
        self.conn.send((key, blob, fn, args))
        self.sent.add(key)
        if not self.conn.poll(limit):
            text = f"no result within {limit:g}s: the case was stopped and its worker killed"
            tail = self.log_tail()
            self.stop(kill=True)
            return Outcome("timeout", text=text + (f"\nworker output:\n{tail}" if tail else ""))
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            tail = self.log_tail()
            self.stop()
            text = f"the worker process died ({describe_exit(code)}) while running the case"
            return Outcome("died", text=text + (f"\nworker output:\n{tail}" if tail else ""))
        self.warm.add(key)
        return Outcome(kind, value, value if kind == "raised" else "")

    def stop(self, kill: bool = False) -> None:
        """End the worker (politely unless `kill`, then by force); the next call starts a fresh one."""
        if self.proc is not None:
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
        self.proc = self.conn = self.log_path = None


class IsolatedRunner:
    """Runs checks in one worker (pinned to one GPU when given); replaces it after a CRASH or HANG."""

    def __init__(
        self, gpu: str | None = None, timeout: float | None = None, first_timeout: float | None = None
    ) -> None:
        self.timeout = timeout if timeout is not None else case_timeout()
        first = first_timeout if first_timeout is not None else max(self.timeout, FIRST_CASE_TIMEOUT)
        self.worker = Worker(gpu, first)

    def run(self, fn: Callable, backend: Backend, case: Case, device: str, *more: object) -> CaseResult:
        """fn(backend, case, device, *more) -> CaseResult, isolated."""
        start = time.perf_counter()
        out = self.worker.call(backend, fn, (case, device, *more), self.timeout)
        if out.kind == "ok":
            res = out.value
            if res.status == "crash":  # the backend raised: its CUDA context may be gone
                tail = self.worker.log_tail()
                if tail:
                    res.extra["worker_output"] = tail
                self.worker.stop()
            return res
        if out.kind == "raised":
            self.worker.stop()
            raise WorkerError(f"the harness failed inside the worker:\n{out.text}")
        status = "crash" if out.kind == "died" else "hang"
        return CaseResult(
            status, backend.name, device, case, reason=out.text, seconds=time.perf_counter() - start
        )

    def close(self) -> None:
        self.worker.stop()


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES entries of the GPUs this process may use (all of them if unset)."""
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


class WorkerPool:
    """One isolated runner per GPU (CUDA) or `size` workers (CPU): checks many cases in parallel."""

    def __init__(
        self,
        device: str,
        size: int | None = None,
        timeout: float | None = None,
        first_timeout: float | None = None,
    ) -> None:
        gpus: list[str | None] = visible_gpus() if device == "cuda" else [None] * (size or 1)
        if device == "cuda" and size:
            gpus = gpus[:size]
        if not gpus:
            raise WorkerError("no GPU is visible for a CUDA worker pool")
        self.runners = [IsolatedRunner(g, timeout, first_timeout) for g in gpus]

    def map(self, fn: Callable, backend: Backend, cases: list[Case], device: str) -> list[CaseResult]:
        """fn(backend, case, device) for every case, spread over the workers; results in order."""
        todo: queue.Queue = queue.Queue()
        for i, c in enumerate(cases):
            todo.put((i, c))
        results: list[CaseResult | None] = [None] * len(cases)
        errors: list[BaseException] = []

        def drain(runner: IsolatedRunner) -> None:
            while True:
                try:
                    i, c = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = runner.run(fn, backend, c, device)
                except BaseException as e:  # re-raised in the caller's thread
                    errors.append(e)
                    return

        threads = [threading.Thread(target=drain, args=(r,)) for r in self.runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        for r in self.runners:
            r.close()


# --- what the suite and the hunts call ----------------------------------------------------------

_RUNNERS: dict[str, IsolatedRunner] = {}


def _process_gpu() -> str | None:
    """Under pytest-xdist (`-n <number of GPUs>`), xdist worker gwN drives GPU N mod count."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    gpus = visible_gpus()
    if worker.startswith("gw") and worker[2:].isdigit() and gpus:
        return gpus[int(worker[2:]) % len(gpus)]
    return None


def runner_for(device: str) -> IsolatedRunner:
    """This process's persistent runner for `device`."""
    if device not in _RUNNERS:
        _RUNNERS[device] = IsolatedRunner(_process_gpu() if device == "cuda" else None)
    return _RUNNERS[device]


@atexit.register
def _stop_workers() -> None:
    for w in list(_WORKERS):
        w.stop()


def check(backend: Backend, case: Case, device: str) -> CaseResult:
    """The numeric check of one case: in a worker where cases are isolated, in-process otherwise."""
    if enabled(device):
        return runner_for(device).run(check_case, backend, case, device)
    return check_case(backend, case, device)


def check_invariant(backend: Backend, case: Case, device: str, long_kv: int, long_q: int) -> CaseResult:
    """Batch invariance of one deterministic case, isolated like `check`."""
    if enabled(device):
        return runner_for(device).run(invariance_result, backend, case, device, long_kv, long_q)
    return invariance_result(backend, case, device, long_kv, long_q)


class Search:
    """The check a hypothesis search calls, case by case.

    Results are memoised, so hypothesis's replay of a failure sees the same result without rerunning
    it. When cases are isolated, the first CRASH or HANG ends the search: later new cases return None
    (the caller rejects them), so a crash is reported as found, not shrunk (each would cost a fresh
    worker); `python -m harness repro --sanitize` is the tool for digging into it.
    """

    def __init__(
        self,
        backend: Backend,
        device: str,
        check_kind: str = "numeric",
        neighbours: tuple[int, int] = (4096, 512),
    ) -> None:
        if check_kind not in ("numeric", "invariance"):
            raise ValueError(f"unknown check {check_kind!r}: numeric or invariance")
        self.backend = backend
        self.device = device
        self.kind = check_kind
        self.neighbours = neighbours  # (long_kv, long_q) of the invariance check
        self.isolated = enabled(device)
        self.seen: dict[str, CaseResult] = {}
        self.stopped: CaseResult | None = None
        self.ran_last = False  # whether the last call ran its case (False: memo or stopped)

    def known(self, case: Case) -> bool:
        """Whether the case was already run (its result is memoised)."""
        return case.to_json() in self.seen

    def __call__(self, case: Case) -> CaseResult | None:
        key = case.to_json()
        self.ran_last = False
        if key in self.seen:
            return self.seen[key]
        if self.stopped is not None:
            return None
        if self.kind == "numeric":
            res = check(self.backend, case, self.device)
        else:
            res = check_invariant(self.backend, case, self.device, *self.neighbours)
        self.ran_last = True
        self.seen[key] = res
        if self.isolated and res.status in ("crash", "hang"):
            self.stopped = res
        return res
