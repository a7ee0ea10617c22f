"""The bench's gpus section: what `make check` gains from a runner's second (and later) GPU.

`check` spreads its pytest processes over every visible GPU (harness/run/speed/schedule.py). This runs it
as a CI job does with its cache directory restored: first a priming `check` over every GPU (it
compiles what the cache lacks and saves the measured costs the schedule reads; run again once when it
compiled, since a run that compiled saves none), then `check --gpus <first>` and `check --gpus <all>`,
each with its default jobs; that pair once more when either was mis-planned (`misplanned`: a cost
the schedule had wrong, which the run then saved), so the speedup compares GPU counts, not plans.
The `all` row adds the speedup against SPEEDUP_TARGET, what bounds it (`judge`) and two ceilings
(`ceiling`): the target is out of reach of any schedule above `speedup_cases`. docs/bench.md ("gpus")
gives every field and bound, and why each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.report import results_json
from harness.run import cache_dir
from harness.run.parallel import TIME_SPLIT_KEYS
from harness.tools.bench import harness_child

SPEEDUP_TARGET = 1.7  # two GPUs against one: the check's goal on a two-GPU runner
LONGEST_BOUND = 0.8  # a longest part over this fraction of the wall time bounds the run
HOST_BOUND = 0.8  # a check whose CPU time is over this fraction of wall time x cores is bound by the host
SLOWER_CASES_BOUND = 0.1  # the same cases' own seconds this much longer on every GPU than on one
OUTSIDE_BOUND = 0.3  # parts' seconds outside their cases over this share of all their seconds
PRIMES = 2  # priming checks at most: the second only when the first compiled
# A run's longest part that took more than this many times its planned seconds, and LONGEST_BOUND of
# the run, measured the plan, not the GPUs: a backend planned unsplit on a wrong cost bounds the
# one-GPU run, and the speedup would read far above what a second GPU gives.
MISPLANNED = 1.5
PAIRS = 2  # one-GPU and every-GPU checks at most: the second pair only when the first was mis-planned


@dataclass(kw_only=True)
class GpuRow:
    run: str  # prime, one (the first visible GPU), all (every visible GPU), or skip
    gpus: list[str]
    profile: str
    backends: list[str]  # empty: every backend, as make check
    seconds: float = 0.0  # the check command's wall time
    cpu_seconds: float = 0.0  # user + system CPU of the check and every process it waited for
    cores: int = 1  # this machine's CPUs
    exit: int | None = None  # the check's exit status; None past the time limit
    compiled: int = 0  # variants its warm-up compiled (a prime on a cold cache)
    processes: int = 0  # pytest processes of its plan
    jobs: int = 0  # of them at once
    expected: float = 0.0  # the plan's expected wall time (results.json run.expected_s)
    busy: dict[str, float] = field(default_factory=dict)  # GPU -> the sum of its parts' seconds
    longest: str = ""  # the longest part
    longest_seconds: float = 0.0
    parts: list[dict] = field(default_factory=list)  # each: part, gpu, seconds, expected_s, TIME_SPLIT_KEYS
    cases_s: float | None = None  # its parts' cases' own seconds; None: its check kept no time split
    outside_s: float | None = None  # its parts' seconds less their cases' (None with cases_s)
    cases_growth: float | None = None  # all: its cases_s over the one row's, less 1 (both known)
    speedup: float | None = None  # all: the one row's seconds over this row's
    speedup_packed: float | None = None  # all: the speedup with both checks' parts packed perfectly
    speedup_cases: float | None = None  # all: ... and no part's seconds outside its cases
    elapsed: float = 0.0  # the check's own elapsed seconds (results.json run.elapsed_s): its parts' span
    verdict: str = ""  # all: met or MISSED against SPEEDUP_TARGET, or mis-planned (either run was)
    misplanned: str = ""  # why the run measured its plan (`misplanned`), empty when it did not
    bound: str = ""  # all: "longest part", "host", "slower cases", "time outside cases", those applying
    # joined by "and", or "load"
    reason: str = ""  # why the run failed (its output's tail), or why the section was skipped
    results: str = ""  # where the check's results.json was kept (every case's seconds), if it was


def read_parts(row: GpuRow, results: Path) -> None:
    """Fill the row's plan and parts from the check's results.json (run.jobs and run.parts)."""
    run = results_json.load(results)["run"]
    if "parts" not in run:
        raise ValueError("the check ran as one pytest process (one job on this machine): no parts")
    row.processes, row.jobs, row.expected = len(run["parts"]), run["jobs"], run.get("expected_s", 0.0)
    row.elapsed = run.get("elapsed_s") or 0.0
    for part in run["parts"]:
        later = ("start_s", *TIME_SPLIT_KEYS)  # none from a check before they were kept
        split = {k: part[k] for k in later if k in part}
        row.parts.append({**{k: part.get(k) for k in ("part", "gpu", "seconds", "expected_s")}, **split})
        gpu = str(part["gpu"])
        row.busy[gpu] = round(row.busy.get(gpu, 0.0) + part["seconds"], 3)
        if part["seconds"] > row.longest_seconds:
            row.longest, row.longest_seconds = part["part"], part["seconds"]
    if row.parts and all("cases_s" in p for p in row.parts):
        row.cases_s = round(sum(p["cases_s"] for p in row.parts), 3)
        row.outside_s = round(sum(row.busy.values()) - row.cases_s, 3)


def measure(
    run: str, gpus: list[str], backends: list[str], profile: str, results: Path, timeout: float
) -> GpuRow:
    """One `check --gpus GPUS` in the user's cache directory, its results.json written to `results`."""
    row = GpuRow(
        run=run, gpus=list(gpus), profile=profile, backends=list(backends), cores=os.cpu_count() or 1
    )
    args = harness_child.check_args(cache_dir.root(), profile, backends, "cuda", results.parent / "reports")
    args += ["--gpus", ",".join(gpus), "--results", str(results)]
    ran = harness_child.timed(args, dict(os.environ), timeout)
    row.exit, row.seconds, row.cpu_seconds = ran.exit, ran.seconds, ran.cpu_seconds
    warm = harness_child.warmup(ran.output)
    row.compiled = warm.compiled if warm else 0
    if row.exit != 0:
        row.reason = f"check exit {row.exit}: {ran.output[-harness_child.OUTPUT_TAIL:]}"
    elif not results.is_file():
        row.reason = f"check wrote no {results.name}"
    else:
        try:
            read_parts(row, results)
        except (ValueError, KeyError, TypeError) as e:  # ResultsError is a ValueError
            row.reason = f"cannot read its {results.name}: {e}"
        row.misplanned = misplanned(row)
    return row


