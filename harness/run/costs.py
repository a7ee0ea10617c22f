"""Each backend's expected cost for the check's schedule (harness/run/schedule.py), in seconds as one
pytest process: measured by the last `check --jobs` run of the same selection, else a default.

Every parallel check saves what each backend's parts took into `timings.json` in the cache
directory (harness/run/cache_dir.py: a CI job that restores its compile caches restores these),
under a key naming the selection (profile, markers, -k), so a `--family decode` run does not set
the costs of a full one; a run whose warm-up compiled beside it saves none (harness/cli.py). A
backend never measured for the selection gets DEFAULT_SECONDS (an H100 with its cache restored, gpu
profile) or, when not in that table, UNKNOWN_SECONDS.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.run import cache_dir
from harness.run.schedule import STARTUP_S

TIMINGS = "timings.json"  # in the cache directory (harness/run/cache_dir.py)
FORMAT = "attn-harness-timings"
# `make check` on an H100 with its cache restored (the warm-up skipped by its stamps), gpu profile, 8
# processes at once, 2026-11-25: the parts' seconds as timings.json saved them (a run that compiled
# beside the check saves none: its parts shared the cores). Sharded backends are given as one
# process, less the shards' startups. fa2/fa3: not installed there, every test skipped; installed
# they check, so they get UNKNOWN_SECONDS.
DEFAULT_SECONDS = {
    "flex_compiled": 293.0,
    "torch_native": 89.0,
    "flex_eager": 70.0,
    "flashinfer_dec_tc": 65.0,
    "fa4": 43.0,
    "torch_split": 42.0,
    "flashinfer_paged": 40.0,
    "flashinfer_dec_cc": 26.0,
    "flashinfer_ragged": 26.0,
    "flashinfer_enc": 22.0,
}
UNKNOWN_SECONDS = 60.0
MEASURED_CODES = (0, 1, 5)  # a part that ran to its end (1: it found failures); not interrupted


def _read(path: Path) -> dict[str, dict[str, float]]:
    """The timings file's selections; an absent or unreadable file is no measurement (never an error:
    the schedule then falls back to the defaults)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return {}
    if not isinstance(doc.get("selections"), dict):
        return {}
    return {k: v for k, v in doc["selections"].items() if isinstance(v, dict)}


def expected(names: list[str], selection: str, where: Path) -> tuple[dict[str, float], dict[str, str]]:
    """Each backend's expected seconds, and where it came from (`measured`, `default`, `unknown`)."""
    measured = _read(where / TIMINGS).get(selection, {})
    costs, sources = {}, {}
    for name in names:
        value = measured.get(name)
        if isinstance(value, (int, float)) and value >= 0:
            costs[name], sources[name] = float(value), "measured"
        elif name in DEFAULT_SECONDS:
            costs[name], sources[name] = DEFAULT_SECONDS[name], "default"
        else:
            costs[name], sources[name] = UNKNOWN_SECONDS, "unknown"
    return costs, sources


def measured(parts: list[tuple[str, int, float]], startup: float = STARTUP_S) -> dict[str, float]:
    """Each backend's cost as one process from its parts' (backend, exit code, seconds): the sum,
    less the startups its extra shards paid; a backend with a part that did not run to its end (an
    interrupt, an internal error, a signal) is left out."""
    by_backend: dict[str, list[float]] = {}
    broken = set()
    for backend, code, seconds in parts:
        by_backend.setdefault(backend, []).append(seconds)
        if code not in MEASURED_CODES:
            broken.add(backend)
    kept = {b: s for b, s in by_backend.items() if b not in broken}
    return {b: round(max(sum(s) - (len(s) - 1) * startup, 0.0), 1) for b, s in kept.items()}


def save(where: Path, selection: str, costs: dict[str, float]) -> None:
    """Merge `costs` into the selection's entry of the timings file (written whole, then renamed)."""
    if not costs:
        return
    selections = _read(where / TIMINGS)
    selections[selection] = {**selections.get(selection, {}), **costs}
    cache_dir.write_json(where / TIMINGS, {"format": FORMAT, "selections": selections})
