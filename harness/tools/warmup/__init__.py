"""`python -m harness warmup`: compile every JIT variant a profile draws, before the check needs it.

A fresh GPU runner otherwise compiles inside the check: FlashInfer's modules, FA4's kernels and
flex_compiled's inductor graphs, one worker at a time, each paying its own (issue 24). Here each
JIT library (libraries.py) lists its variants for the profile, and a pool of worker processes
(harness/run/workers.py) runs each variant once, so the compiles spread over the machine's cores
and land in the cache directory (harness/run/cache_dir.py) that the check then loads from. Each
variant reports whether it compiled or found everything cached, so a second run says it compiled
nothing. What a variant is per library: libraries.py, docs/flashinfer.md, docs/flash_attn.md.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.run import workers

COMPILED, CACHED = "compiled", "cached"
VARIANT_TIMEOUT = 900.0  # seconds for one variant in a worker (a FlashInfer module: about 20 to 120)


@dataclass(frozen=True)
class Variant:
    """One thing to compile: `task` is what the library's `compile` gets in a worker (picklable)."""

    library: str
    label: str
    task: object


@dataclass
class Library:
    """A JIT library the warm-up compiles for.

    `backends`: the harness backends that draw its variants (a check of none of them needs nothing
    from it); `unavailable()`: why it cannot compile here (not installed, no CUDA), or None;
    `variants(profile)`; `compile`: an importable function run in a worker on one variant's task,
    returning COMPILED or CACHED; `processes(jobs)`: workers to use for `jobs` cores; `env`: variables
    its workers start with."""

    name: str
    backends: tuple[str, ...]
    unavailable: Callable[[], str | None]
    variants: Callable[[str], list[Variant]]
    compile: Callable[[object], str]
    processes: Callable[[int], int] = lambda jobs: jobs
    env: Callable[[int], dict[str, str]] = lambda jobs: {}


@dataclass
class Tally:
    """One library's outcome: how many variants, compiled vs already cached, failures, seconds; or
    why it was skipped."""

    library: str
    variants: int = 0
    compiled: int = 0
    cached: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str | None = None


def select(libraries: Sequence[Library], backends: Sequence[str] | None) -> list[Library]:
    """The libraries that a check of `backends` (None: every backend) draws variants from."""
    if not backends:
        return list(libraries)
    return [lib for lib in libraries if any(b in lib.backends for b in backends)]


def warm(
    library: Library, profile: str, jobs: int, say: Callable[[str], None], start: float | None = None
) -> Tally:
    """Compile every variant of `library` for `profile` in worker processes; progress lines through
    `say` (what, N of M, compiled or cached, seconds since `start`)."""
    t0 = time.monotonic()
    start = t0 if start is None else start
    tally = Tally(library.name)
    try:
        why = library.unavailable()
    except Exception as e:  # noqa: BLE001 - a library installed but broken: skipped, and it fails the run
        tally.skipped, tally.failed = f"broken: {e}", [f"{library.name}: {e}"]
        return tally
    if why:
        tally.skipped = why
        return tally
    todo = library.variants(profile)
    tally.variants = len(todo)
    count = min(len(todo), max(1, library.processes(jobs)))
    say(f"warmup: {library.name}: {len(todo)} variants in {count} processes")
    pool = [
        workers.Worker(f"warmup-{library.name}-{i}", env=library.env(jobs), preload=()) for i in range(count)
    ]
    lock, done = threading.Lock(), [0]

    def one(worker: workers.Worker, v: Variant) -> None:
        try:
            out = worker.call(library.compile, (v.task,), VARIANT_TIMEOUT)
        except workers.WorkerError as e:  # the worker could not start: this variant fails, the rest go on
            out = workers.Outcome("raised", error=str(e).splitlines()[0])
        with lock:
            done[0] += 1
            if out.kind == "ok" and out.value in (COMPILED, CACHED):
                tally.compiled += out.value == COMPILED
                tally.cached += out.value == CACHED
                what = out.value
            else:
                why = out.error_line if out.kind == "raised" else out.kind
                if out.kind == "ok":
                    why = f"returned {out.value!r}"
                tally.failed.append(f"{v.label}: {why or out.output[-300:]}")
                what = f"FAILED ({why})"
            elapsed = time.monotonic() - start
            say(f"  [{done[0]}/{len(todo)}] {library.name} {v.label}: {what}  ({elapsed:.0f} s)")

    try:
        workers.spread(pool, todo, one)
    finally:
        for w in pool:
            w.stop()
    tally.seconds = time.monotonic() - t0
    return tally


def run(
    libraries: Sequence[Library], profile: str, jobs: int, say: Callable[[str], None] = print
) -> list[Tally]:
    """Every library in turn (each already spreads over the cores); a Tally each."""
    start = time.monotonic()
    return [warm(lib, profile, jobs, say, start) for lib in libraries]


def summary(tallies: Sequence[Tally], cache: str) -> list[str]:
    """The table printed at the end, and one line saying what the run did."""
    head = f"{'library':<15}{'variants':>9}{'compiled':>10}{'cached':>8}{'failed':>8}{'seconds':>9}"
    lines = [head, "-" * len(head)]
    for t in tallies:
        if t.skipped:
            lines.append(f"{t.library:<15}skipped: {t.skipped}")
            continue
        cells = f"{t.variants:>9}{t.compiled:>10}{t.cached:>8}{len(t.failed):>8}{t.seconds:>9.1f}"
        lines.append(f"{t.library:<15}{cells}")
    for t in tallies:
        lines += [f"  {t.library} failed: {f}" for f in t.failed[:10]]
    compiled = sum(t.compiled for t in tallies)
    if not any(t.variants for t in tallies):
        lines.append("warmup: nothing to compile here")
    elif compiled == 0:
        lines.append(f"warmup: nothing compiled: every variant was already in the cache ({cache})")
    else:
        lines.append(f"warmup: {compiled} variants compiled into {cache}")
    return lines


def default_jobs() -> int:
    return os.cpu_count() or 1


def main(
    libraries: Sequence[Library],
    profile: str,
    backends: Sequence[str] | None,
    jobs: int,
    cuda: bool,
    cache: str,
    say: Callable[[str], None] = print,
) -> int:
    """The warmup command once its arguments are checked: 0, or 1 if a variant failed or a library
    is broken. Without CUDA there is nothing to compile (every JIT backend compiles for CUDA)."""
    if not cuda:
        say("attn-harness warmup: no CUDA device here: nothing to compile (the JIT backends run on CUDA)")
        return 0
    chosen = select(libraries, backends)
    if not chosen:
        say(f"attn-harness warmup: none of {', '.join(backends or [])} compiles anything: nothing to do")
        return 0
    say(f"attn-harness warmup: profile {profile}; {jobs} cores; cache directory {cache}")
    tallies = run(chosen, profile, jobs, say)
    for line in summary(tallies, cache):
        say(line)
    return 1 if any(t.failed for t in tallies) else 0