def misplanned(row: GpuRow) -> str:
    """Why the row's check measured its plan rather than its GPUs: its longest part took over
    LONGEST_BOUND of the run and over MISPLANNED times the seconds its plan gave it (a backend's cost
    the schedule had wrong, so left unsplit); empty when not."""
    part = next((p for p in row.parts if p["part"] == row.longest), None)
    planned = part.get("expected_s") if part else None
    if not planned or row.longest_seconds < LONGEST_BOUND * row.seconds:
        return ""
    if row.longest_seconds <= MISPLANNED * planned:
        return ""
    took = f"{row.longest_seconds:.0f} s of the run's {row.seconds:.0f} s"
    return f"{row.longest} took {took}, planned {planned:.0f} s"


def judge(one: GpuRow, every: GpuRow) -> None:
    """The `all` row's speedup over the `one` row, and what bounds it."""
    if one.exit != 0 or every.exit != 0 or every.seconds <= 0:
        return
    every.speedup = round(one.seconds / every.seconds, 3)
    every.verdict = "met" if every.speedup >= SPEEDUP_TARGET else "MISSED"
    if one.misplanned or every.misplanned:
        every.verdict = "mis-planned"
    every.speedup_packed = ceiling(one, every, lambda r: sum(r.busy.values()))
    every.speedup_cases = ceiling(one, every, lambda r: r.cases_s)
    bounds = []
    if every.longest_seconds >= LONGEST_BOUND * every.seconds:
        bounds.append("longest part")
    if host_load(every.cpu_seconds, every.seconds, every.cores) >= HOST_BOUND:
        bounds.append("host")
    if one.cases_s and every.cases_s is not None:  # both checks drew the same cases (the gpu profile)
        every.cases_growth = round(every.cases_s / one.cases_s - 1, 3)
        if every.cases_growth >= SLOWER_CASES_BOUND:
            bounds.append("slower cases")
    busy = sum(every.busy.values())
    if every.outside_s is not None and busy > 0 and every.outside_s >= OUTSIDE_BOUND * busy:
        bounds.append("time outside cases")
    every.bound = " and ".join(bounds) or "load"


