"""`check --jobs N`: the suite split by backend over N pytest processes, merged into one report.

On a GPU a check is bound by the host (Python, kernel launches, compiling), not by the device: one
pytest process leaves the GPU idle most of the time. Here each backend's suite is its own pytest
process (with its own isolation worker), or several (pytest's `--harness-shard I/N`) when it alone
would bound the wall time, at most N at once, the longest first (harness/run/speed/schedule.py's
plan). Each of the N slots is pinned to one GPU, which alone a process started in it sees
(CUDA_VISIBLE_DEVICES). Their results files are merged into the run's results.json.
A process's output goes to `<run dir>/parts/<backend>.log`; its results to `parts/<backend>.json`
(a shard's: `parts/<backend>.<I>of<N>.log` and `.json`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.core.vocab import STATUSES
from harness.report import results_json
from harness.run.speed.schedule import Plan
from harness.run.workers import Child

STATUS_EVERY_S = 30.0  # a line naming the running backends, between completions
NO_TESTS = 5  # pytest: nothing collected (a backend with no test under the filters)
INTERRUPTED = 2  # pytest's status for an interrupted run
INTERRUPT_GRACE_S = 20.0  # for an interrupted pytest to write its results
OUTSIDE_TOP = 3  # tests named per part in run.parts' `outside`
TIME_SPLIT_KEYS = ("startup_s", "launch_s", "collect_s", "cases_s", "tests_s", "outside")
# torch's CPU threads (OMP_NUM_THREADS) in each process of a CUDA check run several at once. A CUDA
# case's host work is Python and launches; torch's default pool (a thread per core) in every part's
# worker oversubscribes the cores when many parts share a host, and every case pays for it in its
# own seconds; one thread a process leaves the cores to the processes.
CUDA_PART_THREADS = 1
# Inductor starts min(32, cores) compile processes, a torch import each, in every process at its first
# compiled call (torch/_dynamo/backends/inductor.py, maybe_warm_pool), even when each graph is in the
# cache: 32 in each flex_compiled shard's worker on a 32-core host. A check's kernels are compiled by
# its warm-up (one thread a worker there too), so its parts keep to one.
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"
# nvcc jobs of each process's JIT builds (FlashInfer's ninja and torch's cpp_extension read MAX_JOBS;
# unset, ninja runs cores + 2): a module the warm-up did not build compiles in the part that meets it,
# and 8 parts a GPU each running 18 nvcc at once (GBs each) took a 16-core H200 host to a load of 70.
NVCC_JOBS = "MAX_JOBS"
CUDA_PART_NVCC_JOBS = 2


@dataclass(kw_only=True)
class Part:
    """One backend's pytest process, or one shard of it."""

    backend: str
    results: Path
    log: Path
    shard: int = 0
    shards: int = 1
    expected: float = 0.0  # seconds, the plan's
    slot: int | None = None  # the job slot it ran in, and that slot's GPU
    gpu: str | None = None
    child: Child | None = None
    start_s: float | None = None  # when it started, in seconds after the run's first start
    seconds: float = 0.0
    code: int | None = None
    records: list[dict] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    run: dict = field(default_factory=dict)  # its results.json's run object
    interrupted: bool = False  # stopped by the check's SIGINT, or never started because of it

    @property
    def name(self) -> str:
        """How messages name the part: the backend, and its shard when split (`torch_native[0/2]`)."""
        return self.backend if self.shards == 1 else f"{self.backend}[{self.shard}/{self.shards}]"

    @property
    def args(self) -> list[str]:
        """The pytest options that select this part's tests beyond the backend."""
        return [] if self.shards == 1 else ["--harness-shard", f"{self.shard}/{self.shards}"]


def combined_code(codes: list[int]) -> int:
    """One exit status for the run: a failure (or worse) in any part wins; 5 only if every part
    collected nothing; a part killed by a signal counts as an internal error (3)."""
    bad = [3 if c < 0 else c for c in codes if c not in (0, NO_TESTS)]
    if bad:
        return max(bad)
    return NO_TESTS if codes and all(c == NO_TESTS for c in codes) else 0


