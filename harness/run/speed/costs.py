"""Each backend's expected cost for the check's schedule (harness/run/speed/schedule.py), in seconds as
one pytest process, and the fixed cost each of its processes pays: measured by the last `check
--jobs` runs of the same selection, else a default (docs/gpu.md, "Costs").

Every parallel check saves its parts' seconds into `timings.json` in the cache directory under a key
naming the selection (profile, markers, -k), so a `--family decode` run does not set the costs of a
full one; a run whose warm-up compiled beside it saves none (harness/run/check.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from harness.run import cache_dir
from harness.run.speed.schedule import STARTUP_S

TIMINGS = "timings.json"  # in the cache directory (harness/run/cache_dir.py)
FORMAT = "attn-harness-timings"
# Each backend's seconds as one process in a restored `make check` on an H100 (gpu profile, 8
# processes at once): what a runner's first check plans with, until it has measured its own.
# fa2/fa3 are not in the table: `expected` asks whether each can run here.
DEFAULT_SECONDS = {
    "flex_compiled": 77.0,
    "flashinfer_dec_tc": 45.0,
    "flex_eager": 42.0,
    "flashinfer_paged": 36.0,
    "fa4": 34.0,
    "torch_split": 30.0,
    "torch_native": 30.0,
    "flashinfer_dec_cc": 20.0,
    "flashinfer_ragged": 20.0,
    "flashinfer_enc": 8.0,
}
UNKNOWN_SECONDS = 60.0
# A process's fixed cost before a fit, where it is far above STARTUP_S: flex_compiled traces its
# compiled variants again in every process (fitted on 2 x H200 from parts at 1, 5 and 6 shards).
# With STARTUP_S its shards would sum to several times its one-process cost, and it would be split
# too little.
DEFAULT_FIXED = {"flex_compiled": 22.0}
# The most of a part's mean seconds that `measured` takes for the fixed cost each extra shard paid:
# n shards of mean m then read as at least (n + 1) / 2 x m of one process whatever fixed cost is
# assumed; one close to a shard's mean would make their sum read as one shard, the backend unsplit.
# An overestimate costs a shard's start, an underestimate the wall.
FIXED_SHARE = 0.5
# How many times the smallest shard count the largest must be for a fit: between close counts the
# parts' run-to-run noise is the slope (5 and 6 shards of nearly equal means fit a fixed cost of
# nearly all of it, and the backend is planned unsplit).
FIT_SPAN = 2
MEASURED_CODES = (0, 1, 5)  # a part that ran to its end (1: it found failures); not interrupted
Parts = list[tuple[str, int, float]]  # each part's backend, exit code and seconds


def _read(path: Path) -> dict[str, dict[str, dict]]:
    """The timings file's `selections` (backend -> seconds as one process) and `shards` (backend ->
    shard count -> a part's mean seconds), each by selection; an absent or unreadable file is no
    measurement, not an error."""
    empty: dict[str, dict[str, dict]] = {"selections": {}, "shards": {}}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return empty
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return empty
    kept = {key: doc.get(key) if isinstance(doc.get(key), dict) else {} for key in empty}
    return {key: {k: v for k, v in entries.items() if isinstance(v, dict)} for key, entries in kept.items()}


def fit(means: dict[int, float]) -> tuple[float, float] | None:
    """(fixed, work) seconds of a backend's process from a part's mean seconds at each shard count,
    least squares over mean = fixed + work / shards; None from shard counts less than FIT_SPAN apart,
    or where fixed < 0 or work <= 0 (the parts did not get shorter with more shards)."""
    if len(means) < 2 or max(means) < FIT_SPAN * min(means):
        return None
    xs, ys = [1 / n for n in means], list(means.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    work = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - work * mx
    return (fixed, work) if work > 0 and fixed >= 0 else None


def _means(entry: object) -> dict[int, float]:
    """A backend's `shards` entry as shard count -> mean seconds, dropping what is not a measurement."""
    if not isinstance(entry, dict):
        return {}
    out = {}
    for n, seconds in entry.items():
        if str(n).isdigit() and int(n) >= 1 and isinstance(seconds, (int, float)) and seconds >= 0:
            out[int(n)] = float(seconds)
    return out


