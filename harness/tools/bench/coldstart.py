"""The bench's coldstart section: `make check`'s cost on a fresh runner, kept measured (issue 24).

Runs `python -m harness warmup` then `python -m harness check` (the profile and backends given)
twice as child processes: first in a fresh, empty cache directory (every JIT variant compiles),
then again with that directory as the first run left it, as a CI job restores its saved cache to
the same path. Each run's row splits its wall time into warm-up and check and gives the cache's size
per library. The library variables are taken out of the children's environment, so a cache the
user pointed elsewhere (harness/run/cache_dir.py) cannot make the cold run warm.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.run import cache_dir

ROOT = Path(__file__).resolve().parents[3]
RUNS = ("cold", "warm")
HARNESS = [sys.executable, "-m", "harness"]  # how the children start the harness
COMPILED_LINE = re.compile(r"^warmup: (\d+) variants compiled", re.MULTILINE)
OUTPUT_TAIL = 1500  # characters of a failed command's output kept in the row


@dataclass
class ColdStartRow:
    run: str  # cold (an empty cache directory) or warm (the same directory after the cold run)
    profile: str
    backends: list[str]  # empty: every backend, as make check
    warmup_seconds: float = 0.0
    check_seconds: float = 0.0
    total_seconds: float = 0.0
    warmup_exit: int | None = None
    check_exit: int | None = None  # None: not run (the warm-up failed) or over the time limit
    compiled: int = 0  # variants the warm-up compiled
    cache_bytes: dict[str, int] = field(default_factory=dict)  # per subdirectory of the cache
    warmup_summary: list[str] = field(default_factory=list)  # the warm-up's table
    reason: str = ""  # why a command failed: its output's tail


def child_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment without the compile-cache variables: each child derives them from --cache-dir."""
    drop = {cache_dir.ENV, cache_dir.OWNED_ENV, cache_dir.FA4_SWITCH, *(v for _, v, _ in cache_dir.LIBRARIES)}
    return {k: v for k, v in environ.items() if k not in drop}


def sizes(root: Path) -> dict[str, int]:
    """Bytes on disk under each subdirectory of the cache root."""
    out = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        out[sub.name] = sum(f.stat().st_size for f in sub.rglob("*") if f.is_file() and not f.is_symlink())
    return out


def _timed(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, float, str]:
    """(exit status or None past `timeout`, seconds, output) of one command."""
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    return code, time.monotonic() - t0, out


def measure(
    run: str,
    cache: Path,
    profile: str,
    backends: list[str],
    device: str,
    timeout: float,
) -> ColdStartRow:
    """One warm-up + check in cache directory `cache`."""
    harness = HARNESS
    env = child_env(dict(os.environ))
    picks = [a for b in backends for a in ("--backend", b)]
    common = ["--cache-dir", str(cache), "--profile", profile, *picks]
    row = ColdStartRow(run, profile, list(backends))
    row.warmup_exit, row.warmup_seconds, out = _timed([*harness, "warmup", *common], env, timeout)
    m = COMPILED_LINE.search(out)
    row.compiled = int(m.group(1)) if m else 0
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("library ")), len(lines))
    row.warmup_summary = lines[start:]
    if row.warmup_exit != 0:
        row.reason = f"warmup exit {row.warmup_exit}: {out[-OUTPUT_TAIL:]}"
    else:
        check = [*harness, "check", *common, "--device", device, "--no-progress"]
        check += ["--reports", str(cache.parent / f"reports-{run}")]
        left = max(1.0, timeout - row.warmup_seconds)
        row.check_exit, row.check_seconds, out = _timed(check, env, left)
        if row.check_exit != 0:
            row.reason = f"check exit {row.check_exit}: {out[-OUTPUT_TAIL:]}"
    row.total_seconds = row.warmup_seconds + row.check_seconds
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
