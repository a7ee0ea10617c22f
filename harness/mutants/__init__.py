"""The catalogue of injected bugs the suite must catch, and the hunt that shows it does.

Each mutant is a backend with exactly one adapter method overridden to reintroduce a known bug
class. Each backend's mutants live in a module of this package (harness/mutants/<backend>.py)
exporting `MUTANTS`. `hunt` searches the suite's own strategies for a case that the mutant's check
fails (the numeric check, or batch invariance for the determinism mutants) and reports how many
examples and seconds it took, and the shrunk counterexample. On CUDA (or with
ATTN_HARNESS_ISOLATE=1) every case runs in an isolated worker, so a crash is a result.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable
from hypothesis.strategies import SearchStrategy

from harness.backends.base import Backend, Capabilities
from harness.checks.invariance import neighbour_sizes
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.run import isolation
from harness.search import profiles
from harness.search.profiles import Sizes
from harness.search.strategies import cases, graph_cases

CHECKS = ("numeric", "invariance", "graph")


@dataclass(frozen=True, kw_only=True)
class Mutant:
    name: str  # "<backend>~<bug>"
    bug: str  # the bug class, in a sentence
    method: str  # the one adapter method overridden
    families: tuple[str, ...]  # suite families the hunt searches
    windowed: bool
    make: Callable[[], Backend]
    device: str = "cpu"  # "cpu": shown in CI (its backend may also run on CUDA); "cuda": GPU only
    force: dict | None = None  # Case fields the hunt fixes (e.g. the hybrid pool), None: as drawn
    # "numeric": against the references; "invariance": batch invariance; "graph": CUDA-graph replay
    # (harness/checks/replay.py) over replay sequences (strategies.graph_cases)
    check: str = "numeric"
    expect: str | None = None  # the status a catch must have ("crash"); None: any failure

    @property
    def backend(self) -> str:
        """The backend the mutant breaks (its name before '~')."""
        return self.name.split("~")[0]


def named(cls: type[Backend], name: str) -> Callable[[], Backend]:
    """A factory for a mutant backend class under its catalogue name."""

    def make() -> Backend:
        b = cls()
        b.name = name
        return b

    return make


def mutants_of(backend: str) -> Callable[..., Mutant]:
    """The constructor of one backend's mutants: `make(bug_name, bug, method, families, windowed, cls,
    **fields)` is the Mutant `<backend>~<bug_name>`, its backend built under that name."""

    def make(
        name: str, bug: str, method: str, families: tuple[str, ...], windowed: bool, cls: type, **fields: Any
    ) -> Mutant:
        full = f"{backend}~{name}"
        return Mutant(
            name=full,
            bug=bug,
            method=method,
            families=families,
            windowed=windowed,
            make=named(cls, full),
            **fields,
        )

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


@dataclass(kw_only=True)
class Detection:
    mutant: str
    family: str
    caught: bool
    examples: int  # examples run up to and including the first failure
    seconds: float  # wall time to the first failure
    shrunk: Case | GraphCase | None
    reason: str
    device: str = "cpu"
    status: str = ""  # the shrunk case's status when caught: fail, crash or hang
    skipped: str | None = None  # why the hunt could not run here (then caught is False)


def _strategy(mutant: Mutant, family: str, caps: Capabilities, sizes: Sizes) -> SearchStrategy:
    """The suite's strategy for the family (a replay's for a graph mutant), with the mutant's forced
    fields (deterministic mode for an invariance mutant)."""
    force = dict(mutant.force or {})
    if mutant.check == "invariance":
        force["deterministic"] = True
    if mutant.check == "graph":
        strategy = graph_cases(family, mutant.windowed, caps, sizes)
        return strategy.map(lambda g: g.replace_layer(**force)) if force else strategy
    strategy = cases(family, mutant.windowed, caps, sizes)
    return strategy.map(lambda c: c.replace(**force)) if force else strategy


def _failure_test(
    mutant: Mutant, search: isolation.Search, state: dict, start: float, shrink_runs: int | None
) -> Callable[[Case | GraphCase], bool]:
    """What `find` asks of each case: whether the mutant fails it (with the status it expects).
    Counts the cases run in `state` (and when the first failure came); past the shrink budget, a
    new case is not run."""

    def fails(case: Case | GraphCase) -> bool:
        shrinking = state["first"] is not None
        spent = shrink_runs is not None and state["shrinks"] >= shrink_runs
        if shrinking and spent and not search.known(case):
            return False  # shrink budget spent: keep the smallest failure found so far
        res = search(case)
        if res is None or res.status == "skip":
            return False
        if search.ran_last:
            state["n"] += 1
            state["shrinks"] += shrinking
        bad = res.status != "pass" and (mutant.expect is None or res.status == mutant.expect)
        if bad and state["first"] is None:
            state["first"] = (state["n"], time.perf_counter() - start)
        return bad

    return fails


def hunt(
    mutant: Mutant,
    family: str,
    max_examples: int = 200,
    device: str | None = None,
    shrink_runs: int | None = None,
) -> Detection:
    """Search `family` with the suite's strategy until the mutant fails its check; shrink the failure,
    running at most `shrink_runs` new cases while shrinking (None: until hypothesis is done)."""
    device = device or mutant.device
    backend = mutant.make()
    why = backend.available(device)
    if why:
        return Detection(
            mutant=mutant.name,
            family=family,
            caught=False,
            examples=0,
            seconds=0.0,
            shrunk=None,
            reason=why,
            device=device,
            skipped=why,
        )
    sizes = profiles.sizes()
    strategy = _strategy(mutant, family, backend.capabilities, sizes)
    search = isolation.Search(backend, device, mutant.check, neighbour_sizes(sizes))
    state: dict = {"n": 0, "first": None, "shrinks": 0}
    start = time.perf_counter()
    fails = _failure_test(mutant, search, state, start, shrink_runs)
    try:
        shrunk = find(
            strategy, fails, settings=settings(settings.get_profile("mutant"), max_examples=max_examples)
        )
    except (NoSuchExample, Unsatisfiable):
        expected = f" with status {mutant.expect}" if mutant.expect else ""
        return Detection(
            mutant=mutant.name,
            family=family,
            caught=False,
            examples=state["n"],
            seconds=time.perf_counter() - start,
            shrunk=None,
            reason=f"survived: no failing case{expected} found in {state['n']} examples",
            device=device,
        )
    n, secs = state["first"]
    res = search(shrunk)  # the minimal case's own result (memoised: not run again)
    return Detection(
        mutant=mutant.name,
        family=family,
        caught=True,
        examples=n,
        seconds=secs,
        shrunk=shrunk,
        reason=res.reason,
        device=device,
        status=res.status,
    )
