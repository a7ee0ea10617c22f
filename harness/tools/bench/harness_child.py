"""`python -m harness check` as a child process of the bench: its exit status, wall and CPU time and
output, and the warm-up's last line in that output. The coldstart and gpus sections both measure
`make check` this way, as a CI job runs it."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HARNESS = [sys.executable, "-m", "harness"]  # how the children start the harness
# The warm-up's last line in a CUDA check's output (harness/run/speed/warm_gate.py's `join`).
WARMUP_LINE = re.compile(
    r"^warmup: (\d+) variants compiled in (\d+) s beside the check(?:; (\d+) failed)?", re.MULTILINE
)
OUTPUT_TAIL = 1500  # characters of a failed command's output kept in a row


@dataclass(frozen=True)
class Ran:
    """One command's outcome."""

    exit: int | None  # None: stopped at the time limit
    seconds: float
    cpu_seconds: float  # user + system CPU of the command and the descendants it waited for
    output: str


@dataclass(frozen=True)
class Warmup:
    """The warm-up's last line: what it compiled beside the check."""

    compiled: int
    seconds: float
    failed: int
    start: int  # where the line starts in the output (the warm-up's table is just before it)


def check_args(cache: Path, profile: str, backends: list[str], device: str, reports: Path) -> list[str]:
    """`check`'s arguments as the bench runs it: one cache directory, profile, backend set (empty:
    every backend) and device, no progress lines, its reports under `reports`."""
    picks = [a for b in backends for a in ("--backend", b)]
    args = ["check", "--cache-dir", str(cache), "--profile", profile, *picks, "--device", device]
    return [*args, "--no-progress", "--reports", str(reports)]


def children_cpu() -> float:
    """User + system CPU seconds of this process's children that have ended and been waited for,
    each with the descendants it waited for: the difference around one run is that run's CPU."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(args: list[str], env: dict[str, str], timeout: float) -> Ran:
    """`python -m harness ARGS` (HARNESS, read at the call) from the project root, to its end or
    `timeout` seconds."""
    cmd = [*HARNESS, *args]
    t0, cpu0 = time.monotonic(), children_cpu()
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    return Ran(code, time.monotonic() - t0, children_cpu() - cpu0, out)


def warmup(output: str) -> Warmup | None:
    """The warm-up's last line in a check's output; None where no warm-up ran (no CUDA, or skipped)."""
    m = WARMUP_LINE.search(output)
    if m is None:
        return None
    return Warmup(int(m.group(1)), float(m.group(2)), int(m.group(3) or 0), m.start())
