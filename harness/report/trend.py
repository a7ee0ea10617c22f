"""Tonight's run against the last: new failures, fixed ones, still failing, and the cases drawn.

A nightly check draws new cases each night, so the unit compared is the test (its backend, device
and pytest id, across every share), failing when any of its records is in FAILING. A test present in
one run only is neither new nor fixed: it is counted apart, so a renamed or new test cannot read as
a regression. Each run's `draws` fingerprint, a hash over every recorded case (or GraphCase) with
its test, tells whether two runs checked the same set (a PR run draws a fixed set; a nightly, new).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from harness.core.results import GRAPH_CHECK

FAILING = ("fail", "error", "crash", "hang")


def drawn(rec: dict) -> str | None:
    """One record's line: its test, backend, device and case (None: no case)."""
    extra = rec.get("extra") or {}
    target = extra.get("graph_case") if extra.get("check") == GRAPH_CHECK else rec.get("case")
    if not target:
        return None
    test = rec.get("test_id") or rec.get("family", "")
    return f"{rec.get('backend')}@{rec.get('device')} {test} {json.dumps(target, sort_keys=True)}"


def fingerprint(results: list[dict]) -> dict:
    """16 hex digits over the sorted, distinct `drawn` lines, and how many lines."""
    lines = sorted({line for rec in results if (line := drawn(rec)) is not None})
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return {"fingerprint": digest, "cases": len(lines)}


def same_set(tonight: dict, last: dict) -> str:
    """A clause on whether two runs (their `run` objects) drew the same cases."""
    a, b = tonight.get("draws") or {}, last.get("draws") or {}
    if not a or not b:
        return "the draws cannot be compared (a run without a draws fingerprint)"
    if a.get("fingerprint") == b.get("fingerprint"):
        return f"the same {a.get('cases')} cases drawn (fingerprint {a.get('fingerprint')})"
    return (
        f"another set of cases drawn: {a.get('cases')} (fingerprint {a.get('fingerprint')}) against "
        f"{b.get('cases')} ({b.get('fingerprint')})"
    )


@dataclass(frozen=True, kw_only=True)
class Trend:
    """Test keys ("backend@device test_id") by how their verdict moved between two runs."""

    new_failures: list[str]
    fixed: list[str]
    still_failing: list[str]
    only_tonight: int
    only_last: int
    draws: str = ""  # same_set's clause

    def line(self) -> str:
        """The one line at the top of the report."""
        head = "REGRESSED" if self.new_failures else "no new failures"
        return (
            f"against the last run: {head}: {len(self.new_failures)} new failures, {len(self.fixed)} "
            f"fixed, {len(self.still_failing)} still failing ({self.only_tonight} tests new tonight, "
            f"{self.only_last} gone)" + (f"; {self.draws}" if self.draws else "")
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line()}


def verdicts_by_test(data: dict) -> dict[str, bool]:
    """Test key -> whether any of its records failed."""
    failing: dict[str, bool] = {}
    for rec in data["results"]:
        key = f"{rec['backend']}@{rec['device']} {rec.get('test_id') or rec['family']}"
        failing[key] = failing.get(key, False) or rec["status"] in FAILING
    return failing


def compare(tonight: dict, last: dict) -> Trend:
    """How each test's verdict moved from `last` to `tonight` (two results documents)."""
    now, before = verdicts_by_test(tonight), verdicts_by_test(last)
    both = sorted(set(now) & set(before))
    return Trend(
        new_failures=[k for k in both if now[k] and not before[k]],
        fixed=[k for k in both if before[k] and not now[k]],
        still_failing=[k for k in both if now[k] and before[k]],
        only_tonight=len(set(now) - set(before)),
        only_last=len(set(before) - set(now)),
        draws=same_set(tonight["run"], last["run"]),
    )
