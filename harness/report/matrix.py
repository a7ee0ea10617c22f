"""The summary matrix: (backend, device, family) x feature -> status counts and worst err/budget.

A case counts in the "all" column, in the column of each feature it has, and in "none" when it has
no feature at all. A skipped test that never drew a case counts under the features its test id
promises (the window for `-swa` tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.core.modes import FAMILIES, FAMILY_MODE
from harness.core.results import is_checked
from harness.core.vocab import CASE_FEATURES, PROBLEMS, STATUSES

COLUMNS = ("all", "none") + CASE_FEATURES
CLOSE = 0.5  # a passing cell whose worst ratio exceeds this is shown close


@dataclass
class Cell:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    worst: float | None = None  # worst err/budget of the checked cases (inf: a NaN output)
    checked: int = 0  # results.is_checked: cases (or models) the backend ran
    skip_reasons: set[str] = field(default_factory=set)  # of its skip records

    def add(self, record: dict) -> None:
        self.counts[record["status"]] += 1
        if record["status"] == "skip":
            self.skip_reasons.add(record.get("reason") or "(no reason given)")
        self.checked += is_checked(record)
        verdict = record.get("verdict")
        if record["status"] in ("pass", "fail") and verdict and verdict.get("ratio") is not None:
            ratio = float(verdict["ratio"])
            ratio = math.inf if math.isnan(ratio) else ratio
            self.worst = ratio if self.worst is None else max(self.worst, ratio)

    @property
    def state(self) -> str:
        """bad (a PROBLEMS status), close, ok, skipped (skips or refusals only) or empty."""
        c = self.counts
        if any(c[s] for s in PROBLEMS):
            return "bad"
        if c["pass"]:
            return "close" if (self.worst or 0.0) > CLOSE else "ok"
        return "skipped" if c["skip"] or c["refused"] else "empty"


Row = tuple[str, str, str]  # backend, device, family


def columns_of(record: dict) -> list[str]:
    feats = [f for f in record.get("features") or [] if f in CASE_FEATURES]
    return ["all"] + (feats or ["none"])


def family_label(family: str) -> str:
    mode = FAMILY_MODE.get(family)
    return f"{family} ({mode})" if mode is not None else family


def build(results: list[dict]) -> dict[Row, dict[str, Cell]]:
    """Rows sorted by backend, device, then the suite's family order."""
    rows: dict[Row, dict[str, Cell]] = {}
    for rec in results:
        key = (rec["backend"], rec["device"], rec["family"])
        row = rows.setdefault(key, {c: Cell() for c in COLUMNS})
        for col in columns_of(rec):
            row[col].add(rec)
    order = {f: i for i, f in enumerate(FAMILIES)}
    return dict(sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 99), kv[0][2])))


def collapse_skipped(
    rows: dict[Row, dict[str, Cell]],
) -> tuple[dict[Row, dict[str, Cell]], dict[tuple[str, str], list[Row]]]:
    """Split off the rows that only skipped, for one reason shared with other rows on their device:
    (rows shown as they are, (device, reason) -> rows)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for key, cells in rows.items():
        reasons = cells["all"].skip_reasons
        only_skips = cells["all"].counts["skip"] == sum(cells["all"].counts.values())
        if only_skips and len(reasons) == 1:
            groups.setdefault((key[1], next(iter(reasons))), []).append(key)
    collapsed = {k: v for k, v in groups.items() if len(v) > 1}
    gone = {key for keys in collapsed.values() for key in keys}
    return {k: v for k, v in rows.items() if k not in gone}, collapsed


def totals(results: list[dict]) -> dict[str, int]:
    """Records per status, and `checked`: those of a case (or model) the backend ran."""
    out = dict.fromkeys(STATUSES, 0) | {"checked": 0}
    for rec in results:
        out[rec["status"]] += 1
        out["checked"] += is_checked(rec)
    return out
