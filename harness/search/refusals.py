"""Refusals in a property search: counted, recorded, and fatal when they are most of the search.

Inside a search a drawn case that the backend's supports() turns down is rejected (`assume(False)`)
and hypothesis draws another, so without a count a backend that refused 97% of the drawn cases
passed on the few it took. Each distinct refused case is recorded with status `refused` (the
summary and the report show checked vs refused), and a search in which more than MAX_REFUSED of
the distinct drawn cases were refused fails, naming the counts and the most frequent reasons. The
cure is in the declarations: the strategies draw what Capabilities declare, so a backend whose
supports() refuses more should declare it (`Capabilities.exclusive`, narrower sets).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable

from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from harness.core.results import CaseResult
from harness.core.vocab import CHECKED

MAX_REFUSED = 0.5  # a search may have the backend refuse at most this fraction of its drawn cases
TOP_REASONS = 3


class TooManyRefusals(AssertionError):
    """The backend refused most of the cases a search drew: the search checked too little."""


@dataclasses.dataclass
class Tally:
    checked: int = 0
    refused: Counter = dataclasses.field(default_factory=Counter)  # reason -> distinct cases

    @classmethod
    def of(cls, results: Iterable[CaseResult]) -> Tally:
        """The tally of a search's distinct results (a `skip` from the check is a refusal)."""
        t = cls()
        for res in results:
            if res.status == "skip":
                t.refused[res.reason] += 1
            elif res.status in CHECKED:
                t.checked += 1
        return t

    @property
    def drawn(self) -> int:
        return self.checked + sum(self.refused.values())

    def failure(self, what: str) -> str | None:
        """Why the search `what` fails on its refusals, or None when they are few enough."""
        refused = sum(self.refused.values())
        if not refused or refused <= MAX_REFUSED * self.drawn:
            return None
        reasons = "; ".join(f"{why} ({n})" for why, n in self.refused.most_common(TOP_REASONS))
        return (
            f"{what}: the backend refused {refused} of {self.drawn} drawn cases "
            f"({refused / self.drawn:.0%}, more than {MAX_REFUSED:.0%}) and only {self.checked} were "
            f"checked; most frequent reasons: {reasons}. Declare what supports() refuses in the "
            "backend's Capabilities (narrower sets, `exclusive` pairs), so the search draws what it supports."
        )


def as_refused(res: CaseResult) -> CaseResult:
    """The record of a drawn case the backend refused (the check's `skip`, in a search)."""
    return dataclasses.replace(res, status="refused")


def search_with_refusals(
    test: Callable[[], None], results: Callable[[], Iterable[CaseResult]], what: str
) -> None:
    """Run a hypothesis test, then fail (TooManyRefusals) if the backend refused most of its drawn
    cases; `results` gives the search's distinct results once it has ended. A search that hypothesis
    gave up on for its rejections (Unsatisfiable, or the filter_too_much health check) fails the same
    way when refusals were the most of them."""
    try:
        test()
    except (Unsatisfiable, FailedHealthCheck):
        why = Tally.of(results()).failure(what)
        if why is None:
            raise
        raise TooManyRefusals(why) from None
    why = Tally.of(results()).failure(what)
    if why:
        raise TooManyRefusals(why)
