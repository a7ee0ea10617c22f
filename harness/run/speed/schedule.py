"""The check's schedule: how many pytest processes each backend gets, which starts first, on which GPU.

A pure function of each backend's expected cost (seconds as one process; harness/run/speed/costs.py
finds them), the job slots and the GPUs. The parts are started longest first and each takes the
slot that frees first (longest-processing-time-first list scheduling, within 4/3 of the best wall
time for the given parts). The ideal wall time is the total cost over the slots (the share); a
backend longer than the share bounds the wall time, so it is split into shards (pytest's
`--harness-shard I/N`), as many as make the expected wall time shortest: every process pays its
backend's fixed cost (STARTUP_S unless costs.py learned it) whatever its share of the work, so more
shards are not always better.
Slot s is pinned to GPU s mod the GPU count, so the first parts (the longest) go round the GPUs.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

# A part's fixed cost: the interpreter, imports and collection (a part that skips every test pays
# little more), and, in a part that checks, its isolation worker's start.
STARTUP_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One pytest process of the plan: a backend, or shard `shard` of `shards` of it."""

    backend: str
    shard: int
    shards: int
    seconds: float  # expected
    slot: int  # the slot the plan expects it to take (the runner takes whichever frees first)
    start: float  # expected start, seconds after the run's

    @property
    def name(self) -> str:
        """How messages name the part: the backend, and its shard when split (`fa4[0/2]`)."""
        return self.backend if self.shards == 1 else f"{self.backend}[{self.shard}/{self.shards}]"


@dataclass(frozen=True)
class Plan:
    parts: tuple[Planned, ...]  # in start order
    slot_gpus: tuple[str | None, ...]  # the GPU of each slot (None: no GPU given, the CPU)
    share: float  # the ideal seconds per slot: total cost / jobs
    makespan: float  # the expected wall time

    @property
    def jobs(self) -> int:
        return len(self.slot_gpus)

    def gpu(self, part: Planned) -> str | None:
        """The GPU the plan expects `part` to run on."""
        return self.slot_gpus[part.slot]


def _pieces(costs: dict[str, float], shards: dict[str, int], startup: Mapping[str, float]) -> list[tuple]:
    """(backend, shard, shards, expected seconds) of every part, longest first; ties keep `costs`'
    order, a backend's shards together. A shard costs its backend's startup and its share of the rest."""
    out = []
    for backend, cost in costs.items():
        n, fixed = shards[backend], startup[backend]
        each = cost if n == 1 else fixed + (cost - fixed) / n
        out += [(backend, i, n, each) for i in range(n)]
    return sorted(out, key=lambda p: -p[3])  # stable


def _lpt(pieces: list[tuple], jobs: int) -> list[Planned]:
    """Each piece, in order, into the slot that frees first (the lowest of those freeing together)."""
    free = [(0.0, s) for s in range(max(1, min(jobs, len(pieces))))]
    parts = []
    for backend, shard, shards, seconds in pieces:
        start, slot = heapq.heappop(free)
        parts.append(
            Planned(backend=backend, shard=shard, shards=shards, seconds=seconds, slot=slot, start=start)
        )
        heapq.heappush(free, (start + seconds, slot))
    return parts


def _makespan(parts: list[Planned]) -> float:
    return max((p.start + p.seconds for p in parts), default=0.0)


def plan(
    costs: dict[str, float], jobs: int, gpus: list[str], startup: float | Mapping[str, float] = STARTUP_S
) -> Plan:
    """The parts of every backend in `costs` (expected seconds as one process), started longest
    first over min(jobs, parts) slots spread round-robin over `gpus` (none: the slots have no GPU).

    While the longest part is longer than the share (its backend alone bounds the wall time), its
    backend is split into the number of shards, up to `jobs`, that gives the shortest expected wall
    time (the fewest of equals); it stops when that does not shorten it. Each shard pays `startup`
    (one number, or per backend: STARTUP_S for a backend it lacks)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    bad = {name: c for name, c in costs.items() if not c >= 0}
    if bad:
        raise ValueError(f"a backend's cost must be a number of seconds >= 0, got {bad}")
    if isinstance(startup, Mapping):
        fixed = {name: startup.get(name, STARTUP_S) for name in costs}
    else:
        fixed = dict.fromkeys(costs, startup)
    share = sum(costs.values()) / jobs
    shards = dict.fromkeys(costs, 1)
    parts = _lpt(_pieces(costs, shards, fixed), jobs)
    while parts and parts[0].seconds > share and shards[parts[0].backend] < jobs:
        longest = parts[0].backend
        tries = []
        for n in range(shards[longest] + 1, jobs + 1):
            tried = _lpt(_pieces(costs, {**shards, longest: n}, fixed), jobs)
            tries.append((_makespan(tried), n, tried))
        best, n, tried = min(tries, key=lambda t: (t[0], t[1]))
        if best >= _makespan(parts) - 1e-9:
            break
        shards[longest], parts = n, tried
    slot_gpus = tuple(gpus[s % len(gpus)] if gpus else None for s in range(max(1, min(jobs, len(parts)))))
    return Plan(tuple(parts), slot_gpus, share, _makespan(parts))


def describe(plan: Plan, sources: dict[str, str]) -> list[str]:
    """The plan as lines: each backend's shards, expected seconds and where its cost came from."""
    lines = []
    for p in plan.parts:
        if p.shard == 0:
            split = f"{p.shards} shards x " if p.shards > 1 else ""
            lines.append(f"  {p.backend:<22} {split}{p.seconds:.0f} s ({sources.get(p.backend, 'given')})")
    gpus = [g for g in dict.fromkeys(plan.slot_gpus) if g is not None]
    where = f" over GPU {','.join(gpus)}" if gpus else ""
    lines.append(
        f"  {len(plan.parts)} processes, {plan.jobs} at once{where}, longest first: expected wall "
        f"{plan.makespan:.0f} s (ideal {plan.share:.0f} s)"
    )
    return lines
