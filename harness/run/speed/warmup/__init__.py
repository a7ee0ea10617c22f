"""`python -m harness warmup`: compile every JIT variant a profile draws, before the check needs it.

A fresh GPU runner otherwise compiles inside the check: FlashInfer's modules, FA4's kernels and
flex_compiled's inductor graphs, one worker at a time, each paying its own. Here each
JIT library (libraries.py) lists its variants for the profile, and every library runs at once, so
the machine's cores stay busy until the last compile:
- a library with a `plan` (FlashInfer) finds its modules in one worker process and builds them all
  in ONE ninja run, `jobs` steps at a time (ninja.py);
- the others run each variant once in a pool of worker processes (harness/run/workers.py).
Everything lands in the cache directory (harness/run/cache_dir.py) that the check then loads from.
Each variant or module reports whether it compiled or found everything cached, so a second run says
it compiled nothing; a library warmed before for the same profile, source, packages and GPU is
skipped outright (stamp.py). What a variant is per library: libraries.py, docs/flashinfer.md,
docs/flash_attn.md.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.run import cache_dir, workers
from harness.run.speed.warmup import ninja, stamp

COMPILED, CACHED = "compiled", "cached"
VARIANT_TIMEOUT = 900.0  # seconds for one variant, or one plan, in a worker
# How much lower the priority of work beside a ninja build is (pool workers here, the check's processes
# in harness/run/speed/warm_gate.py): the build is the longest chain of a cold run, the rest fills the gaps.
BESIDE_NINJA_NICE = 10


@dataclass(frozen=True)
class Variant:
    """One thing to compile: `task` is what the library's `compile` (or `plan`) gets in a worker
    (picklable); `users`: the backends that need it (empty: every backend of the library)."""

    library: str
    label: str
    task: object
    users: tuple[str, ...] = ()


def needed(variants: list[Variant], backends: Sequence[str] | None) -> list[Variant]:
    """The variants a check of `backends` (None: every backend) loads."""
    if not backends:
        return variants
    return [v for v in variants if not v.users or set(v.users) & set(backends)]


@dataclass(kw_only=True)
class Library:
    """A JIT library the warm-up compiles for.

    `backends`: the harness backends that draw its variants (a check of none of them needs nothing
    from it); `unavailable()`: why it cannot compile here (not installed, no CUDA), or None;
    `variants(profile)`; then either `plan`: an importable function run once in a worker on every
    variant's task, returning the ninja.Plan of the modules they need (built by one ninja, `jobs`
    at a time), or `compile`: an importable function run in a worker on one variant's task,
    returning COMPILED or CACHED. `processes(jobs)`: pool workers to use for `jobs` cores once no
    ninja runs beside them; `env`: variables its workers start with; `note()`: a line on where the
    variants came from, said once they are listed (None: nothing to say)."""

    name: str
    backends: tuple[str, ...]
    unavailable: Callable[[], str | None]
    variants: Callable[[str], list[Variant]]
    compile: Callable[[object], str] | None = None
    plan: Callable[[list], ninja.Plan] | None = None
    processes: Callable[[int], int] = lambda jobs: jobs
    env: Callable[[int], dict[str, str]] = lambda jobs: {}
    note: Callable[[], str | None] = lambda: None


@dataclass(kw_only=True)
class Tally:
    """One library's outcome: how many variants (modules, for a ninja library), compiled vs already
    cached, failures, seconds; or why it was skipped."""

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


def _ready(library: Library, tally: Tally) -> bool:
    """False (and the tally says why) when the library cannot compile here or is broken."""
    try:
        why = library.unavailable()
    except Exception as e:  # noqa: BLE001 - a library installed but broken: skipped, and it fails the run
        tally.skipped, tally.failed = f"broken: {e}", [f"{library.name}: {e}"]
        return False
    tally.skipped = why
    return not why


def _error(out: workers.Outcome) -> str:
    """One line for a worker call that did not return normally."""
    if out.kind == "ok":
        return f"returned {out.value!r}"
    why = out.error_line if out.kind == "raised" else out.kind
    return why or out.output[-300:]


def _call(worker: workers.Worker, fn: Callable, task: object) -> workers.Outcome:
    try:
        return worker.call(fn, (task,), VARIANT_TIMEOUT)
    except workers.WorkerError as e:  # the worker could not start: this call fails, the rest go on
        return workers.Outcome(kind="raised", error=str(e).splitlines()[0])


def warm_ninja(
    library: Library, todo: list[Variant], jobs: int, say: Callable[[str], None], start: float
) -> Tally:
    """Find the modules of every variant in one worker (`library.plan`), then build them in one ninja
    run of `jobs` parallel steps here (ninja.build); a line per module: compiled or cached."""
    tally = Tally(library=library.name)
    say(f"warmup: {library.name}: {len(todo)} variants: finding their modules in 1 process")
    worker = workers.Worker(f"warmup-{library.name}-plan", env=library.env(jobs), preload=(), finalize=True)
    try:
        out = _call(worker, library.plan, [v.task for v in todo])
    finally:
        worker.stop()
    if out.kind != "ok" or not isinstance(out.value, ninja.Plan):
        tally.failed.append(f"finding the modules: {_error(out)}")
        return tally
    plan = out.value
    tally.variants = len(plan.modules) + len(plan.prebuilt)
    say(
        f"warmup: {library.name}: {len(plan.modules)} modules to build in one ninja, {jobs} steps at a time"
        + (f" ({len(plan.prebuilt)} more prebuilt)" if plan.prebuilt else "")
    )
    try:
        result = ninja.build(plan, jobs, lambda line: say(f"  {library.name}: {line}"), start)
    except OSError as e:  # no ninja executable, or the top-level file cannot be written
        tally.failed.append(f"ninja: {e}")
        return tally
    for i, name in enumerate(sorted(result.compiled + result.cached), 1):
        what = COMPILED if name in result.compiled else CACHED
        say(f"  [{i}/{tally.variants}] {library.name} {name}: {what}")
    tally.compiled, tally.cached, tally.failed = len(result.compiled), len(result.cached), result.failed
    for line in result.failed:
        say(f"  {library.name}: FAILED {line}")
    return tally


def warm_pool(
    library: Library,
    todo: list[Variant],
    jobs: int,
    say: Callable[[str], None],
    start: float,
    built: threading.Event,
) -> Tally:
    """Compile every variant in worker processes; progress lines through `say` (what, N of M,
    compiled or cached, seconds since `start`). Half the pool works while a ninja build runs beside
    it (see `run`), at a lower priority (BESIDE_NINJA_NICE); the rest joins once `built` is set,
    unless every variant is taken by then."""
    tally = Tally(library=library.name, variants=len(todo))
    count = min(len(todo), max(1, library.processes(jobs)))
    first = count if built.is_set() else max(1, count // 2)
    later = f" ({count} once the ninja build has finished)" if first < count else ""
    say(f"warmup: {library.name}: {len(todo)} variants in {first} processes{later}")
    nice = 0 if built.is_set() else BESIDE_NINJA_NICE  # the ninja build is the longest chain: yield to it
    env = library.env(jobs)
    pool = [workers.Worker(f"warmup-{library.name}-{i}", env, (), nice, finalize=True) for i in range(count)]
    lock, done, waiting = threading.Lock(), [0], queue.Queue()
    for v in todo:
        waiting.put(v)

    def one(worker: workers.Worker, v: Variant) -> None:
        out = _call(worker, library.compile, v.task)
        with lock:
            done[0] += 1
            if out.kind == "ok" and out.value in (COMPILED, CACHED):
                tally.compiled += out.value == COMPILED
                tally.cached += out.value == CACHED
                what = out.value
            else:
                why = _error(out)
                tally.failed.append(f"{v.label}: {why}")
                what = f"FAILED ({why})"
            elapsed = time.monotonic() - start
            say(f"  [{done[0]}/{len(todo)}] {library.name} {v.label}: {what}  ({elapsed:.0f} s)")

    def drain(worker: workers.Worker, wait: bool) -> None:
        while wait and not built.wait(0.5):  # joins once the ninja build ends, unless nothing is left
            if waiting.empty():
                return
        while True:
            try:
                v = waiting.get_nowait()
            except queue.Empty:
                return
            one(worker, v)

    try:
        workers.concurrently([lambda i=i, w=w: drain(w, i >= first) for i, w in enumerate(pool)])
    finally:  # at once: each may take its 2 s grace to exit (a CUDA context to tear down)
        workers.concurrently([w.stop for w in pool])
    return tally


def _served(library: Library, backends: Sequence[str] | None) -> list[str]:
    return [b for b in (backends or library.backends) if b in library.backends]


def stamped(
    library: Library, profile: str, backends: Sequence[str] | None, say: Callable[[str], None]
) -> Tally | None:
    """The outcome of a library whose stamp (stamp.py) says it was warmed for this profile, source,
    packages and GPU and for these backends: nothing to do, said as such; None when it must run.
    Nothing is imported (a library's import costs seconds: on a restored cache the check's JIT
    backends start that much sooner); one broken since, at the same release, is met by the check."""
    root = cache_dir.root()
    before = stamp.found(root, library.name, stamp.key(profile), _served(library, backends))
    if before is None:
        return None
    say(
        f"warmup: {library.name}: warmed on {before['written']} for this profile, source, packages "
        f"and GPU ({stamp.path(root, library.name)}; delete it to warm up again): nothing to do"
    )
    return Tally(library=library.name, variants=before["variants"], cached=before["variants"])


def warm(
    library: Library,
    profile: str,
    jobs: int,
    say: Callable[[str], None],
    start: float | None = None,
    built: threading.Event | None = None,
    backends: Sequence[str] | None = None,
) -> Tally:
    """Compile every variant of `library` for `profile` that a check of `backends` (None: every
    backend) loads: one ninja (a library with a `plan`) or a pool of workers; `built`: set once no
    ninja build runs beside this library (None: none does)."""
    t0 = time.monotonic()
    start = t0 if start is None else start
    done = stamped(library, profile, backends, say)
    if done is not None:
        return done
    tally = Tally(library=library.name)
    if not _ready(library, tally):
        return tally
    root, served, want = cache_dir.root(), _served(library, backends), stamp.key(profile)
    try:
        todo = needed(library.variants(profile), backends)
    except Exception as e:  # noqa: BLE001 - the libraries beside it go on; the run fails
        tally.failed.append(f"listing the variants: {type(e).__name__}: {e}")
        return tally
    note = library.note()
    if note:
        say(f"warmup: {library.name}: {note}")
    if library.plan is not None:
        tally = warm_ninja(library, todo, jobs, say, start)
    else:
        if built is None:
            built = threading.Event()
            built.set()
        tally = warm_pool(library, todo, jobs, say, start, built)
    tally.seconds = time.monotonic() - t0
    if not tally.failed:
        stamp.write(root, library.name, want, served, tally.variants)
    return tally


def run(
    libraries: Sequence[Library],
    profile: str,
    jobs: int,
    say: Callable[[str], None] = print,
    backends: Sequence[str] | None = None,
    done: Callable[[Library, Tally], None] = lambda library, tally: None,
) -> list[Tally]:
    """Every library at once, each from its own thread, compiling what a check of `backends` (None:
    every backend) loads; a Tally each, in order. `done(library, tally)` is called as each library
    ends (a check beside the warm-up then starts that library's backends).

    Sizing: a ninja build (FlashInfer's nvcc, the longest) runs `jobs` steps at a time from the
    start, and each pool library starts with half its workers beside it, so the cores are shared
    about 2 to 1 rather than each library taking all of them (nvcc and a worker each take GBs of
    memory); once every ninja build has ended the pools grow to their full size, so the cores stay
    busy to the end. Workers start (import torch) in parallel, during FlashInfer's module search."""
    start, printing = time.monotonic(), threading.Lock()
    built, building = threading.Event(), [sum(lib.plan is not None for lib in libraries)]
    if not building[0]:
        built.set()

    def said(line: str) -> None:
        with printing:
            say(line)

    def one(library: Library) -> Tally:
        tally = Tally(library=library.name, skipped="the warm-up raised")
        try:
            tally = warm(library, profile, jobs, said, start, built, backends)
            return tally
        finally:
            if library.plan is not None:
                with printing:
                    building[0] -= 1
                    if not building[0]:
                        built.set()
            done(library, tally)

    return workers.concurrently([lambda lib=lib: one(lib) for lib in libraries])


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
    tallies = run(chosen, profile, jobs, say, backends)
    for line in summary(tallies, cache):
        say(line)
    return 1 if any(t.failed for t in tallies) else 0
