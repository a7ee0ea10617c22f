"""A fake JIT library for the warm-up's tests, run in its worker processes: it "compiles" a variant by
writing a file under the cache directory (the one the worker inherited), finds it there the next
time, and records every variant it was asked for in a log next to it."""

from __future__ import annotations

import os
from pathlib import Path

from harness.run import cache_dir
from harness.tools.warmup import CACHED, COMPILED, Library, Variant

SUBDIR = "fake"


def compile_variant(name: str) -> str:
    """COMPILED the first time `name` is asked for under this cache directory, CACHED after."""
    if name == "broken":
        raise RuntimeError("the fake compiler cannot compile 'broken'")
    root = cache_dir.root() / SUBDIR
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


def environ(names: tuple[str, ...]) -> dict[str, str | None]:
    """The values of `names` in this process's environment (a worker's, in the tests)."""
    return {n: os.environ.get(n) for n in names}
