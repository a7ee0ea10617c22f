"""The catalogue of injected bugs the suite must catch, and the hunt that shows it does.

Each mutant is a backend with exactly one adapter method overridden to reintroduce a known bug
class. `hunt` searches the suite's own strategies for a case that fails the numeric check and
reports how many examples and seconds it took, and the shrunk counterexample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from harness import profiles
from harness.backends.base import Backend
from harness.backends.torch_native import TorchNative
from harness.batch import Batch
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


# --- torch_native mutants -------------------------------------------------------------------------


class _WindowIgnored(TorchNative):
    def window_left(self, batch: Batch) -> int:
        return -1


class _WindowShort(TorchNative):
    def in_window(self, key_pos: torch.Tensor, query_pos: torch.Tensor, window_left: int) -> torch.Tensor:
        return key_pos > query_pos - window_left  # W keys instead of W + 1


class _DraftExtendPrefixOnly(TorchNative):
    def kv_lens(self, batch: Batch) -> list[int]:
        return batch.cpu_list("seq_lens_before_bump")  # reads P keys, misses the written drafts


class _SwaUntranslated(TorchNative):
    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        return slots  # full-pool slots used on the SWA pool


def _named(cls: type[TorchNative], name: str) -> Callable[[], Backend]:
    def make() -> Backend:
        b = cls()
        b.name = name
        return b

    return make


CATALOGUE: list[Mutant] = [
    Mutant(
        "torch_native~window_ignored",
        "SDPA fallback ignores the sliding window: every query sees the whole prefix",
        "window_left",
        ("prefix", "prefill", "decode"),
        True,
        _named(_WindowIgnored, "torch_native~window_ignored"),
    ),
    Mutant(
        "torch_native~window_short",
        "window off by one: W keys instead of W + 1",
        "in_window",
        ("prefix", "prefill", "decode"),
        True,
        _named(_WindowShort, "torch_native~window_short"),
    ),
    Mutant(
        "torch_native~de_v2_prefix_only",
        "DRAFT_EXTEND_V2 reads only the P prefix keys, not the bumped seq_lens = P + num_draft",
        "kv_lens",
        ("draft_extend_v2",),
        False,
        _named(_DraftExtendPrefixOnly, "torch_native~de_v2_prefix_only"),
    ),
    Mutant(
        "torch_native~swa_untranslated",
        "sliding-window layer reads the SWA pool with untranslated full-pool slots",
        "layer_slots",
        ("prefix", "decode", "verify"),
        True,
        _named(_SwaUntranslated, "torch_native~swa_untranslated"),
        force={"hybrid_swa_pool": True},
    ),
]


def by_name(name: str) -> Mutant:
    for m in CATALOGUE:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r}; known: {', '.join(m.name for m in CATALOGUE)}")


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
