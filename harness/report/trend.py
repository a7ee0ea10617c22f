"""Tonight's verdicts against the last run's: new failures, fixed ones, still failing.

A nightly check draws new cases each night, so cases rarely repeat; the unit compared is the test
(its backend, device and pytest id, across every share), failing when any of its records is a
fail, error, crash or hang. A test present in one run only is neither new nor fixed: it is counted
apart, so a renamed or newly added test cannot read as a regression.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.report.draws import same_set

FAILING = ("fail", "error", "crash", "hang")


@dataclass(frozen=True, kw_only=True)
class Trend:
    """Test keys ("backend@device test_id") by how their verdict moved between two runs."""

    new_failures: list[str]
    fixed: list[str]
    still_failing: list[str]
    only_tonight: int
    only_last: int
    draws: str = ""  # whether the two runs drew the same set (harness/report/draws.py)

    def line(self) -> str:
        """The one line at the top of the report."""
        head = "REGRESSED" if self.new_failures else "no new failures"
        return (
            f"against the last run: {head}: {len(self.new_failures)} new failures, {len(self.fixed)} "
            f"fixed, {len(self.still_failing)} still failing ({self.only_tonight} tests new tonight, "
            f"{self.only_last} gone)" + (f"; {self.draws}" if self.draws else "")
        )

    def to_dict(self) -> dict:
        return {
            "new_failures": self.new_failures,
            "fixed": self.fixed,
            "still_failing": self.still_failing,
            "only_tonight": self.only_tonight,
            "only_last": self.only_last,
            "draws": self.draws,
            "line": self.line(),
        }


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