def ceiling(one: GpuRow, every: GpuRow, work: Callable[[GpuRow], float | None]) -> float | None:
    """The speedup had each check's `work` seconds (its parts' or their cases') filled its slots
    exactly, each command keeping its time outside its parts (its wall less its elapsed: the
    interpreter, the plan, results); None without the numbers."""
    ideal = []
    for row in (one, every):
        seconds = work(row)
        if not seconds or not row.jobs or not row.elapsed:
            return None
        ideal.append(seconds / row.jobs + max(row.seconds - row.elapsed, 0.0))
    return round(ideal[0] / ideal[1], 3)


def host_load(cpu_seconds: float, seconds: float, cores: int) -> float:
    """The share of the machine's `cores` a run of `seconds` kept busy with `cpu_seconds` of CPU."""
    return cpu_seconds / (seconds * cores) if seconds > 0 else 0.0


def scaling(
    device: str,
    visible: list[str],
    backends: list[str] | None,
    timeout: float,
    progress: Callable[[GpuRow], None] | None = None,
    keep: Path | None = None,
) -> list[GpuRow]:
    """The priming check(s), then the check on `visible[0]`, then on every GPU in `visible` (that pair
    again when it was mis-planned); a single `skip` row with its reason off CUDA or with fewer than
    two GPUs. Each check's results.json is copied into `keep` (`<n>-<run>.json`, named in its row)
    when given; its report is not kept."""
    profile, backends = "gpu", list(backends or [])
    say = progress or (lambda row: None)
    if device == "cuda" and len(visible) >= 2:
        with tempfile.TemporaryDirectory(prefix="attn-harness-gpus-") as tmp:
            return _runs(visible, backends, profile, Path(tmp), timeout, say, keep)
    why = f"needs CUDA and at least 2 visible GPUs (device {device}, visible: {','.join(visible) or 'none'})"
    row = GpuRow(run="skip", gpus=list(visible), profile=profile, backends=backends, reason=why)
    say(row)
    return [row]


def _runs(
    visible: list[str],
    backends: list[str],
    profile: str,
    tmp: Path,
    timeout: float,
    say: Callable[[GpuRow], None],
    keep: Path | None,
) -> list[GpuRow]:
    rows: list[GpuRow] = []

    def run(name: str, gpus: list[str]) -> GpuRow:
        results = tmp / f"{len(rows)}-{name}.json"
        row = measure(name, gpus, backends, profile, results, timeout)
        if keep is not None and results.is_file():
            keep.mkdir(parents=True, exist_ok=True)
            row.results = str(shutil.copy(results, keep / results.name))
        if name == "all":
            judge(rows[-1], row)
        rows.append(row)
        say(row)
        return row

    for _ in range(PRIMES):
        prime = run("prime", visible)
        if prime.exit != 0 or not prime.compiled:
            break
    if prime.exit == 0:
        for _ in range(PAIRS):
            run("one", visible[:1])
            if run("all", visible).verdict != "mis-planned":
                break
    return rows
