"""How the suite runs: its tests, worker processes and isolation, the pytest plugin, the check
(check.py: a CheckRequest in, a RunResult out), repro, and the speed part (speed/).

Here, results.json's `run` object (RunInfo): what ran, when, how long and how it ended, built here
alone. One pytest process (`pytest cases`, or one part of a parallel check) describes itself with the
fields every run has and its own timings (`configured_at`, `collect_s`, `test_s`); a parallel check
adds its plan (`jobs`, `expected_s`), its parts and, on CUDA, the warm-up's seconds. The report and
the bench read these keys (docs/reports.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

INTERRUPTED = 130  # the exit status of a run stopped by SIGINT: 128 + the signal, as a shell says


def started_now() -> tuple[float, str]:
    """This moment as (epoch seconds, the local time as results.json writes it)."""
    return time.time(), time.strftime("%Y-%m-%dT%H:%M:%S%z")


def default_id(start: float) -> str:
    """A run id from its start time, for a run not given one (`pytest cases --harness-report DIR`)."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(start))


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """The `run` object. The process timings are those of one pytest process; the plan and the
    parts those of a parallel check; a field left None is not written."""

    id: str
    started: str
    elapsed_s: float
    profile: str
    derandomized: bool | None = None  # whether the profile drew a fixed set (hypothesis derandomize)
    command: str
    exit_status: int
    configured_at: float | None = None  # epoch seconds at pytest's configure
    collect_s: float | None = None
    test_s: dict[str, float] | None = None  # each test's wall seconds
    jobs: int | None = None
    expected_s: float | None = None  # the plan's wall time
    parts: list[dict] | None = None  # harness/run/parallel.py's part_records
    warmup_s: float | None = None  # the warm-up beside the check: within elapsed_s, not added to it
    shard: dict | None = None  # a CI share's index, count and key (harness/run/ci_shards.py)
    interrupted: dict | None = None  # stopped before its end: {"not_run": [a line per backend left]}

    def to_dict(self) -> dict:
        """The object as results.json holds it, in a fixed key order."""
        order = (
            "id", "started", "configured_at", "elapsed_s", "profile", "derandomized", "command",
            "exit_status",
            "collect_s", "test_s", "jobs", "expected_s", "parts", "warmup_s", "shard",
            "interrupted",
        )
        rounded = {"configured_at": 3, "elapsed_s": 3, "collect_s": 3, "expected_s": 1, "warmup_s": 3}
        out: dict = {}
        for key in order:
            value = getattr(self, key)
            if value is None:
                continue
            if key in rounded:
                value = round(value, rounded[key])
            elif key == "test_s":
                value = {k: round(v, 3) for k, v in value.items()}
            out[key] = int(value) if key == "exit_status" else value
        return out
