"""The bench's phases section: where each check's wall time goes (harness/core/timing.py), and how
many torch operations and host syncs each phase costs per case (opcount.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.backends.base import Backend
from harness.checks.numeric import check_case
from harness.core import timing
from harness.core.case import Case
from harness.tools.bench import opcount

# Phases in the order a check runs them; `other` is the rest of the wall time (availability and
# support checks, the result record). "crossref" is the CPU-only reference-vs-reference check.
PHASES = ("build", "plan", "kernel", "reference", "compare", "crossref")


@dataclass(kw_only=True)
class PhaseRow:
    backend: str
    device: str
    checked: int
    wall_seconds: float
    ms_per_case: float
    fractions: dict[str, float]  # PHASES + "other", of the wall time; they sum to 1
    overhead: float  # 1 - kernel - reference: everything the harness adds around them
    ops_per_case: dict[str, float]  # aten operations per checked case, per phase (and other)
    syncs_per_case: dict[str, float]  # host reads of tensor values per checked case, per phase (and other)
    not_counted: str = ""  # why there are no counts: a case ended otherwise while counted


def phase_row(backend: Backend, device: str, cases: list[Case]) -> PhaseRow:
    """One recorded pass: each phase's exclusive time over the summed wall time of the checks; then
    one counted pass (untimed: counting slows every operation down)."""
    wall = 0.0
    statuses = []
    with timing.recording() as rec:
        for c in cases:
            start = time.perf_counter()
            statuses.append(check_case(backend, c, device).status)
            wall += time.perf_counter() - start
    checked = len(statuses) - statuses.count("skip")
    fractions = {p: (rec.seconds.get(p, 0.0) / wall if wall > 0 else 0.0) for p in PHASES}
    fractions["other"] = max(0.0, 1.0 - sum(fractions.values()))
    ops, syncs, why = opcount.count_cases(backend, device, cases, statuses)
    return PhaseRow(
        backend=backend.name,
        device=device,
        checked=checked,
        wall_seconds=wall,
        ms_per_case=1000 * wall / max(checked, 1),
        fractions=fractions,
        overhead=max(0.0, 1.0 - fractions["kernel"] - fractions["reference"]),
        ops_per_case={p: ops.get(p, 0.0) for p in (*PHASES, opcount.OTHER)} if not why else {},
        syncs_per_case={p: syncs.get(p, 0.0) for p in (*PHASES, opcount.OTHER)} if not why else {},
        not_counted=why,
    )
