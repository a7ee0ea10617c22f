"""The progress line of a check run: records so far out of those expected, tests done, failures,
time elapsed and an estimate of the time left.

Pure bookkeeping and formatting; the pytest plugin decides when to print it (at most every few
seconds while a test runs, and when a test ends). A test is expected to run its profile's
max_examples; one that stops early (a failure, a small search space) counts as complete when it
ends, so the estimate is of the work left, not a promise. The count is of records, the unit of the
summary table and the report: a checked or refused case each, and one for a test that ends without
one (skipped or failed as a whole); the examples a shrinking search tries are dropped once it ends.

The estimate is the rate since the first record, so the fixed start (imports, collection, the
isolation worker's start) is not divided by the sliver of work done after it, and none is given
until ESTIMATE_AFTER of the run is done since then and a test has ended: an estimate from the first
example of a run said hours for a run of minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BAR = 20
RUNNING_CAP = 0.95  # a running test counts as at most this much done: shrinking may run past max_examples
ESTIMATE_AFTER = 0.05  # of the run done since the first record before the time left is estimated


class Progress:
    def __init__(
        self, total_tests: int = 0, clock: Callable[[], float] = time.monotonic, examples_per_test: int = 0
    ) -> None:
        self.clock = clock
        self.start = clock()
        self.last_print = -1e9
        self.total_tests = total_tests
        self.examples_per_test = examples_per_test  # the profile's max_examples (0: unknown)
        self.tests_done = 0
        self.cases = 0
        self.current_cases = 0  # examples of the running test
        self.finished_cases = 0  # examples of the tests done
        self.skipped = 0
        self.failing: set[str] = set()  # test ids with a failing, crashing or hanging case
        self.current = ""
        self.first: tuple[float, float] | None = None  # the clock and the fraction done at the first record

    def case(self, status: str, test_id: str) -> None:
        """One checked (or skipped) example of test `test_id`."""
        if self.first is None:
            self.first = (self.clock(), self.fraction())
        if test_id != self.current:
            self.current, self.current_cases = test_id, 0
        self.cases += 1
        self.current_cases += 1
        if status in ("skip", "refused"):  # refused: a drawn case the backend's supports() turned down
            self.skipped += 1
        elif status != "pass":
            self.failing.add(test_id)

    def test_done(self, test_id: str, failed: bool, records: int | None = None) -> None:
        """Test `test_id` ended, having left `records` records (None: one per example counted)."""
        self.tests_done += 1
        if records is not None:
            self.cases = self.finished_cases + records
        self.finished_cases, self.current_cases = self.cases, 0
        if failed:
            self.failing.add(test_id)

    def due(self, interval: float) -> bool:
        """True (and the clock is reset) if `interval` seconds passed since the last printed line."""
        now = self.clock()
        if now - self.last_print < interval:
            return False
        self.last_print = now
        return True

    def fraction(self) -> float:
        """The share of the run done: finished tests, and the running test's examples so far."""
        total = max(self.total_tests, self.tests_done)
        if not total:
            return 0.0
        running = 0.0
        if self.examples_per_test and self.tests_done < total:
            running = min(self.current_cases / self.examples_per_test, RUNNING_CAP)
        return (self.tests_done + running) / total

    def expected(self) -> int:
        """Examples the run will have checked: those of the tests done, and max_examples for each test
        still to run (or what the running one has already checked, if more: shrinking)."""
        left = max(self.total_tests - self.tests_done, 0)
        running = max(self.current_cases, self.examples_per_test) if left else 0
        return self.finished_cases + running + max(left - 1, 0) * self.examples_per_test

    def left(self) -> float | None:
        """Seconds left at the rate since the first record, or None until that rate means something."""
        done = self.fraction()
        if self.first is None or not self.tests_done or not 0 < done < 1:
            return None
        since, at = self.first
        gained = done - at
        if gained < ESTIMATE_AFTER:
            return None
        return (self.clock() - since) * (1 - done) / gained

    def line(self) -> str:
        total = max(self.total_tests, self.tests_done)
        filled = int(BAR * self.fraction())
        elapsed = self.clock() - self.start
        seconds = self.left()
        left = "" if seconds is None else f", ~{_clock(seconds)} left"
        expected = f"/~{self.expected()}" if self.examples_per_test else ""
        where = f" | {self.current}" if self.current else ""
        return (
            f"[{'#' * filled}{'-' * (BAR - filled)}] {self.cases}{expected} records "
            f"({self.skipped} skipped or refused) | {self.tests_done}/{total} tests | "
            f"{len(self.failing)} failing | {_clock(elapsed)} elapsed{left}{where}"
        )


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
