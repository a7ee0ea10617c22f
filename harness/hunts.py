"""Running the mutation catalogue: hunt each selected mutant on each device, report a table and JSON.

`python -m harness mutants` (and `make mutants`) calls `run` and `table`. A mutant is hunted in every
family it names, with its check (numeric, or batch invariance for the determinism mutants); a row
says whether it was caught, after how many examples and seconds, and the size of the shrunk case.
One failing hunt never hides the others: an exception becomes an `error` row. The run passes when
no row survived or errored (a skip, with its reason, is neither).
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.batch import kv_len
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.mutants import Mutant, catalogue, hunt
from harness.search import profiles

DEVICE_PROFILE = {"cpu": "ci", "cuda": "gpu"}


@dataclass(kw_only=True)
class Row:
    mutant: str
    backend: str
    device: str
    family: str
    check: str
    method: str
    bug: str
    outcome: str  # caught, survived, skip, error
    status: str = ""  # when caught: the status of the shrunk case (fail, crash, hang)
    examples: int = 0
    seconds: float = 0.0  # to the first failure
    hunt_seconds: float = 0.0  # the whole hunt, shrinking included
    size: str = ""
    shrunk: dict | None = None
    reason: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def case_size(case: Case | GraphCase) -> str:
    """requests / query tokens / keys of a case, e.g. 'B=1 q=3 kv=12'; of a replay sequence, each
    batch's joined by ' | '."""
    if isinstance(case, GraphCase):
        return " | ".join(case_size(c) for c in case.batches)
    q = sum(r.extend_len for r in case.requests)
    kv = sum(kv_len(case, i) for i in range(case.batch_size))
    return f"B={case.batch_size} q={q} kv={kv}"


def exact_pool_variants(mutants: list[Mutant]) -> list[Mutant]:
    """For each hybrid-pool mutant of a backend with no exact-pool mutant of its own, the same bug on
    an exact-size SWA pool: the untranslated read is then out of bounds (a CRASH where the memory is
    unmapped; on a GPU it may also land on other live memory and read as wrong values)."""
    has_exact = {m.backend for m in mutants if (m.force or {}).get("swa_pool_exact")}
    out = []
    for m in mutants:
        force = m.force or {}
        if force.get("hybrid_swa_pool") and m.backend not in has_exact:
            out.append(
                dataclasses.replace(
                    m,
                    name=f"{m.name}+exact_pool",
                    bug=f"{m.bug} (exact-size SWA pool: the read is out of bounds)",
                    force={**force, "swa_pool_exact": True},
                )
            )
    return out


def select(
    mutants: list[Mutant],
    names: list[str] | None = None,
    backends: list[str] | None = None,
    families: list[str] | None = None,
    first_family: bool = False,
) -> list[tuple[Mutant, str]]:
    """(mutant, family) pairs: by mutant name (exact, or a substring), backend and family; with
    `first_family`, only the first family each mutant names (what CI hunts)."""
    out = []
    for m in mutants:
        if names and not any(n == m.name or n in m.name for n in names):
            continue
        if backends and m.backend not in backends:
            continue
        fams = [f for f in m.families if not families or f in families]
        out += [(m, f) for f in (fams[:1] if first_family else fams)]
    return out


def _skip_reason(mutant: Mutant, device: str) -> str | None:
    if device == "cpu" and mutant.device == "cuda":
        return "a GPU mutant: run with --device cuda on a GPU machine"
    backend = mutant.make()
    return backend.available(device)


def hunt_row(
    mutant: Mutant,
    family: str,
    device: str,
    max_examples: int,
    shrink_runs: int | None,
    invariance_shrink_runs: int | None = None,
) -> Row:
    """One hunt as a report row; never raises. A determinism mutant shrinks for at most
    `invariance_shrink_runs` new cases when given (each costs a whole invariance check)."""
    base = dict(
        mutant=mutant.name,
        backend=mutant.backend,
        device=device,
        family=family,
        check=mutant.check,
        method=mutant.method,
        bug=mutant.bug,
    )
    start = time.perf_counter()
    try:
        why = _skip_reason(mutant, device)
        if why:
            return Row(**base, outcome="skip", reason=why)
        runs = shrink_runs
        if mutant.check == "invariance" and invariance_shrink_runs is not None:
            runs = invariance_shrink_runs
        d = hunt(mutant, family, max_examples, device, runs)
    except Exception as e:
        return Row(
            **base,
            outcome="error",
            hunt_seconds=time.perf_counter() - start,
            reason=f"{type(e).__name__}: {e}\n{traceback.format_exc()}",
        )
    took = time.perf_counter() - start
    if d.skipped:
        return Row(**base, outcome="skip", reason=d.skipped)
    if not d.caught:
        return Row(**base, outcome="survived", examples=d.examples, hunt_seconds=took, reason=d.reason)
    return Row(
        **base,
        outcome="caught",
        status=d.status,
        examples=d.examples,
        seconds=d.seconds,
        hunt_seconds=took,
        size=case_size(d.shrunk),
        shrunk=d.shrunk.to_dict(),
        reason=d.reason,
    )


