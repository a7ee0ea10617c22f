"""Fake JIT libraries for the warm-up's tests, run in its worker processes.

- `library`: a pool library; it "compiles" a variant by writing a file under the cache directory
  (the one the worker inherited), finds it there the next time, and records every variant it was
  asked for in a log next to it.
- `ninja_library`: a one-ninja library; its plan writes tiny modules whose build.ninja, run by the
  real ninja, copies sources to objects (with a depfile, as a compiler's) and links them.
Both append to one events log under the cache root (`events`), so a test reads the order in which
things happened across processes, never how long they took.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from harness.run import cache_dir
from harness.run.speed.warmup import CACHED, COMPILED, Library, Variant, ninja

SUBDIR = "fake"
NINJA_SUBDIR = "fakeninja"
GUARD_S = 30.0  # a fake that waits for another process gives up (fails) after this: never a pass
MEET = 4  # "meet" variants wait until this many pool workers have run one


def _log_event(root: Path, line: str) -> None:
    with (root / "events.log").open("a") as log:
        log.write(line + "\n")


def events(root: Path) -> list[str]:
    """Everything the fakes did under cache root `root`, in order."""
    log = root / "events.log"
    return log.read_text().splitlines() if log.exists() else []


def _meet(root: Path) -> None:
    """Register this worker and wait until MEET distinct workers have; raise after GUARD_S."""
    met = root / "met"
    met.mkdir(exist_ok=True)
    (met / multiprocessing.current_process().name).touch()
    deadline = time.monotonic() + GUARD_S
    while len(list(met.iterdir())) < MEET:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(list(met.iterdir()))} of {MEET} workers ever ran")
        time.sleep(0.02)


def compile_variant(name: str) -> str:
    """COMPILED the first time `name` is asked for under this cache directory, CACHED after."""
    if name == "broken":
        raise RuntimeError("the fake compiler cannot compile 'broken'")
    top = cache_dir.root()
    top.mkdir(parents=True, exist_ok=True)
    _log_event(top, f"pool {multiprocessing.current_process().name} {name} nice={os.nice(0)}")
    (top / "gate").touch()  # what the "gated" ninja module waits for
    if name.startswith("meet"):
        _meet(top)
    root = top / SUBDIR
    root.mkdir(parents=True, exist_ok=True)
    with (root / "asked.log").open("a") as log:
        log.write(f"{name}\n")
    built = root / f"{name}.so"
    if built.exists():
        return CACHED
    built.write_text(name)
    return COMPILED


def asked(root: Path) -> list[str]:
    """Every variant the fake compiler was asked for under cache root `root`, in order."""
    log = root / SUBDIR / "asked.log"
    return log.read_text().split() if log.exists() else []


def library(names: list[str], why_not: str | None = None) -> Library:
    return Library(
        name="fake",
        backends=("fake_backend",),
        unavailable=lambda: why_not,
        variants=lambda profile: [Variant("fake", f"{profile}:{n}", n) for n in names],
        compile=compile_variant,
    )


# --- the one-ninja library ---------------------------------------------------------------------


def write_module(
    root: Path,
    name: str,
    sources: int = 2,
    fail: bool = False,
    gate: Path | None = None,
    events: Path | None = None,
) -> ninja.Module:
    """A module directory `root/name` with `sources` source files, a shared header, and a build.ninja
    whose outputs are absolute paths (as FlashInfer's): compile copies a source to its object and
    writes a depfile naming the header (deps = gcc); link concatenates the objects and logs an
    event in `events` (if given). `fail`: the compile prints an error and exits 1; `gate`: it waits
    for that file first."""
    mod = (root / name).resolve()
    mod.mkdir(parents=True, exist_ok=True)
    header = root.resolve() / "common.h"
    if not header.exists():
        header.write_text("header\n")
    wait = ""
    if gate is not None:
        tries = int(GUARD_S / 0.05)
        wait = (
            f"i=0; while [ ! -e {gate} ]; do i=$$((i+1)); if [ $$i -gt {tries} ]; then "
            f"echo 'error: {gate.name} never opened' >&2; exit 1; fi; sleep 0.05; done; "
        )
    broken = f"echo '$in:1: error: {name} does not compile' >&2; exit 1; " if fail else ""
    lines = [
        "ninja_required_version = 1.3",
        "rule compile",
        f"  command = {wait}{broken}cp $in $out && printf '%s: %s %s\\n' $out $in {header} > $out.d",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule link",
        "  command = cat $in > $out" + (f" && echo 'ninja linked {name}' >> {events}" if events else ""),
    ]
    objects = []
    for i in range(sources):
        src = mod / f"src{i}.c"
        if not src.exists():
            src.write_text(f"{name} {i}\n")
        objects.append(f"{mod}/src{i}.o")
        lines.append(f"build {objects[-1]}: compile {src}")
    lines += [f"build {mod}/{name}.so: link {' '.join(objects)}", f"default {mod}/{name}.so", ""]
    (mod / "build.ninja").write_text("\n".join(lines))
    return ninja.Module(name, str(mod / "build.ninja"), str(mod), f"{mod}/{name}.so")


def plan_modules(names: list[str]) -> ninja.Plan:
    """The fake one-ninja library's plan, in a worker: a module per name under the cache root's
    NINJA_SUBDIR. "broken*" fails to compile, "many" has 24 sources, "gated" waits until a pool
    variant ran (the cache root's "gate" file), "prebuilt*" is served prebuilt; "noplan" among the
    names: the plan raises."""
    if "noplan" in names:
        raise RuntimeError("the fake cannot find its modules")
    top = cache_dir.root()
    root = top / NINJA_SUBDIR
    root.mkdir(parents=True, exist_ok=True)
    _log_event(top, f"plan {multiprocessing.current_process().name}")
    modules = [
        write_module(
            root,
            n,
            sources=24 if n == "many" else 2,
            fail=n.startswith("broken"),
            gate=top / "gate" if n == "gated" else None,
            events=top / "events.log",
        )
        for n in names
        if not n.startswith("prebuilt")
    ]
    prebuilt = tuple(n for n in names if n.startswith("prebuilt"))
    return ninja.Plan(str(root.resolve()), tuple(modules), prebuilt)


def ninja_library(names: list[str]) -> Library:
    return Library(
        name="fakeninja",
        backends=("fake_ninja_backend",),
        unavailable=lambda: None,
        variants=lambda profile: [Variant("fakeninja", n, n) for n in names],
        plan=plan_modules,
    )


def environ(names: tuple[str, ...]) -> dict[str, str | None]:
    """The values of `names` in this process's environment (a worker's, in the tests)."""
    return {n: os.environ.get(n) for n in names}
