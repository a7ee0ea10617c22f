"""The progress line of a check run: tests done out of collected, cases checked, failures, time.

Pure bookkeeping and formatting; the pytest plugin decides when to print it (at most every few
seconds while a test runs, and when a test ends).
"""

from __future__ import annotations

import time
from collections.abc import Callable

BAR = 20


class Progress:
    def __init__(self, total_tests: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start = clock()
        self.last_print = -1e9
        self.total_tests = total_tests
        self.tests_done = 0
        self.cases = 0
        self.skipped = 0
        self.failing: set[str] = set()  # test ids with a failing, crashing or hanging case
        self.current = ""

    def case(self, status: str, test_id: str) -> None:
        """One checked (or skipped) example of test `test_id`."""
        self.current = test_id
        self.cases += 1
        if status in ("skip", "refused"):  # refused: a drawn case the backend's supports() turned down
            self.skipped += 1
        elif status != "pass":
            self.failing.add(test_id)

    def test_done(self, test_id: str, failed: bool) -> None:
        self.tests_done += 1
        if failed:
            self.failing.add(test_id)

    def due(self, interval: float) -> bool:
        """True (and the clock is reset) if `interval` seconds passed since the last printed line."""
        now = self.clock()
        if now - self.last_print < interval:
            return False
        self.last_print = now
        return True

    def line(self) -> str:
        total = max(self.total_tests, self.tests_done)
        filled = BAR * self.tests_done // total if total else 0
        secs = int(self.clock() - self.start)
        where = f" | {self.current}" if self.current else ""
        return (
            f"[{'#' * filled}{'-' * (BAR - filled)}] {self.tests_done}/{total} tests | "
            f"{self.cases} cases ({self.skipped} skipped or refused) | {len(self.failing)} failing | "
            f"{secs // 60}:{secs % 60:02d} elapsed{where}"
        )
