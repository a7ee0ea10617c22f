"""Record mode: the suite's searches draw their cases as usual but check none of them.

With ATTN_HARNESS_RECORD=FILE set (the settings' `record`, harness/run/speed/settings.py), every
case a search hands to its check (isolation.Search) is appended to FILE as one JSON line (backend,
family, check kind, device, the Case) and answered with a pass, without building a batch, running
the backend or computing a reference; a case the backend refuses gets the check's own skip, so
hypothesis sees what a passing run shows it. A graph replay search records its GraphCases the same
way (kind `graph`), refused as the replay check refuses them. The warm-up uses it to learn which
kernels a check will launch (harness/run/speed/warmup/libraries.py). A run in record mode says so
and writes no results.json or report (harness/run/pytest_plugin.py): its passes are not checks.
Only the variable turns it on.
"""

from __future__ import annotations

import json

from harness.backends.base import Backend
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.results import CaseResult
from harness.run.speed import settings

REASON = "record mode: drawn, not checked"


def path() -> str | None:
    """The file cases are recorded to, or None when record mode is off."""
    return settings.current().record


def unchecked(backend: Backend, case: Case | GraphCase, device: str, reason: str) -> CaseResult:
    """A drawn case answered without running anything: the check's own skip when the backend cannot
    run it here (so hypothesis sees what a checking run shows it), else a pass saying `reason`."""
    shown = case  # the result's Case: a replay check's is its first batch (harness/checks/replay.py)
    if isinstance(case, GraphCase):
        from harness.checks.replay import why_not

        why, shown = why_not(backend, case, device), case.layer
    else:
        why = backend.available(device) or backend.supports(case)
    if why:
        return CaseResult("skip", backend.name, device, shown, reason=why)
    return CaseResult("pass", backend.name, device, shown, reason=reason)


def record(backend: Backend, case: Case | GraphCase, device: str, kind: str, family: str) -> CaseResult:
    """Append one drawn case to the record file; a pass (or the check's skip, when the backend cannot
    run the case here) with nothing run."""
    res = unchecked(backend, case, device, REASON)
    if res.status == "pass":
        line = dict(backend=backend.name, family=family, kind=kind, device=device, case=case.to_dict())
        with open(path(), "a") as f:  # type: ignore[arg-type] - only called in record mode
            f.write(json.dumps(line) + "\n")
    return res


def read(file: str) -> list[dict]:
    """The recorded lines of `file`, each with its Case (a GraphCase for kind `graph`) parsed (`case`)."""
    out = []
    with open(file) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                kind = GraphCase if d["kind"] == "graph" else Case
                out.append(d | {"case": kind.from_dict(d["case"])})
    return out
