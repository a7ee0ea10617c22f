"""The bench's coldstart section: `make check`'s cost on a fresh runner, kept measured.

Runs `python -m harness check` (on CUDA its warm-up compiles the JIT variants beside it) twice as a
child process: first in a fresh, empty cache directory (every JIT variant compiles), then again with
that directory as the first run left it, as a CI job restores its saved cache to the same path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.run import cache_dir
from harness.tools.bench import harness_child

RUNS = ("cold", "warm")


@dataclass(kw_only=True)
class ColdStartRow:
    """One run's row; docs/bench.md ("coldstart[]") gives each field."""

    run: str  # cold or warm
    profile: str
    backends: list[str]  # empty: every backend, as make check
    seconds: float = 0.0
    warmup_seconds: float | None = None  # None: no warm-up ran (no CUDA)
    compiled: int = 0
    warmup_failed: int = 0
    exit: int | None = None  # None past the time limit
    cpu_seconds: float = 0.0  # of the check and its descendants
    cores: int = 1
    cache_bytes: dict[str, int] = field(default_factory=dict)  # per subdirectory of the cache
    warmup_summary: list[str] = field(default_factory=list)
    reason: str = ""


def child_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment without the compile-cache variables (each child derives them from --cache-dir),
    so a cache the user pointed elsewhere cannot make the cold run warm."""
    drop = {cache_dir.ENV, cache_dir.OWNED_ENV, cache_dir.FA4_SWITCH, *(v for _, v, _ in cache_dir.LIBRARIES)}
    return {k: v for k, v in environ.items() if k not in drop}


def sizes(root: Path) -> dict[str, int]:
    """Bytes on disk under each subdirectory of the cache root."""
    out = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        out[sub.name] = sum(f.stat().st_size for f in sub.rglob("*") if f.is_file() and not f.is_symlink())
    return out


def measure(
    run: str,
    cache: Path,
    profile: str,
    backends: list[str],
    device: str,
    timeout: float,
) -> ColdStartRow:
    """One `check` in cache directory `cache`, as `make check` runs it."""
    env = child_env(dict(os.environ))
    args = harness_child.check_args(cache, profile, backends, device, cache.parent / f"reports-{run}")
    row = ColdStartRow(run=run, profile=profile, backends=list(backends), cores=os.cpu_count() or 1)
    ran = harness_child.timed(args, env, timeout)
    row.exit, row.seconds, row.cpu_seconds = ran.exit, ran.seconds, ran.cpu_seconds
    warm = harness_child.warmup(ran.output)
    if warm is not None:
        row.compiled, row.warmup_seconds, row.warmup_failed = warm.compiled, warm.seconds, warm.failed
        lines = ran.output[: warm.start].splitlines()
        start = max((i for i, line in enumerate(lines) if line.startswith("library ")), default=len(lines))
        row.warmup_summary = lines[start:]
    if row.exit != 0 or row.warmup_failed:
        failed = f"{row.warmup_failed} variants failed to compile"
        row.reason = f"check exit {row.exit}, {failed}: {ran.output[-harness_child.OUTPUT_TAIL:]}"
    row.cache_bytes = sizes(cache)
    return row


def coldstart(
    device: str,
    backends: list[str] | None,
    timeout: float,
    progress=None,  # noqa: ANN001 - called with each row
) -> list[ColdStartRow]:
    """The cold run in a fresh temporary cache directory, then the warm run in it; the directory is
    removed afterwards."""
    profile = "gpu" if device == "cuda" else "ci"
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="attn-harness-coldstart-"))
    try:
        for run in RUNS:
            row = measure(run, tmp / "cache", profile, backends or [], device, timeout)
            rows.append(row)
            if progress:
                progress(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