def expected(
    names: list[str],
    selection: str,
    where: Path,
    unavailable: Callable[[str], str | None] = lambda name: None,
) -> tuple[dict[str, float], dict[str, str], dict[str, float]]:
    """Each backend's expected seconds as one process, where they came from (`measured`, `fitted: F s
    fixed`, `default`, `skips`, `unknown`), and its process's fixed cost (fitted, else DEFAULT_FIXED's,
    else STARTUP_S). A backend neither measured nor in the default table costs STARTUP_S where
    `unavailable(name)` gives a reason (its part only skips: UNKNOWN_SECONDS would plan it as a long
    one, keeping another backend from being split), else UNKNOWN_SECONDS."""
    timings = _read(where / TIMINGS)
    measured, shards = timings["selections"].get(selection, {}), timings["shards"].get(selection, {})
    costs, sources, startups = {}, {}, {}
    for name in names:
        value, fitted = measured.get(name), fit(_means(shards.get(name)))
        startups[name] = DEFAULT_FIXED.get(name, STARTUP_S)
        if fitted is not None:
            startups[name] = round(fitted[0], 1)
            costs[name], sources[name] = round(sum(fitted), 1), f"fitted: {fitted[0]:.0f} s fixed"
        elif isinstance(value, (int, float)) and value >= 0:
            costs[name], sources[name] = float(value), "measured"
        elif name in DEFAULT_SECONDS:
            costs[name], sources[name] = DEFAULT_SECONDS[name], "default"
        elif unavailable(name):
            costs[name], sources[name] = STARTUP_S, "skips"
        else:
            costs[name], sources[name] = UNKNOWN_SECONDS, "unknown"
    return costs, sources, startups


def _finished(parts: Parts) -> dict[str, list[float]]:
    """Each backend's parts' seconds, leaving out a backend with a part that did not run to its end."""
    by_backend: dict[str, list[float]] = {}
    broken = set()
    for backend, code, seconds in parts:
        by_backend.setdefault(backend, []).append(seconds)
        if code not in MEASURED_CODES:
            broken.add(backend)
    return {b: s for b, s in by_backend.items() if b not in broken}


def measured(parts: Parts, startups: dict[str, float] | None = None) -> dict[str, float]:
    """Each backend's cost as one process from its parts: the sum, less the fixed cost its extra
    shards paid (`startups`, else STARTUP_S), at most FIXED_SHARE of a part's mean seconds."""
    fixed = startups or {}
    out = {}
    for b, s in _finished(parts).items():
        paid = min(fixed.get(b, STARTUP_S), FIXED_SHARE * sum(s) / len(s))
        out[b] = round(sum(s) - (len(s) - 1) * paid, 1)
    return out


def shard_means(parts: Parts) -> dict[str, dict[str, float]]:
    """Each finished backend's shard count -> its parts' mean seconds, for `fit` in later runs."""
    return {b: {str(len(s)): round(sum(s) / len(s), 1)} for b, s in _finished(parts).items()}


def save(
    where: Path, selection: str, costs: dict[str, float], means: dict[str, dict[str, float]] | None = None
) -> None:
    """Merge `costs` and each backend's `means` (shard_means) into the selection's entries of the
    timings file."""
    if not costs and not means:
        return
    timings = _read(where / TIMINGS)
    selections, shards = timings["selections"], timings["shards"]
    selections[selection] = {**selections.get(selection, {}), **costs}
    mine = shards.setdefault(selection, {})
    for backend, seen in (means or {}).items():
        prior = mine.get(backend)
        mine[backend] = {**(prior if isinstance(prior, dict) else {}), **seen}
    cache_dir.write_json(where / TIMINGS, {"format": FORMAT, "selections": selections, "shards": shards})
