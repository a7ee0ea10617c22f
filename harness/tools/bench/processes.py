"""The bench's throughput in several processes, as `check --jobs N` runs one backend's suite.

Worker w (a spawned process of harness/run/workers.py, named bench-worker-W) checks the cases of
the mix whose index % workers == w. Every worker first warms up on its share (loading the backend,
compiling); each timed pass is then sent to all workers at once, and only once every worker has
finished the step before (the warm-up or the previous pass), so a slow warm-up never counts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.backends import load
from harness.backends.base import Backend
from harness.checks.numeric import check_case
from harness.core.case import Case
from harness.run import parallel
from harness.run.workers import Outcome, Worker, WorkerError, concurrently

# A worker silent this long (its warm-up compiles included) is stuck.
WORKER_TIMEOUT_S = 600.0
PRELOAD = ("harness.checks.numeric",)


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
