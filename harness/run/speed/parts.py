"""A parallel check's parts: planned from what earlier checks measured, measured for the next.

`plan_check` gives the plan (harness/run/speed/schedule.py) of a check's backends over its job
slots and GPUs, from each backend's expected cost (costs.py, kept in the cache directory beside
the compile caches a CI job restores); `PlannedCheck.keep` saves what the parts took and, for the
variant shards (variant_shards.py), what each variant's cases took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.run import cache_dir
from harness.run.speed import costs, schedule, variant_shards


class FinishedPart(Protocol):
    """What `keep` reads of a part that ran (harness/run/parallel.py's Part)."""

    backend: str
    code: int | None
    seconds: float


@dataclass(kw_only=True)
class PlannedCheck:
    """The plan, its description (one line a part) and where its costs are kept."""

    plan: schedule.Plan
    lines: list[str]
    kept: Path
    selection: str
    names: list[str]
    startups: dict[str, float]

    def keep(self, parts: Sequence[FinishedPart], records: list[dict], profile: str) -> None:
        """Save the parts' seconds (the next plan's costs) and each backend's variant weights."""
        from harness import backends

        ran = [(p.backend, p.code, p.seconds) for p in parts]
        costs.save(self.kept, self.selection, costs.measured(ran, self.startups), costs.shard_means(ran))
        for name in self.names:  # how the next run's shards deal each backend's variants
            variant_shards.save_measured(backends.load(name), profile, records, self.kept)


def plan_check(
    names: list[str],
    jobs: int,
    gpus: list[str],
    selection: str,
    unavailable: Callable[[str], str | None],
) -> PlannedCheck:
    """The plan of a check of `names` (a selection key: profile, markers, -k) in `jobs` slots over
    `gpus`; `unavailable(name)` says why a backend cannot run here (its part then only skips)."""
    kept = cache_dir.root()  # the costs travel with the compile caches a CI job restores
    kept.mkdir(parents=True, exist_ok=True)
    expected, sources, startups = costs.expected(names, selection, kept, unavailable)
    plan = schedule.plan(expected, jobs, gpus, startups)
    return PlannedCheck(
        plan=plan,
        lines=schedule.describe(plan, sources),
        kept=kept,
        selection=selection,
        names=names,
        startups=startups,
    )
