"""The bench's throughput section: cases checked per second over the mix, caches warm, in this
process and (with workers > 1) in several at once (processes.py); and the measurement of one
backend that feeds both throughput and phases."""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from harness.backends.base import Backend
from harness.checks.numeric import check_case
from harness.core.case import Case
from harness.core.results import CaseResult, repro_command
from harness.tools.bench.phases import PhaseRow, phase_row
from harness.tools.bench.processes import ParallelPasses, parallel_passes

MAX_FAILURES_SHOWN = 5


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