def counts(records: list[dict]) -> str:
    """A part's records by status, in records, the unit of the summary and the report."""
    found = {s: sum(r["status"] == s for r in records) for s in STATUSES}
    by_status = ", ".join(f"{n} {s}" for s, n in found.items() if n)
    if not records:
        return "no records"
    return f"{len(records)} record{'' if len(records) == 1 else 's'}: {by_status}"


def parts(plan: Plan, parts_dir: Path) -> list[Part]:
    """The plan's parts in its start order, each with its own files: `<backend>.json`, or
    `<backend>.<I>of<N>.json` for shard I of N."""
    out = []
    for p in plan.parts:
        stem = file_name(p.backend) + (f".{p.shard}of{p.shards}" if p.shards > 1 else "")
        results, log = parts_dir / f"{stem}.json", parts_dir / f"{stem}.log"
        out.append(Part(backend=p.backend, results=results, log=log, shard=p.shard, shards=p.shards,
                        expected=p.seconds))
    return out


def file_name(backend: str) -> str:
    """A backend name or module:factory spec as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", backend)


def cuda_threads(env: Mapping[str, str]) -> dict[str, str]:
    """The thread and job limits for the processes of a CUDA check run several at once, each unless
    `env` (the user's) already sets it."""
    want = {
        "OMP_NUM_THREADS": str(CUDA_PART_THREADS),
        COMPILE_THREADS: "1",
        NVCC_JOBS: str(CUDA_PART_NVCC_JOBS),
    }
    return {name: value for name, value in want.items() if name not in env}


def part_env(env: dict[str, str], backends_env: str, part: Part) -> dict[str, str]:
    """A part's environment: its backend selected, and only its slot's GPU visible (when it has one)."""
    gpu = {} if part.gpu is None else {"CUDA_VISIBLE_DEVICES": part.gpu}
    return {**env, backends_env: part.backend, **gpu}


def _start(part: Part, cmd: list[str], env: dict[str, str], backends_env: str, cwd: Path, nice: int) -> None:
    argv = [*cmd, *part.args, "--harness-results", str(part.results)]
    # its own session: Ctrl-C reaches the check alone, which passes one SIGINT on (`_interrupt`)
    env = part_env(env, backends_env, part)
    part.child = Child(argv, part.log, env=env, cwd=cwd, nice=nice, session=True)


def _finish(part: Part, code: int) -> None:
    part.code, part.seconds = code, time.monotonic() - part.child.started
    if part.results.is_file():
        try:
            doc = results_json.load(part.results)
            part.records, part.environment, part.run = doc["results"], doc["environment"], doc["run"]
        except (OSError, results_json.ResultsError) as e:
            part.code = part.code or 3
            with part.log.open("a") as log:
                log.write(f"\nattn-harness: cannot read {part.results}: {e}\n")


@dataclass(kw_only=True)
class _Slots:
    """What `run` tracks while its parts run: those waiting, running and started, the free slots."""

    waiting: list[Part]
    free: list[int]
    running: list[Part] = field(default_factory=list)
    started: list[Part] = field(default_factory=list)
    done: int = 0


def _start_ready(
    slots: _Slots, plan: Plan, begun: float, start: Callable[[Part], None], ready: Callable[[str], bool]
) -> None:
    """Give each free slot the first waiting part whose backend is ready, with that slot's GPU."""
    while slots.free:
        part = next((p for p in slots.waiting if ready(p.backend)), None)
        if part is None:
            return
        slots.waiting.remove(part)
        slots.started.append(part)
        part.slot = slots.free.pop(0)
        part.gpu = plan.slot_gpus[part.slot]
        part.start_s = time.monotonic() - begun
        start(part)
        slots.running.append(part)


def _collect_ended(slots: _Slots, total: int, out: IO[str]) -> None:
    """Finish every running part that has ended, free its slot, and say a line for it."""
    for part in list(slots.running):
        code = part.child.poll()
        if code is None:
            continue
        slots.running.remove(part)
        slots.free = sorted([*slots.free, part.slot])
        _finish(part, code)
        slots.done += 1
        note = "" if code in (0, NO_TESTS) else f"  exit {code}, log: {part.log}"
        took = f"{part.seconds:.0f} s" + ("" if part.gpu is None else f", GPU {part.gpu}")
        line = f"[{slots.done}/{total}] {part.name}: {counts(part.records)} ({took})"
        print(line + note, file=out, flush=True)


def _status(slots: _Slots, ready: Callable[[str], bool], out: IO[str]) -> None:
    """The line naming the running parts and how many wait (and how many of those for the warm-up)."""
    now = time.monotonic()
    busy = ", ".join(f"{p.name} {now - p.child.started:.0f} s" for p in slots.running) or "nothing"
    gated = sum(not ready(p.backend) for p in slots.waiting)
    warming = f" ({gated} for the warm-up)" if gated else ""
    print(f"running: {busy}; {len(slots.waiting)} waiting{warming}", file=out, flush=True)


def _interrupt(slots: _Slots, out: IO[str]) -> None:
    """Ask the running parts to stop and write what they checked; mark the rest interrupted."""
    print(f"interrupted: stopping {', '.join(p.name for p in slots.running)}", file=out, flush=True)
    for part in slots.running:
        part.child.interrupt()  # pytest writes its results on an interrupt
    grace = INTERRUPT_GRACE_S
    for part in slots.running:
        try:
            part.child.stop(grace)
        except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
            grace = 0.0
            part.child.stop(grace)
        _finish(part, INTERRUPTED)
    for part in slots.running + slots.waiting:
        part.code, part.interrupted = INTERRUPTED, True


def run(
    cmd: list[str],
    env: dict[str, str],
    backends_env: str,
    plan: Plan,
    parts_dir: Path,
    cwd: Path,
    out: IO[str] = sys.stdout,
    status_every: float = STATUS_EVERY_S,
    ready: Callable[[str], bool] = lambda backend: True,
    nice: Callable[[], int] = lambda: 0,
) -> list[Part]:
    """Run `cmd` (a pytest command line) once per part of the plan (a backend, or a shard of one),
    in the plan's order, at most plan.jobs at once: a free slot takes the first waiting part whose
    backend is `ready` (its warm-up has ended, harness/run/speed/warm_gate.py), the lowest free slot
    and that slot's GPU, at the priority `nice()` gives when it starts (lower beside a ninja build).
    Returns the parts in start order, each with its exit code, seconds, slot, GPU and records. Prints
    a line as each ends. On an interrupt (Ctrl-C, a time limit's SIGINT) the running parts are asked
    to stop and write what they checked; parts not started are marked interrupted."""
    todo = parts(plan, parts_dir)
    slots = _Slots(waiting=list(todo), free=list(range(plan.jobs)))
    begun = last_status = time.monotonic()
    start = lambda part: _start(part, cmd, env, backends_env, cwd, nice())  # noqa: E731
    try:
        while slots.waiting or slots.running:
            _start_ready(slots, plan, begun, start, ready)
            _collect_ended(slots, len(todo), out)
            if (slots.running or slots.waiting) and time.monotonic() - last_status >= status_every:
                last_status = time.monotonic()
                _status(slots, ready, out)
            time.sleep(0.2)
    except KeyboardInterrupt:  # stopped: what the running parts checked so far still makes the report
        _interrupt(slots, out)
    return slots.started + slots.waiting


def not_run(parts: list[Part]) -> list[str]:
    """What an interrupted parallel check did not check, a line each: the parts never started, and
    what each stopped part says it did not run (or that its results were lost)."""
    lines = []
    for p in parts:
        if p.child is None:
            lines.append(f"{p.name}: never started")
        elif p.interrupted:
            lost = [f"{p.name}: stopped; its results were lost"] if not p.run else []
            lines += (p.run.get("interrupted") or {}).get("not_run", []) or lost
    return lines


def gpu_lines(parts: list[Part], wall: float) -> list[str]:
    """Which GPU ran which part, each GPU's busy time (the sum of its parts' seconds) and what bounds
    the wall time: the longest part, or the busiest GPU's sum."""
    started = [p for p in parts if p.child is not None]
    if not started:
        return []
    lines, busy = [], {}
    for gpu in dict.fromkeys(p.gpu for p in started):
        mine = [p for p in started if p.gpu == gpu]
        busy[gpu] = sum(p.seconds for p in mine)
        ran = ", ".join(f"{p.name} {p.seconds:.0f} s" for p in mine)
        lines.append(f"{'the CPU' if gpu is None else f'GPU {gpu}'}: busy {busy[gpu]:.0f} s: {ran}")
    longest = max(started, key=lambda p: p.seconds)
    sums = ", ".join(f"{g} {s:.0f} s" for g, s in busy.items() if g is not None)
    load = f"busy per GPU: {sums}" if sums else f"busy {sum(busy.values()):.0f} s"
    lines.append(f"wall {wall:.0f} s; {load}; longest part {longest.name} {longest.seconds:.0f} s")
    return lines


def merged_records(parts: list[Part]) -> list[dict]:
    """Every part's records, in part order, with each record of a whole test (no case) once: the
    shards of a backend split by variant all run its search tests, so a test skipped as a whole, or
    failed on its refusals over the same draw, says so in each (harness/run/speed/variant_shards.py)."""
    out, seen = [], set()
    for r in (r for p in parts for r in p.records):
        if r.get("case") is None:
            key = json.dumps(r, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
        out.append(r)
    return out


def part_records(parts: list[Part]) -> list[dict]:
    """The parts for results.json's run.parts."""
    return [
        {
            "part": p.name,
            "backend": p.backend,
            "shard": p.shard,
            "shards": p.shards,
            "gpu": p.gpu,
            "start_s": None if p.start_s is None else round(p.start_s, 3),
            "seconds": round(p.seconds, 3),
            "expected_s": round(p.expected, 1),
            "exit_status": p.code,
            **time_split(p),
        }
        for p in parts
    ]


def time_split(part: Part, top: int = OUTSIDE_TOP) -> dict:
    """Where a part's seconds went, from its results: `startup_s` (before pytest configured: the
    interpreter and imports; and writing its results and exiting), `launch_s` (the part of it before
    pytest configured; None when unknown), `collect_s`, `cases_s` (its cases' own seconds,
    timed in the isolation worker), `tests_s` (its tests' wall time), and `outside` (the `top` tests
    with the most wall time outside their cases, [test id, seconds]: drawing, the worker's start and
    imports, backend loading). Empty for a part that left no results."""
    if not part.run:
        return {}
    cases: dict[str, float] = {}
    for r in part.records:
        test = r.get("test_id") or ""
        cases[test] = cases.get(test, 0.0) + (r.get("seconds") or 0.0)
    tests = part.run.get("test_s", {})
    outside = sorted(((t, s - cases.get(t, 0.0)) for t, s in tests.items()), key=lambda x: -x[1])[:top]
    configured = part.run.get("configured_at")
    launched = part.child.started_at if part.child else None
    return {
        "startup_s": round(part.seconds - part.run.get("elapsed_s", 0.0), 3),
        "launch_s": None if configured is None or launched is None else round(configured - launched, 3),
        "collect_s": part.run.get("collect_s", 0.0),
        "cases_s": round(sum(cases.values()), 3),
        "tests_s": round(sum(tests.values()), 3),
        "outside": [[t, round(s, 3)] for t, s in outside],
    }
