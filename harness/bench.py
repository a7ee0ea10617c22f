"""The harness's own benchmark: how fast it checks, where the time goes, how far its reference
scales, and how fast the mutation catalogue is caught. `python -m harness bench`, `make bench`.

A correctness harness that is slow gets run rarely and with small shapes, and small shapes are
where window bugs hide: this measures the harness on whatever device is present and prints a table
and writes JSON (docs/bench.md documents every field). Sections:
- throughput: cases checked per second over a fixed, seeded mix of small cases, caches warm; with
  `workers` > 1 also in that many processes at once, as `check --jobs N` runs one backend;
- phases: fractions of each check's wall time spent building, planning, in the kernel, in the
  references, comparing, and (CPU) in the Hugging Face cross-check (harness/timing.py);
- scale: time and peak memory of the reference on one long request, in a subprocess per run;
- detection: examples and seconds until each mutant of the catalogue first fails (harness/mutation.py).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from queue import Empty

import torch

from harness import mutation, timing
from harness.backends import load
from harness.backends.base import Backend, Capabilities
from harness.batch import make_inputs
from harness.case import PAGE_LAYOUTS, Case, Request
from harness.checks.numeric import check_case
from harness.modes import Mode
from harness.results import CaseResult, repro_command

SECTIONS = ("throughput", "phases", "scale", "detection")
# Phases in the order a check runs them; `other` is the rest of the wall time (availability and
# support checks, the result record). "crossref" is the CPU-only reference-vs-reference check.
PHASES = ("build", "plan", "kernel", "reference", "compare", "crossref")

# The mix: one head shape, dtype and page size, so a JIT backend compiles few variants (FA4: one per
# code path and query-tile count) and the numbers compare across backends and devices.
MIX_SHAPE = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
MAX_BATCH = 8
MAX_TOKENS = 512  # per request: prefix + extend (CROSS: encoder keys)
MAX_DRAFT = 8
MAX_FAILURES_SHOWN = 5
# The parallel throughput: a worker silent this long (its warm-up compiles included) is stuck.
WORKER_TIMEOUT_S = 600.0
POLL_S = 0.5  # how often the parent looks for a dead worker while waiting
JOIN_GRACE_S = 10.0  # for a worker to exit after its last report, before it is killed

# Scale: one EXTEND request without a prefix, the shape of a long-context GQA model's layer.
SCALE_SHAPE = {"num_q_heads": 8, "num_kv_heads": 1, "head_dim": 128, "dtype": "bfloat16"}
SCALE_TOKENS = (8192, 32768, 131072)
SCALE_WINDOW = 4095  # window_left: 4096 keys, a common sliding-window size
GIB = 1 << 30

# DESIGN.md's table: the bug classes the harness exists for. A mutant is seed-class when its bug
# (the name after "~") is one of them; the target is each caught within 30 s on the GPU.
SEED_CLASS_BUGS = frozenset(
    {
        "ragged_no_window",  # SWA extend with prefix: the ragged pass gets no window
        "no_window",
        "prefix_window_at_end",  # ... the paged prefix pass anchors the window at the prefix end
        "prefix_window_only",
        "de_v2_prefix_only",  # DRAFT_EXTEND_V2 cache extent
        "de_v2_double_counted",
        "de_v2_drafts_twice",
        "split_dropped_swa",  # deterministic split parameters dropped
        "split_dropped_cross",
        "window_ignored",  # SDPA fallback ignores the window
        "swa_untranslated",  # hybrid SWA pool indexed with full-pool slots
        "swa_untranslated_exact",
        "swa_tree_untranslated",
    }
)
DETECTION_TARGET_S = 30.0


# --- the mix ----------------------------------------------------------------------------------


def mix(seed: int, n: int, caps: Capabilities, max_tokens: int = MAX_TOKENS) -> list[Case]:
    """A fixed mix of n small cases that `caps` can run, drawn from random.Random(seed) so it replays.

    Modes rotate through every mode the backend supports, each with and without a window (when it
    has windows; never in CROSS); batch 1..8, up to `max_tokens` keys per request, a hybrid SWA pool
    on a quarter of the windowed cases, page layouts at random.
    """
    rng = random.Random(seed)
    modes = [m for m in Mode if m in caps.modes]
    out = []
    for i in range(n):
        mode = modes[i % len(modes)]
        windowed = caps.window and mode != Mode.CROSS and (i // len(modes)) % 2 == 1
        num_draft = rng.randint(1, MAX_DRAFT)
        reqs = [
            _request(rng, mode, num_draft, caps.tree, max_tokens) for _ in range(rng.randint(1, MAX_BATCH))
        ]
        window = rng.randint(16, 256) if windowed else -1
        out.append(
            Case(
                mode=mode,
                requests=tuple(reqs),
                window_left=window,
                page_layout=rng.choice(PAGE_LAYOUTS),
                hybrid_swa_pool=windowed and caps.hybrid_pool and rng.random() < 0.25,
                seed=rng.randrange(2**31),
                **MIX_SHAPE,
            )
        )
    return out


def _request(rng: random.Random, mode: Mode, num_draft: int, trees: bool, max_tokens: int) -> Request:
    t = rng.randint(1, max_tokens)
    if mode == Mode.EXTEND:
        prefix = rng.randint(0, t - 1) if rng.random() < 0.5 else 0
        return Request(prefix, t - prefix)
    if mode == Mode.DECODE:
        return Request(t - 1, 1)
    if mode == Mode.CROSS:
        return Request(0, rng.randint(1, 64), encoder_len=t)
    tree = None
    if mode == Mode.TARGET_VERIFY:
        tree = tuple(range(-1, num_draft - 1))
        if trees and num_draft >= 3:
            tree = (-1,) + tuple(rng.randint(0, j - 1) for j in range(1, num_draft))
    return Request(max(0, t - num_draft), num_draft, tree=tree)


# --- throughput and phases --------------------------------------------------------------------


@dataclass
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


@dataclass
class PhaseRow:
    backend: str
    device: str
    checked: int
    wall_seconds: float
    ms_per_case: float
    fractions: dict[str, float]  # PHASES + "other", of the wall time; they sum to 1
    overhead: float  # 1 - kernel - reference: everything the harness adds around them


def _pass(backend: Backend, cases: list[Case], device: str) -> tuple[list[CaseResult], float]:
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
        found, seconds = _pass(backend, cases, device)
        passes.append(seconds)
        results = _worst(results, found) if results else found
    return results, passes


# --- throughput in several processes ----------------------------------------------------------


@dataclass
class ParallelPasses:
    """What the worker processes measured, complete passes only."""

    walls: list[float]  # per pass: the last worker's end - the first one's start
    found: list[list[tuple[str, str]]]  # per pass, per case of the mix: (status, reason)
    error: str = ""  # a worker failed, died or went silent; the passes after it are missing


def _worker(
    w: int,
    name: str,
    device: str,
    share: list[Case],
    repeat: int,
    barrier: Barrier,
    queue: Queue,
    timeout: float,
) -> None:
    """One worker: loads the backend by name (a Backend's caches do not cross processes), warms
    up on its share, then per pass waits for the others at the barrier and checks its share,
    reporting time.time() at start and end (one clock for every process). Any error is reported,
    never raised: the parent must not wait for reports that will not come."""
    try:
        backend = load(name)
        _pass(backend, share, device)
        for p in range(repeat):
            barrier.wait(timeout)
            start = time.time()
            results = [check_case(backend, c, device) for c in share]
            queue.put(("pass", w, p, start, time.time(), [(r.status, r.reason) for r in results]))
    except Exception as e:
        queue.put(("error", w, f"{type(e).__name__}: {e}"))


def _collect(procs: list, queue: Queue, expected: int, timeout: float) -> tuple[list[tuple], str]:
    """The workers' pass reports until all came, or one reported an error, died without a word,
    or none reported for `timeout` seconds: a broken worker ends the wait, never hangs it."""
    reports, last = [], time.monotonic()
    while len(reports) < expected:
        try:
            msg = queue.get(timeout=POLL_S)
        except Empty:
            dead = [f"worker {w} exited with code {p.exitcode}" for w, p in enumerate(procs) if p.exitcode]
            if dead:
                return reports, dead[0]
            if time.monotonic() - last > timeout:
                return reports, f"no worker reported for {timeout:g} s"
            continue
        if msg[0] == "error":
            return reports, f"worker {msg[1]}: {msg[2]}"
        reports.append(msg[1:])
        last = time.monotonic()
    return reports, ""


def _passes(reports: list[tuple], workers: int, n: int, error: str) -> ParallelPasses:
    """Each pass that every worker completed: its wall time, and the cases' results in mix order."""
    by_pass: dict[int, list[tuple]] = {}
    for w, p, start, end, found in reports:
        by_pass.setdefault(p, []).append((w, start, end, found))
    walls, found = [], []
    for got in (by_pass[p] for p in sorted(by_pass) if len(by_pass[p]) == workers):
        walls.append(max(end for _, _, end, _ in got) - min(start for _, start, _, _ in got))
        merged: list = [None] * n
        for w, _, _, share in got:
            merged[w::workers] = share
        found.append(merged)
    return ParallelPasses(walls, found, error)


def parallel_passes(
    backend: Backend,
    device: str,
    cases: list[Case],
    workers: int,
    repeat: int,
    timeout: float = WORKER_TIMEOUT_S,
) -> ParallelPasses:
    """The mix checked by `workers` processes sharing the device, as `check --jobs N` runs one
    backend's suite: worker w checks the cases whose index % workers == w. Spawned, not forked
    (CUDA cannot be used in a forked child); each pass starts at a barrier, so a slow warm-up does
    not count."""
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(w, backend.name, device, cases[w::workers], repeat, barrier, queue, timeout),
            name=f"bench-worker-{w}",
        )
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    reports, error = _collect(procs, queue, workers * repeat, timeout)
    if error:
        barrier.abort()  # the others stop waiting for the one that will not come
    for proc in procs:
        proc.join(JOIN_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return _passes(reports, workers, len(cases), error)


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


def phase_row(backend: Backend, device: str, cases: list[Case]) -> PhaseRow:
    """One recorded pass: each phase's exclusive time over the summed wall time of the checks."""
    wall = 0.0
    checked = 0
    with timing.recording() as rec:
        for c in cases:
            start = time.perf_counter()
            res = check_case(backend, c, device)
            wall += time.perf_counter() - start
            checked += res.status != "skip"
    fractions = {p: (rec.seconds.get(p, 0.0) / wall if wall > 0 else 0.0) for p in PHASES}
    fractions["other"] = max(0.0, 1.0 - sum(fractions.values()))
    return PhaseRow(
        backend=backend.name,
        device=device,
        checked=checked,
        wall_seconds=wall,
        ms_per_case=1000 * wall / max(checked, 1),
        fractions=fractions,
        overhead=max(0.0, 1.0 - fractions["kernel"] - fractions["reference"]),
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
        row = ThroughputRow(backend.name, device, len(cases), reason=why)
        return (row if "throughput" in sections else None), None
    _, warm = _pass(backend, cases, device)
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


# --- scale ------------------------------------------------------------------------------------


@dataclass
class ScaleRow:
    device: str
    tokens: int
    window_left: int
    status: str  # ok, timeout (the exact or native run exceeded the limit), error
    exact_seconds: float | None = None
    exact_peak_bytes: int | None = None
    native_seconds: float | None = None
    native_peak_bytes: int | None = None
    check_seconds: float | None = None  # exact + native: what a check of this request costs
    peak_bytes: int | None = None  # the larger of the two peaks
    target: str = ""
    verdict: str = ""  # met, MISSED, or "" where no target applies
    reason: str = ""


def scale_case(tokens: int, window_left: int) -> Case:
    """One EXTEND request of `tokens` new tokens, no prefix, in SCALE_SHAPE."""
    return Case(mode=Mode.EXTEND, requests=(Request(0, tokens),), window_left=window_left, **SCALE_SHAPE)


def _peak_reset() -> None:
    """Reset the kernel's peak-RSS mark (Linux); elsewhere the peak includes making the inputs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _rss(field_name: str) -> int:
    """VmRSS (now) or VmHWM (peak) in bytes. /proc rather than getrusage: a spawned child's
    ru_maxrss starts at its parent's peak (Linux keeps it across fork and exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def scale_child(spec: str) -> None:
    """In a fresh process: one reference run of a scale case; prints {"seconds", "peak_bytes"}."""
    from references.torch_ref import reference

    s = json.loads(spec)
    device = torch.device(s["device"])
    case = scale_case(s["tokens"], s["window_left"])
    inputs = make_inputs(case)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        _peak_reset()
        before = _rss("VmRSS")
    start = time.perf_counter()
    reference(case, inputs, s["precision"], device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _rss("VmHWM") - before
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_bytes": max(0, peak)}), flush=True)


def _run_child(device: str, tokens: int, window: int, precision: str, timeout: float) -> dict:
    spec = json.dumps({"device": device, "tokens": tokens, "window_left": window, "precision": precision})
    code = "import sys; from harness.bench import scale_child; scale_child(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"timeout after {timeout:g}s ({precision})"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"status": "error", "reason": f"{precision}: {tail}"}
    return {"status": "ok", **json.loads(done.stdout.strip().splitlines()[-1])}


def scale_target(device: str, tokens: int, window: int) -> tuple[str, float, int | None] | None:
    """The issue's targets: (text, seconds, bytes or None) for the rows they apply to."""
    if device == "cpu" and tokens == 32768:
        return "< 120 s, < 4 GiB", 120.0, 4 * GIB
    if device == "cuda" and tokens == 131072 and window >= 0:
        return "< 10 s, no OOM", 10.0, None
    return None


def scale_row(device: str, tokens: int, window: int, timeout: float) -> ScaleRow:
    """Exact, then native (a check needs both), each in its own subprocess under `timeout`."""
    row = ScaleRow(device, tokens, window, "ok")
    for precision in ("exact", "native"):
        got = _run_child(device, tokens, window, precision, timeout)
        if got["status"] != "ok":
            row.status, row.reason = got["status"], got["reason"]
            break
        setattr(row, f"{precision}_seconds", got["seconds"])
        setattr(row, f"{precision}_peak_bytes", got["peak_bytes"])
    if row.status == "ok":
        row.check_seconds = row.exact_seconds + row.native_seconds
        row.peak_bytes = max(row.exact_peak_bytes, row.native_peak_bytes)
    target = scale_target(device, tokens, window)
    if target:
        row.target, secs, limit = target
        met = row.status == "ok" and row.check_seconds < secs and (limit is None or row.peak_bytes < limit)
        row.verdict = "met" if met else "MISSED"
    return row


# --- detection --------------------------------------------------------------------------------


def seed_class(mutant_name: str) -> bool:
    """Whether the mutant reintroduces one of DESIGN.md's bug classes."""
    return mutant_name.split("~", 1)[-1] in SEED_CLASS_BUGS


def detection(
    device: str,
    backends: list[str] | None,
    max_examples: int,
    budget: float | None,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Hunt each mutant that runs on `device` in its first family (as CI does) with
    harness.mutation, under the device's default profile, without shrinking past the first failure.
    Seed-class mutants go first; once `budget` seconds are spent, the remaining hunts are reported
    as skipped, not dropped."""
    pairs = mutation.select(mutation.every_mutant(), backends=backends, first_family=True)
    pairs = [(m, f) for m, f in pairs if device == "cuda" or m.device == "cpu"]
    pairs.sort(key=lambda pair: not seed_class(pair[0].name))  # a budget cuts the others first
    rows = []
    start = time.perf_counter()
    for m, family in pairs:
        if budget is not None and time.perf_counter() - start > budget:
            row = mutation.Row(m.name, m.backend, device, family, m.check, m.method, m.bug, "skip")
            row.reason = f"detection budget of {budget:g}s spent"
        else:
            (row,) = mutation.run([(m, family)], [device], max_examples, 0, invariance_shrink_runs=0)
        d = row.to_dict()
        d["seed_class"] = seed_class(m.name)
        d["within_target"] = row.outcome == "caught" and row.seconds <= DETECTION_TARGET_S
        rows.append(d)
        if progress:
            progress(d)
    return rows


# --- the whole bench --------------------------------------------------------------------------


@dataclass
class Options:
    device: str
    backends: list[Backend]
    sections: tuple[str, ...] = SECTIONS
    cases: int = 64
    seed: int = 0
    repeat: int = 3  # timed throughput passes; the median is reported
    workers: int = 1  # > 1: throughput also in this many processes at once
    scale_tokens: tuple[int, ...] = SCALE_TOKENS
    scale_timeout: float = 180.0
    max_examples: int = 200
    detection_budget: float | None = None
    mutant_backends: list[str] | None = None  # detection: only these backends' mutants (None: all)


def run(
    opts: Options, say: Callable[[str], None] = print, save: Callable[[dict], None] | None = None
) -> dict:
    """Every selected section; returns the JSON document (docs/bench.md describes it). `save` gets
    the document after every row, so a run stopped by a time limit keeps what it measured."""
    doc: dict = {
        "schema": 1,
        "meta": {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "device": opts.device,
            "device_name": torch.cuda.get_device_name() if opts.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "sections": list(opts.sections),
        },
        "mix": {
            "seed": opts.seed,
            "cases": opts.cases,
            "timed_passes": opts.repeat,
            "workers": opts.workers,
            "max_batch": MAX_BATCH,
            "max_tokens": MAX_TOKENS,
            **MIX_SHAPE,
        },
        "scale_shape": {**SCALE_SHAPE, "mode": "EXTEND", "window_left": SCALE_WINDOW},
        "detection_profile": mutation.DEVICE_PROFILE[opts.device],
        **{section: [] for section in opts.sections},
    }

    def keep(section: str, row: dict) -> None:
        doc[section].append(row)
        doc["passed"] = passed(doc)
        if save:
            save(doc)

    if "throughput" in opts.sections or "phases" in opts.sections:
        for b in opts.backends:
            say(f"  throughput/phases: {b.name} on {opts.device} ...")
            cases = mix(opts.seed, opts.cases, b.capabilities)
            row, phases = measure_backend(b, opts.device, cases, opts.sections, opts.repeat, opts.workers)
            if row:
                keep("throughput", dataclasses.asdict(row))
            if phases:
                keep("phases", dataclasses.asdict(phases))
    if "scale" in opts.sections:
        for tokens in opts.scale_tokens:
            for window in (-1, SCALE_WINDOW):
                say(f"  scale: {tokens} tokens, window_left {window} ...")
                keep("scale", dataclasses.asdict(scale_row(opts.device, tokens, window, opts.scale_timeout)))
    if "detection" in opts.sections:

        def progress(d: dict) -> None:
            say(f"  detection: {d['outcome']:8} {d['mutant']} ({d['hunt_seconds']:.1f}s)")
            keep("detection", d)

        detection(opts.device, opts.mutant_backends, opts.max_examples, opts.detection_budget, progress)
    doc["passed"] = passed(doc)
    return doc


def passed(doc: dict) -> bool:
    """False when a mix case failed, crashed or hung, a parallel measurement failed, or a mutant
    survived or its hunt errored."""
    bad_case = any(r["failed"] or r["crashed"] for r in doc.get("throughput", []))
    bad_workers = any(r["workers"] > 1 and r["reason"] for r in doc.get("throughput", []))
    bad_hunt = any(r["outcome"] in ("survived", "error") for r in doc.get("detection", []))
    return not (bad_case or bad_workers or bad_hunt)


# --- the table --------------------------------------------------------------------------------


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]
    return [lines[0], "-" * len(lines[0]), *lines[1:]]


def _mib(n: int | None) -> str:
    return "-" if n is None else (f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _throughput_cells(r: dict, parallel: bool) -> tuple[str, ...]:
    """A throughput row's cells; `-` for what was not measured (the parallel rate when it failed)."""
    if not r["pass_seconds"]:  # unavailable here
        return (r["backend"], *["-"] * (9 if parallel else 8))
    rate = r["parallel_cases_per_s"]
    procs = (f"{rate:.1f}" if rate else "-",) if parallel else ()
    counts = (r["checked"], r["passed"], r["failed"], r["crashed"], r["skipped"])
    return (
        r["backend"],
        f"{r['cases_per_s']:.1f}",
        *procs,
        *map(str, counts),
        _s(r["seconds"]),
        _s(r["warm_seconds"]),
    )


def table(doc: dict) -> str:
    """The printed report: one block per section that ran."""
    out: list[str] = []
    m = doc["mix"]
    mix_words = (
        f"seed {m['seed']}, {m['cases']} cases, batch <= {m['max_batch']}, "
        f"<= {m['max_tokens']} tokens/request, {m['num_q_heads']} q / {m['num_kv_heads']} kv heads "
        f"x {m['head_dim']}, {m['dtype']}, page {m['page_size']}"
    )
    dev = f"{doc['meta']['device']} ({doc['meta']['device_name']}, {doc['meta']['threads']} threads)"
    if "throughput" in doc:
        out.append(f"throughput on {dev}; mix: {mix_words}")
        workers = m["workers"]
        procs = (f"{workers} procs/s",) if workers > 1 else ()
        head = (
            "backend",
            "cases/s",
            *procs,
            "checked",
            "pass",
            "fail",
            "crash",
            "skip",
            "seconds",
            "warm-up s",
        )
        out += _grid(head, [_throughput_cells(r, workers > 1) for r in doc["throughput"]])
        for r in doc["throughput"]:
            if r["reason"]:
                what = "not measured" if not r["pass_seconds"] else "parallel measurement failed"
                out.append(f"  {r['backend']}: {what}: {r['reason']}")
            for f in r["failures"]:
                out.append(f"  {r['backend']} {f['status'].upper()}: {f['reason']}\n    {f['repro']}")
        out.append("")
    if "phases" in doc:
        out.append("phases: fractions of each check's wall time (crossref: the CPU-only HF cross-check)")
        head = ("backend", "ms/case", *PHASES, "other", "overhead")
        rows = [
            (
                r["backend"],
                f"{r['ms_per_case']:.1f}",
                *(f"{r['fractions'][p]:.3f}" for p in (*PHASES, "other")),
                f"{r['overhead']:.3f}",
            )
            for r in doc["phases"]
        ]
        out += _grid(head, rows)
        out.append("  overhead = 1 - kernel - reference; target on the H100: under 0.5")
        out.append("")
    if "scale" in doc:
        s = doc["scale_shape"]
        out.append(
            f"scale: reference (exact, then native) on one {s['mode']} request, no prefix, "
            f"{s['num_q_heads']} q / {s['num_kv_heads']} kv heads x {s['head_dim']}, {s['dtype']}; "
            "each run in its own process"
        )
        head = (
            "tokens",
            "window",
            "exact s",
            "exact peak",
            "native s",
            "native peak",
            "check s",
            "target",
            "verdict",
        )
        rows = [
            (
                str(r["tokens"]),
                "none" if r["window_left"] < 0 else str(r["window_left"]),
                _s(r["exact_seconds"]),
                _mib(r["exact_peak_bytes"]),
                _s(r["native_seconds"]),
                _mib(r["native_peak_bytes"]),
                _s(r["check_seconds"]) if r["status"] == "ok" else r["reason"],
                r["target"] or "-",
                r["verdict"] or "-",
            )
            for r in doc["scale"]
        ]
        out += _grid(head, rows)
        out.append("")
    if "detection" in doc:
        out.append(
            f"detection: profile {doc['detection_profile']}, first family of each mutant, "
            "seconds to the first failure"
        )
        head = ("mutant", "family", "seed class", "result", "examples", "seconds")
        rows = [
            (
                d["mutant"],
                d["family"],
                "yes" if d["seed_class"] else "",
                d["outcome"].upper() if d["outcome"] != "caught" else f"caught ({d['status']})",
                str(d["examples"]) if d["outcome"] == "caught" else "-",
                _s(d["seconds"]) if d["outcome"] == "caught" else "-",
            )
            for d in doc["detection"]
        ]
        out += _grid(head, rows)
        counts = {
            o: sum(d["outcome"] == o for d in doc["detection"])
            for o in ("caught", "survived", "skip", "error")
        }
        seeds = [d for d in doc["detection"] if d["seed_class"] and d["outcome"] != "skip"]
        fast = sum(d["within_target"] for d in seeds)
        out.append(", ".join(f"{n} {o}" for o, n in counts.items()))
        scope = "" if doc["meta"]["device"] == "cuda" else " (the target is for warm GPU time)"
        out.append(
            f"seed-class mutants caught within {DETECTION_TARGET_S:g} s: {fast} of {len(seeds)}{scope}"
        )
        for d in doc["detection"]:
            if d["outcome"] != "caught":
                out.append(f"  {d['mutant']}: {(d['reason'].splitlines() or [''])[0]}")
    return "\n".join(out).rstrip()


def write_json(path: str | Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
