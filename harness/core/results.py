"""One checked case as a record, a whole test's record, and the summary table printed at the end of a run."""

from __future__ import annotations

import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from harness.core.case import Case, case_features
from harness.core.compare import Verdict
from harness.core.graph_case import GraphCase
from harness.core.modes import family_of
from harness.core.vocab import CHECKED, STATUSES


def repro_command(case: Case | GraphCase, backend: str, device: str) -> str:
    """A shell command that replays the case exactly (the Case JSON is inline; a GraphCase's too)."""
    return f"python -m harness repro {shlex.quote(case.to_json())} --backend {backend} --device {device}"


GRAPH_CHECK = "graph"  # extra.check of a CUDA-graph replay result (harness/checks/replay.py); its family


@dataclass(kw_only=True)
class CaseResult:
    status: str
    backend: str
    device: str
    case: Case
    verdict: Verdict | None = None
    reason: str = ""
    seconds: float = 0.0
    test_id: str = ""
    extra: dict = field(default_factory=dict)
    error_map: dict | None = None  # failures: harness.checks.numeric.error_map
    probe: dict | None = None  # failures: harness.checks.probe.ProbeResult.to_dict()

    @property
    def family(self) -> str:
        """The case's suite family; a replay result's is GRAPH_CHECK, so replays get their own rows."""
        if self.extra.get("check") == GRAPH_CHECK:
            return GRAPH_CHECK
        return family_of(self.case.mode, [r.prefix_len for r in self.case.requests])

    @property
    def repro_target(self) -> Case | GraphCase:
        """What the repro command replays: a replay result's whole GraphCase, else the case."""
        if self.extra.get("check") == GRAPH_CHECK:
            return GraphCase.from_dict(self.extra["graph_case"])
        return self.case

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "backend": self.backend,
            "device": self.device,
            "family": self.family,
            "mode": str(self.case.mode),
            "features": case_features(self.case),
            "case": self.case.to_dict(),
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "reason": self.reason,
            "seconds": round(self.seconds, 6),
            "test_id": self.test_id,
            "repro": repro_command(self.repro_target, self.backend, self.device),
            "error_map": self.error_map,
            "probe": self.probe,
            **({"extra": self.extra} if self.extra else {}),
        }

    def failure_text(self) -> str:
        """What a failing test prints: the verdict and the repro command, which holds the Case (as JSON)
        once; results.json and the report keep it indented."""
        return (
            f"{self.backend} on {self.device}: {self.status.upper()}: {self.reason}\n"
            f"Replay:\n  {repro_command(self.repro_target, self.backend, self.device)}"
        )


def test_record(
    status: str,
    backend: str,
    device: str,
    family: str,
    reason: str,
    test_id: str,
    features: list[str] | None = None,
    **fields: object,
) -> dict:
    """A results.json record of a whole test, not of one case: a test skipped here, a harness error
    (its traceback in extra), a search that the backend mostly refused, a model-level check."""
    return {
        "status": status,
        "backend": backend,
        "device": device,
        "family": family,
        "mode": family,
        "features": features or [],
        "case": None,
        "verdict": None,
        "reason": reason,
        "seconds": 0.0,
        "test_id": test_id,
        "repro": None,
        "error_map": None,
        "probe": None,
        **fields,
    }


REFUSALS_CHECK = "refusals"  # extra.check of the `fail` record of a search the backend mostly refused


def is_checked(record: dict) -> bool:
    """Whether a record is of a case (or model) the backend ran: a CHECKED status, and not the verdict
    on a search's refusals."""
    return record["status"] in CHECKED and (record.get("extra") or {}).get("check") != REFUSALS_CHECK


SUMMARY_COLUMNS = ("pass", "xfail", "fail", "error", "crash", "hang", "checked", "refused", "skip")


def summary_table(results: list[dict]) -> str:
    """Per (backend, family): each status's count, the cases checked and refused (turned down by
    supports()) and the worst error/budget ratio. Rows that only skipped, for one reason, are one line
    per (device, reason), as the report collapses them; counts are in records, as in the report."""
    rows = _summary_rows(results)
    skipped = _skip_only(rows)
    collapsed = {key for keys in skipped.values() for key in keys}
    shown = {key: row for key, row in rows.items() if key not in collapsed}
    name_width = max([len("backend"), *(len(b) for b, _ in shown)])
    family_width = max([len("family"), *(len(f) for _, f in shown)])
    columns = " ".join(f"{c:>7}" for c in SUMMARY_COLUMNS)
    head = f"{'backend':<{name_width}} {'family':<{family_width}} {columns} {'worst':>7}"
    lines = [head, "-" * len(head)] if shown else []  # every row skipped: only the lines below
    notes = []
    for (b, fam), row in sorted(shown.items()):
        counts = " ".join(f"{row[c]:>7}" for c in SUMMARY_COLUMNS)
        worst = "-" if row["worst"] is None else f"{row['worst']:.2f}"  # no verdict: nothing was compared
        lines.append(f"{b:<{name_width}} {fam:<{family_width}} {counts} {worst:>7}")
        if row["refused"]:
            why, n = row["why"].most_common(1)[0]
            drawn = row["checked"] + row["refused"]
            refused = row["refused"]
            notes.append(f"  {b} {fam}: refused {refused} of {drawn} drawn cases; most often ({n}): {why}")
    for (device, why), keys in sorted(skipped.items()):
        names = sorted({b.rsplit("@", 1)[0] for b, _ in keys})
        tests = sum(rows[k]["skip"] for k in keys)
        lines.append(f"skipped only ({len(keys)} rows, {tests} records on {device}, {len(names)} backends: "
                     f"{', '.join(names)}): {why}")
    total = Counter(r["status"] for r in results)
    lines.append(f"{len(results)} records: " + ", ".join(f"{total[s]} {s}" for s in STATUSES if total[s]))
    if notes:
        lines += ["refusals (the backend's supports() turned the drawn case down):", *notes]
    return "\n".join(lines)


def _summary_rows(results: list[dict]) -> dict[tuple[str, str], dict]:
    """summary_table's rows: per (backend@device, family) each status's count, `checked`, the worst
    ratio, and the refusal and skip reasons counted."""
    rows: dict[tuple[str, str], dict] = defaultdict(
        lambda: dict.fromkeys(STATUSES, 0)
        | {"checked": 0, "worst": None, "why": Counter(), "skips": Counter()}
    )
    for res in results:
        row = rows[(f"{res['backend']}@{res['device']}", res["family"])]
        row[res["status"]] += 1
        row["checked"] += is_checked(res)
        if res["status"] == "refused":
            row["why"][res.get("reason") or "(no reason given)"] += 1
        if res["status"] == "skip":
            row["skips"][res.get("reason") or "(no reason given)"] += 1
        v = res.get("verdict")
        if v and v.get("ratio") is not None and res["status"] in ("pass", "xfail", "fail"):
            row["worst"] = max(row["worst"] or 0.0, float(v["ratio"]))
    return rows


def _skip_only(rows: dict[tuple[str, str], dict]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """The rows whose every record is a skip for one reason, by (device, reason)."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, row in rows.items():
        if row["skip"] == sum(row[s] for s in STATUSES) and len(row["skips"]) == 1:
            out.setdefault((key[0].rsplit("@", 1)[-1], next(iter(row["skips"]))), []).append(key)
    return out