def run(
    pairs: list[tuple[Mutant, str]],
    devices: list[str],
    max_examples: int = 200,
    shrink_runs: int | None = None,
    profile: str | None = None,
    progress: Callable[[Row], None] | None = None,
    invariance_shrink_runs: int | None = None,
) -> list[Row]:
    """Hunt every (mutant, family) on every device, each device under its profile (ci on the CPU,
    gpu on CUDA) unless `profile` names one."""
    rows = []
    previous = profiles.current()
    try:
        for device in devices:
            profiles.load(profile or DEVICE_PROFILE[device])
            for mutant, family in pairs:
                row = hunt_row(mutant, family, device, max_examples, shrink_runs, invariance_shrink_runs)
                rows.append(row)
                if progress:
                    progress(row)
    finally:
        profiles.load(previous)
    return rows


def passed(rows: list[Row]) -> bool:
    return not any(r.outcome in ("survived", "error") for r in rows)


COLUMNS = ("mutant", "device", "family", "check", "result", "examples", "seconds", "shrunk case")


def _cells(r: Row) -> tuple[str, ...]:
    result = {"caught": f"CAUGHT ({r.status})", "survived": "SURVIVED", "skip": "skip", "error": "ERROR"}
    caught = r.outcome == "caught"
    return (
        r.mutant,
        r.device,
        r.family,
        r.check,
        result[r.outcome],
        str(r.examples) if caught else "-",
        f"{r.seconds:.2f}" if caught else "-",
        r.size or "-",
    )


def table(rows: list[Row]) -> str:
    """The report: one line per hunt, then the reason of every row that was not caught."""
    cells = [COLUMNS] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    notes = [
        f"  {r.mutant} on {r.device}/{r.family}: {(r.reason.splitlines() or [''])[0]}"
        for r in rows
        if r.outcome != "caught"
    ]
    counts = {o: sum(r.outcome == o for r in rows) for o in ("caught", "survived", "skip", "error")}
    lines.append("")
    lines.append(", ".join(f"{n} {o}" for o, n in counts.items()))
    if notes:
        lines += ["not caught:"] + notes
    return "\n".join(lines)


def write_json(path: str, rows: list[Row], meta: dict) -> None:
    with open(path, "w") as f:
        data = {"schema": 1, "meta": meta, "passed": passed(rows), "rows": [r.to_dict() for r in rows]}
        json.dump(data, f, indent=1)


def every_mutant(exact_pool: bool = False) -> list[Mutant]:
    """The catalogue (mutants that run anywhere first, then the GPU-only ones, whose first hunts may
    compile kernels), plus the exact-pool variants when asked."""
    mutants = sorted(catalogue(), key=lambda m: m.device == "cuda")
    return mutants + (exact_pool_variants(mutants) if exact_pool else [])


def hunt_all(
    pairs: list,
    devices: list[str],
    max_examples: int,
    shrink: tuple[int | None, int | None],
    profile: str | None,
    json_path: str | None,
) -> list[Row]:
    """`run` with a line said as each hunt ends; with `json_path`, the rows so far (with the
    environment) rewritten there after every hunt, so a run stopped early keeps what it found.
    `shrink`: the new cases a shrink may try, for the numeric and for the determinism mutants."""
    import time

    from harness.report.environment import collect

    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **collect()}
    done: list[Row] = []

    def progress(row: Row) -> None:
        where = f"{row.device}/{row.family}"
        print(f"  {row.outcome:8} {row.mutant} on {where} ({row.hunt_seconds:.1f}s)", flush=True)
        done.append(row)
        if json_path:
            write_json(json_path, done, meta)

    return run(pairs, devices, max_examples, shrink[0], profile, progress, shrink[1])


def listing(pairs: list) -> list[str]:
    """`mutants --list`: each selected mutant once, with its check, method, families and bug."""
    chosen = {m.name: m for m, _ in pairs}.values()
    return [f"{m.name:44} {m.check:10} {m.method:24} {', '.join(m.families)}\n    {m.bug}" for m in chosen]
