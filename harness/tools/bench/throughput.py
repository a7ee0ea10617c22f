"""The bench's throughput section: cases checked per second over the mix, caches warm, in this
process and (with workers > 1) in several at once, as `check --jobs N` runs one backend's suite; and
the measurement of one backend that feeds both throughput and phases.

In several processes, worker w (a spawned process of harness/run/workers.py, named bench-worker-W)
checks the cases of the mix whose index % workers == w. Every worker first warms up on its share
(loading the backend, compiling); each timed pass is then sent to all workers at once, and only once
every worker has finished the step before (the warm-up or the previous pass), so a slow warm-up never
counts.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.backends import load
from harness.backends.base import Backend
from harness.checks.numeric import check_case
from harness.core.case import Case
from harness.core.results import CaseResult, repro_command
from harness.run import parallel
from harness.run.workers import Outcome, Worker, WorkerError, concurrently
from harness.tools.bench.phases import PhaseRow, phase_row

MAX_FAILURES_SHOWN = 5
# A worker silent this long (its warm-up compiles included) is stuck.
WORKER_TIMEOUT_S = 600.0
PRELOAD = ("harness.checks.numeric",)


@dataclass(kw_only=True)
class ThroughputRow:
    backend: str
    device: str
    cases: int  # in the mix
    checked: int = 0  # not skipped
    passed: int = 0
    failed: int = 0
    crashed: int = 0  # crash or hang
    skipped: int = 0
    seconds: float = 0.0  # the median timed pass
    cases_per_s: float = 0.0  # checked cases per second of the median timed pass
    pass_seconds: list[float] = field(default_factory=list)  # every timed pass, in order
    warm_seconds: float = 0.0  # the first pass, compiles included
    failures: list[dict] = field(default_factory=list)  # the first few: status, reason, repro
    reason: str = ""  # why the backend was not measured (unavailable here), or the parallel run failed
    workers: int = 1  # processes of the parallel measurement (1: none)
    parallel_cases_per_s: float = 0.0  # checked cases per second of the median parallel pass
    parallel_pass_seconds: list[float] = field(default_factory=list)  # every parallel pass's wall time


@dataclass(kw_only=True)
class ParallelPasses:
    """What the worker processes measured, complete passes only; times are time.time() of the
    workers (one clock for every process)."""

    walls: list[float]  # per pass: the last worker's end - the first one's start
    found: list[list[tuple[str, str]]]  # per pass, per case of the mix: (status, reason)
    error: str = ""  # a worker failed, died or went silent; the passes after it are missing
    ready: list[float] = field(default_factory=list)  # per worker: when its warm-up ended
    spans: list[list[tuple[float, float]]] = field(default_factory=list)  # per pass, per worker: start, end


_BACKENDS: dict[str, Backend] = {}  # in a worker: the backend, loaded by name


def warm_up(name: str, device: str, share: list[Case]) -> float:
    """In a worker: load the backend by name (a Backend's caches do not cross processes) and check
    its share once; returns when that ended."""
    _BACKENDS[name] = load(name)
    for c in share:
        check_case(_BACKENDS[name], c, device)
    return time.time()


def timed_pass(name: str, device: str, share: list[Case]) -> tuple[float, float, list[tuple[str, str]]]:
    """In a worker: one pass over its share; (start, end, each case's (status, reason))."""
    start = time.time()
    found = [(r.status, r.reason) for r in (check_case(_BACKENDS[name], c, device) for c in share)]
    return start, time.time(), found


class _Stop(Exception):
    """A worker failed: the measurement ends with the passes completed before."""


def _failure(w: int, out: Outcome, timeout: float) -> str:
    if out.kind == "died":
        return f"worker {w} exited with code {out.code}"
    if out.kind == "raised":
        return f"worker {w}: {out.error_line}"
    return f"worker {w} reported nothing for {timeout:g} s"


def parallel_passes(
    backend: Backend,
    device: str,
    cases: list[Case],
    workers: int,
    repeat: int,
    timeout: float = WORKER_TIMEOUT_S,
) -> ParallelPasses:
    """The mix checked by `workers` processes sharing the device: a warm-up, then `repeat` passes
    all started together. A worker that raises, dies or stays silent for `timeout` seconds ends
    the measurement with the passes completed before it."""
    threads = parallel.cuda_threads(os.environ) if device == "cuda" else {}  # as check's parts
    pool = [Worker(name=f"bench-worker-{w}", env=threads, preload=PRELOAD) for w in range(workers)]
    shares = [cases[w::workers] for w in range(workers)]

    def call(w: int, fn: Callable) -> Outcome:
        try:
            return pool[w].call(fn, (backend.name, device, shares[w]), timeout)
        except WorkerError as e:  # it did not start
            return Outcome(kind="raised", error=str(e))

    def everyone(fn: Callable) -> list[Outcome]:
        """fn in every worker at once; raises _Stop on the first that failed."""
        outs = concurrently([lambda w=w: call(w, fn) for w in range(workers)])
        for w, out in enumerate(outs):
            if out.kind != "ok":
                raise _Stop(_failure(w, out, timeout))
        return outs

    par = ParallelPasses(walls=[], found=[])
    try:
        par.ready = [out.value for out in everyone(warm_up)]
        for _ in range(repeat):
            got = [out.value for out in everyone(timed_pass)]
            par.spans.append([(start, end) for start, end, _ in got])
            par.walls.append(max(end for _, end, _ in got) - min(start for start, _, _ in got))
            merged: list = [None] * len(cases)
            for w, (_, _, found) in enumerate(got):
                merged[w::workers] = found
            par.found.append(merged)
    except _Stop as stop:
        par.error = str(stop)
    finally:
        for worker in pool:
            worker.stop()
    return par


def one_pass(backend: Backend, cases: list[Case], device: str) -> tuple[list[CaseResult], float]:
    """Every case checked once in this process; the results and the seconds it took."""
    start = time.perf_counter()
    results = [check_case(backend, c, device) for c in cases]
    return results, time.perf_counter() - start


def _worst(results: list[CaseResult], found: list[CaseResult]) -> list[CaseResult]:
    """A case that failed in any pass stays failed."""
    return [old if old.status != "pass" else new for old, new in zip(results, found)]


def _timed_passes(
    backend: Backend, cases: list[Case], device: str, repeat: int
) -> tuple[list[CaseResult], list[float]]:
    """`repeat` passes in this process: the worst result of each case, and each pass's seconds."""
    results, passes = [], []
    for _ in range(repeat):
        found, seconds = one_pass(backend, cases, device)
        passes.append(seconds)
        results = _worst(results, found) if results else found
    return results, passes


def _worst_of_parallel(results: list[CaseResult], par: ParallelPasses) -> list[CaseResult]:
    """A case failing in a parallel pass is a failure as in a timed pass (same case, same repro)."""
    for found in par.found:
        seen = [dataclasses.replace(r, status=s, reason=why) for r, (s, why) in zip(results, found)]
        results = _worst(results, seen)
    return results


def _add_parallel(row: ThroughputRow, par: ParallelPasses, workers: int) -> None:
    """The parallel rate: the whole mix's checked cases over the median parallel pass."""
    row.workers, row.parallel_pass_seconds = workers, par.walls
    if par.error:
        row.reason = f"in {workers} processes: {par.error}"
    elif par.walls and statistics.median(par.walls) > 0:
        row.parallel_cases_per_s = row.checked / statistics.median(par.walls)


def throughput_row(
    backend: Backend,
    device: str,
    cases: list[Case],
    results: list[CaseResult],
    passes: list[float],
    warm: float,
) -> ThroughputRow:
    """Counts and rate of the timed passes: the rate is of the median pass (a shared machine's noise
    moves single passes by a third). Failures are listed with their repro command, never hidden."""
    seconds = statistics.median(passes)
    status = [r.status for r in results]
    checked = len(status) - status.count("skip")
    bad = [r for r in results if r.status in ("fail", "crash", "hang")]
    return ThroughputRow(
        backend=backend.name,
        device=device,
        cases=len(cases),
        checked=checked,
        passed=status.count("pass"),
        failed=status.count("fail"),
        crashed=status.count("crash") + status.count("hang"),
        skipped=status.count("skip"),
        seconds=seconds,
        cases_per_s=checked / seconds if seconds > 0 else 0.0,
        pass_seconds=list(passes),
        warm_seconds=warm,
        failures=[
            {"status": r.status, "reason": r.reason, "repro": repro_command(r.case, backend.name, device)}
            for r in bad[:MAX_FAILURES_SHOWN]
        ],
    )


def measure_backend(
    backend: Backend,
    device: str,
    cases: list[Case],
    sections: tuple[str, ...],
    repeat: int = 1,
    workers: int = 1,
) -> tuple[ThroughputRow | None, PhaseRow | None]:
    """Warm pass (compiles, first-touch allocations), then `repeat` timed passes (and, with
    `workers` > 1, `repeat` passes in that many processes), then a recorded pass. Every timed
    pass's results count (a case failing in any of them is a failure)."""
    why = backend.available(device)
    if why:
        row = ThroughputRow(backend=backend.name, device=device, cases=len(cases), reason=why)
        return (row if "throughput" in sections else None), None
    _, warm = one_pass(backend, cases, device)
    row = None
    if "throughput" in sections:
        results, passes = _timed_passes(backend, cases, device, repeat)
        par = parallel_passes(backend, device, cases, workers, repeat) if workers > 1 else None
        if par:
            results = _worst_of_parallel(results, par)
        row = throughput_row(backend, device, cases, results, passes, warm)
        if par:
            _add_parallel(row, par, workers)
    phases = phase_row(backend, device, cases) if "phases" in sections else None
    return row, phases
