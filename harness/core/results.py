"""One checked case as a record, and the per-mode summary table printed at the end of a run."""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass, field

from harness.core.case import Case
from harness.core.compare import Verdict
from harness.core.modes import family_of
from harness.core.vocab import STATUSES, case_features


def repro_command(case: Case, backend: str, device: str) -> str:
    """A shell command that replays the case exactly (the Case JSON is inline)."""
    return f"python -m harness repro {shlex.quote(case.to_json())} --backend {backend} --device {device}"


@dataclass
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
    error_map: dict | None = None  # failures: harness.checks.errormap.error_map
    probe: dict | None = None  # failures: harness.checks.probe.ProbeResult.to_dict()

    @property
    def family(self) -> str:
        return family_of(self.case.mode, [r.prefix_len for r in self.case.requests])

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
            "repro": repro_command(self.case, self.backend, self.device),
            "error_map": self.error_map,
            "probe": self.probe,
            **({"extra": self.extra} if self.extra else {}),
        }

    def failure_text(self) -> str:
        """What a failing test prints: the verdict, the Case as JSON and the repro command."""
        return (
            f"{self.backend} on {self.device}: {self.status.upper()}: {self.reason}\n"
            f"Case:\n{self.case.to_json(indent=1)}\n"
            f"Replay:\n  {repro_command(self.case, self.backend, self.device)}"
        )


def summary_table(results: list[dict]) -> str:
    """Per (backend, family) counts and the worst error/budget ratio, as a text table."""
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {s: 0 for s in STATUSES} | {"worst": 0.0})
    for res in results:
        row = rows[(f"{res['backend']}@{res['device']}", res["family"])]
        row[res["status"]] += 1
        v = res.get("verdict")
        if v and v.get("ratio") is not None and res["status"] in ("pass", "fail"):
            row["worst"] = max(row["worst"], float(v["ratio"]))
    counts = " ".join(f"{s:>5}" for s in STATUSES)
    head = f"{'backend':<28} {'family':<16} {counts} {'worst':>7}"
    lines = [head, "-" * len(head)]
    for (b, fam), row in sorted(rows.items()):
        lines.append(
            f"{b:<28} {fam:<16} {row['pass']:>5} {row['fail']:>5} {row['skip']:>5} "
            f"{row['crash']:>5} {row['hang']:>5} {row['worst']:>7.2f}"
        )
    return "\n".join(lines)
