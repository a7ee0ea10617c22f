"""The catalogue of injected bugs the suite must catch, and the hunt that shows it does.

Each mutant is a backend with exactly one adapter method overridden to reintroduce a known bug
class. Each backend's mutants live in a module of this package (harness/mutants/<backend>.py)
exporting `MUTANTS`. `hunt` searches the suite's own strategies for a case that fails the numeric
check and reports how many examples and seconds it took, and the shrunk counterexample.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from harness import profiles
from harness.backends.base import Backend
from harness.case import Case
from harness.checks.numeric import check_case
from harness.strategies import cases


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # the bug class, in a sentence
    method: str  # the one adapter method overridden
    families: tuple[str, ...]  # suite families the hunt searches
    windowed: bool
    make: Callable[[], Backend]
    device: str = "cpu"
    force: dict | None = None  # Case fields the hunt fixes (e.g. the hybrid pool), None: as drawn


def named(cls: type[Backend], name: str) -> Callable[[], Backend]:
    """A factory for a mutant backend class under its catalogue name."""

    def make() -> Backend:
        b = cls()
        b.name = name
        return b

    return make


def catalogue() -> list[Mutant]:
    """Every mutant: each module in harness/mutants/ contributes its list `MUTANTS`."""
    out: list[Mutant] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        out += importlib.import_module(f"{__name__}.{info.name}").MUTANTS
    return out


def by_name(name: str) -> Mutant:
    every = catalogue()
    for m in every:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r}; known: {', '.join(m.name for m in every)}")


@dataclass
class Detection:
    mutant: str
    family: str
    caught: bool
    examples: int  # examples run up to and including the first failure
    seconds: float  # wall time to the first failure
    shrunk: Case | None
    reason: str


def hunt(mutant: Mutant, family: str, max_examples: int = 200) -> Detection:
    """Search `family` with the suite's strategy until the mutant fails; shrink the failure."""
    backend = mutant.make()
    strategy = cases(family, mutant.windowed, backend.capabilities, profiles.sizes())
    if mutant.force:
        strategy = strategy.map(lambda c: c.replace(**mutant.force))
    state = {"n": 0, "first": None, "reason": ""}
    start = time.perf_counter()

    def fails(case: Case) -> bool:
        res = check_case(backend, case, mutant.device)
        if res.status == "skip":
            return False
        state["n"] += 1
        bad = res.status != "pass"
        if bad and state["first"] is None:
            state["first"] = (state["n"], time.perf_counter() - start)
        if bad:
            state["reason"] = res.reason
        return bad

    try:
        shrunk = find(
            strategy, fails, settings=settings(settings.get_profile("mutant"), max_examples=max_examples)
        )
    except (NoSuchExample, Unsatisfiable):
        return Detection(
            mutant.name,
            family,
            False,
            state["n"],
            time.perf_counter() - start,
            None,
            "survived: no failing case found",
        )
    n, secs = state["first"]
    fails(shrunk)  # replay the minimal case so the reason describes it
    return Detection(mutant.name, family, True, n, secs, shrunk, state["reason"])
