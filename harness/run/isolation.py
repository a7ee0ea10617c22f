"""Crash and hang isolation: cases run in persistent worker processes with a time limit per case.

A worker (harness/run/workers.py) is a spawned Python process that imports the harness once and
then runs the checks sent to it over a pipe, each backend pickled to it once. The outcomes:
- the backend raised (a CUDA error, a device-side assert, an out-of-bounds index on the CPU):
  CRASH with the error text and the worker's last output;
- the worker died (segfault, abort, killed): CRASH with its exit signal and the tail of its stderr
  (faulthandler prints the Python stack there);
- no result within the time limit: HANG, and the worker is killed; its reason names the compilers
  running then, the worker's own or other processes' (harness/run/compilers.py), if any.
After a CRASH or HANG the worker is replaced (a CUDA context that saw an illegal access is dead) and
the run goes on with the next case; from then on a spare process is kept starting beside the worker,
so a later fault's replacement has imported already. With several GPUs, `WorkerPool` keeps one worker per GPU.

Isolation is on for CUDA and off for the CPU unless the settings say otherwise (`isolate`,
ATTN_HARNESS_ISOLATE; harness/run/speed/settings.py), which also give the time limit per case.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable

from harness.backends.base import Backend
from harness.checks.invariance import invariance_result
from harness.checks.known_issues import excused_status
from harness.checks.numeric import check_case
from harness.checks.probe import ProbeResult, probe
from harness.checks.replay import replay_result
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.results import CaseResult
from harness.run import record_mode
from harness.run.speed import prestart, settings, variant_shards
from harness.run.speed.prestart import PRELOAD
from harness.run.workers import Outcome, Worker, WorkerError, describe_exit, spread

FIRST_CASE_TIMEOUT = 600.0  # a backend's first case in a worker may compile kernels (JIT)


def enabled(device: str) -> bool:
    """Whether cases on `device` run isolated: CUDA yes, CPU no, unless the settings say."""
    return settings.current().isolated(device)


def backend_key(backend: Backend) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}:{backend.name}"


_BACKENDS: dict[str, Backend] = {}  # in a worker: the backends sent to it, by backend_key


def _run_in_worker(key: str, blob: bytes | None, fn: Callable, args: tuple) -> CaseResult:
    """In the worker: fn(backend, *args), the backend unpickled from `blob` the first time it comes."""
    if blob is not None:
        _BACKENDS[key] = pickle.loads(blob)
    return fn(_BACKENDS[key], *args)


class IsolatedRunner:
    """Runs checks in one worker (pinned to one GPU when given); replaces it after a CRASH or HANG,
    from the second fault on with a process started beside it at the first (Worker's `standby`).
    Its first worker is the one harness/run/speed/prestart.py spawned as the process started, if any.

    A backend is pickled to a worker once; its first case in a worker gets `first_timeout` (it may
    compile kernels), the later ones `timeout`."""

    def __init__(
        self, gpu: str | None = None, timeout: float | None = None, first_timeout: float | None = None
    ) -> None:
        self.timeout = timeout if timeout is not None else settings.current().case_timeout
        first = first_timeout if first_timeout is not None else max(self.timeout, FIRST_CASE_TIMEOUT)
        self.first_timeout = first
        env = prestart.worker_env(gpu)
        self.worker = prestart.claim(env) or Worker(env=env, preload=PRELOAD)
        self.worker.standby = True  # after a fault, the next one's worker is already starting
        self.process = 0  # the worker process that `sent` and `warm` describe (Worker.started)
        self.sent: set[str] = set()  # backends that process holds
        self.warm: set[str] = set()  # backends that completed a case there

    def _call(self, backend: Backend, fn: Callable, args: tuple) -> Outcome:
        self.worker.start()
        if self.worker.started != self.process:
            self.process, self.sent, self.warm = self.worker.started, set(), set()
        key = backend_key(backend)
        try:
            blob = None if key in self.sent else pickle.dumps(backend)
        except Exception as e:
            raise WorkerError(f"backend {backend.name} cannot be sent to a worker: {e}") from None
        limit = self.timeout if key in self.warm else max(self.timeout, self.first_timeout)
        self.sent.add(key)
        out = self.worker.call(_run_in_worker, (key, blob, fn, args), limit)
        if out.kind == "timeout":
            during = f" {out.compiling}" if out.compiling else ""
            text = f"no result within {limit:g}s{during}: the case was stopped and its worker killed"
            out.error = text + (f"\nworker output:\n{out.output}" if out.output else "")
        elif out.kind == "died":
            text = f"the worker process died ({describe_exit(out.code)}) while running the case"
            out.error = text + (f"\nworker output:\n{out.output}" if out.output else "")
        else:
            self.warm.add(key)
        return out

    def run(self, fn: Callable, backend: Backend, case: Case, device: str, *more: object) -> CaseResult:
        """fn(backend, case, device, *more) -> CaseResult, isolated. A worker that died is a CRASH, or
        an xfail where a known issue that can fault the library reaches the case and confirms itself
        (its confirmation runs in this process, the worker being gone); a worker stopped is a HANG."""
        start = time.perf_counter()
        out = self._call(backend, fn, (case, device, *more))
        if out.kind == "ok":
            res = out.value
            raised = res.status == "crash" or "traceback" in res.extra  # an excused crash keeps its traceback
            if raised:  # the backend raised: its CUDA context may be gone
                tail = self.worker.log_tail()
                if tail:
                    res.extra["worker_output"] = tail
                self._replace()
            return res
        if out.kind == "raised":
            self.worker.stop()
            raise WorkerError(f"the harness failed inside the worker:\n{out.error}")
        self._replace()  # it died or was killed for hanging: its next process starts now
        status, reason = ("crash" if out.kind == "died" else "hang"), out.error
        # a crash may be a library that ends the process on a fault (FA3's CHECK_CUDA exits)
        status, reason = excused_status(backend.name, case, status, reason, device)
        return CaseResult(
            status=status,
            backend=backend.name,
            device=device,
            case=case,
            reason=reason,
            seconds=time.perf_counter() - start,
        )

    def _replace(self) -> None:
        """End the worker's process after a fault and start the next one at once: the spare started
        beside it, if any (Worker's `standby`), while the caller records the result."""
        self.worker.stop()
        self.worker.spawn()

    def close(self) -> None:
        self.worker.close()


def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES entries of the GPUs this process may use (all of them if unset). As CUDA
    does, entries stop at a negative one (`-1`: no GPU)."""
    import torch

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(torch.cuda.device_count())]
    return prestart.listed_gpus(listed)


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
        return spread(self.runners, cases, lambda runner, case: runner.run(fn, backend, case, device))

    def close(self) -> None:
        for r in self.runners:
            r.close()


# --- what the suite and the hunts call ----------------------------------------------------------

_RUNNERS: dict[str, IsolatedRunner] = {}


def _process_gpu() -> str | None:
    """The GPU this process's worker is pinned to: under pytest-xdist (`-n <number of GPUs>`), xdist
    worker gwN drives visible GPU N mod count; otherwise the first visible GPU (the one a part of
    `check --jobs` was given, or cuda:0 of several); None when none is visible (CUDA then fails in
    the worker, as it would here)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    gpus = visible_gpus()
    if not gpus:
        return None
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return gpus[index % len(gpus)]


def runner_for(device: str) -> IsolatedRunner:
    """This process's persistent runner for `device`."""
    if device not in _RUNNERS:
        _RUNNERS[device] = IsolatedRunner(_process_gpu() if device == "cuda" else None)
    return _RUNNERS[device]


def check(backend: Backend, case: Case, device: str) -> CaseResult:
    """The numeric check of one case: in a worker where cases are isolated, in-process otherwise."""
    if enabled(device):
        return runner_for(device).run(check_case, backend, case, device)
    return check_case(backend, case, device)


def check_replay(backend: Backend, case: GraphCase, device: str) -> CaseResult:
    """The CUDA-graph replay check of one GraphCase, isolated like `check`."""
    if enabled(device):
        return runner_for(device).run(replay_result, backend, case, device)
    return replay_result(backend, case, device)


def check_invariant(backend: Backend, case: Case, device: str, long_kv: int, long_q: int) -> CaseResult:
    """Batch invariance of one deterministic case, isolated like `check`."""
    if enabled(device):
        return runner_for(device).run(invariance_result, backend, case, device, long_kv, long_q)
    return invariance_result(backend, case, device, long_kv, long_q)


def _probe_dict(backend: Backend, case: Case, device: str) -> dict:
    """The mask probe of a case as its results.json dict; its error, not an exception, if the probe
    cannot run (a probe that breaks must not hide the failure it was asked to explain)."""
    try:
        return probe(backend, case, device).to_dict()
    except Exception as e:  # noqa: BLE001 - said in the probe's record
        error = f"{type(e).__name__}: {e}"
        return ProbeResult(backend=backend.name, device=device, runs=0, lines=[], error=error).to_dict()


def probe_failure(backend: Backend, case: Case, device: str) -> dict:
    """The mask probe of a failing case (harness/checks/probe.py), run where its check ran: in the
    isolation worker when cases are isolated, so the backend runs in no other process."""
    if not enabled(device):
        return _probe_dict(backend, case, device)
    runner = runner_for(device)
    out = runner._call(backend, _probe_dict, (case, device))
    if out.kind == "ok":
        return out.value
    runner._replace()  # it raised, died or hung: its next process starts now
    error = out.error or out.kind
    return ProbeResult(backend=backend.name, device=device, runs=0, lines=[], error=error).to_dict()


CHECK_KINDS = ("numeric", "invariance", "graph")


class Search:
    """The check a hypothesis search calls, case by case.

    Results are memoised, so hypothesis's replay of a failure sees the same result without rerunning
    it. When cases are isolated, the first CRASH or HANG ends the search: later new cases return None
    (the caller rejects them), so a crash is reported as found, not shrunk (each would cost a fresh
    worker); `python -m harness repro --sanitize` is the tool for digging into it. In a variant
    shard (harness/run/speed/variant_shards.py) a case of another shard's variant is answered unchecked.
    """

    def __init__(
        self,
        backend: Backend,
        device: str,
        check_kind: str = "numeric",
        neighbours: tuple[int, int] = (4096, 512),
        family: str = "",
    ) -> None:
        if check_kind not in CHECK_KINDS:
            raise ValueError(f"unknown check {check_kind!r}: {', '.join(CHECK_KINDS)}")
        self.backend = backend
        self.device = device
        self.kind = check_kind
        self.neighbours = neighbours  # (long_kv, long_q) of the invariance check
        self.family = family  # what record mode writes beside each case (harness/run/record_mode.py)
        self.isolated = enabled(device)
        self.seen: dict[str, CaseResult] = {}
        self.stopped: CaseResult | None = None
        self.ran_last = False  # whether the last call ran its case (False: memo or stopped)

    def known(self, case: Case | GraphCase) -> bool:
        """Whether the case was already run (its result is memoised)."""
        return case.to_json() in self.seen

    def __call__(self, case: Case | GraphCase) -> CaseResult | None:
        key = case.to_json()
        self.ran_last = False
        if key in self.seen:
            return self.seen[key]
        if self.stopped is not None:
            return None
        if variant_shards.elsewhere(self.backend, case):  # another process checks this variant
            res = variant_shards.answer(self.backend, case, self.device)
        elif record_mode.path():
            res = record_mode.record(self.backend, case, self.device, self.kind, self.family)
        elif self.kind == "numeric":
            res = check(self.backend, case, self.device)
        elif self.kind == "graph":  # the case is a GraphCase
            res = check_replay(self.backend, case, self.device)
        else:
            res = check_invariant(self.backend, case, self.device, *self.neighbours)
        self.ran_last = True
        self.seen[key] = res
        if self.isolated and res.status in ("crash", "hang"):
            self.stopped = res
        return res
