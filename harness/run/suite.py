"""How the suite in cases/ is generated: one property test per (backend, device, family, window).

Test ids read `test_<family>[<backend>-<device>-<full|swa>]` and carry markers (the family, `swa`,
`gpu`, the backend name), so `pytest -k swa` selects exactly the sliding-window tests and
`pytest -k flashinfer_paged` one backend. No id contains a family keyword by accident: a self-test
checks every keyword selects only its own family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import assume, example, given, target

from harness import backends
from harness.backends.base import Backend
from harness.core.case import Case
from harness.core.modes import FAMILY_MODE, Mode
from harness.core.results import CaseResult
from harness.run import isolation
from harness.run.speed import variant_shards
from harness.search import kept, profiles
from harness.search.pinned import PINNED
from harness.search.refusals import as_refused, search_with_refusals
from harness.search.strategies import cases

WINDOWS = ("full", "swa")


@dataclass(frozen=True)
class Target:
    backend_name: str
    device: str
    family: str
    window: str  # "full" or "swa"

    @property
    def id(self) -> str:
        return f"{self.backend_name}-{self.device}-{self.window}"

    def backend(self) -> Backend:
        return backends.load(self.backend_name)

    def param(self) -> pytest.ParameterSet:
        """This target as a pytest param, marked with its family, backend name, `swa` and `gpu`."""
        marks = [getattr(pytest.mark, self.family)]
        if self.backend_name.isidentifier():  # a module:factory spec is no marker name
            marks.append(getattr(pytest.mark, self.backend_name))
        if self.window == "swa":
            marks.append(pytest.mark.swa)
        if self.device == "cuda":
            marks.append(pytest.mark.gpu)
        return pytest.param(self, id=self.id, marks=marks)


def family_params(family: str) -> list:
    """pytest params for a family over every selected backend and device it declares."""
    out = []
    windows = ("full",) if FAMILY_MODE[family] == Mode.CROSS else WINDOWS
    for name in backends.selected():
        b = backends.load(name)
        for device in sorted(b.capabilities.devices):
            out += [Target(name, device, family, w).param() for w in windows]
    return out


def _probe_reason(backend: Backend, t: Target) -> str | None:
    """Why the whole family cannot run on this backend here (unavailable, mode or window missing)."""
    why = backend.available(t.device)
    if why:
        return why
    caps = backend.capabilities
    mode = FAMILY_MODE[t.family]
    if mode not in caps.modes:
        return caps.reason(str(mode), f"{backend.name} does not implement {mode}")
    if t.window == "swa" and not caps.window:
        return caps.reason("window", f"{backend.name} does not support a sliding window")
    if t.window == "swa" and caps.excludes("window", str(mode)):
        return caps.reason(f"window+{mode}", f"{backend.name} does not support a sliding window in {mode}")
    return None


def pinned_examples(family: str) -> list[Case]:
    """Cases pinned in harness/search/pinned.py for this family (every bug ever found is one), then
    those of the pins file a run replays (`check --pins`, harness/search/kept.py)."""
    return [Case.from_dict(d) for d in PINNED.get(family, [])] + kept.cases(family)


def judge(
    res: CaseResult | None, search: isolation.Search, record: Callable[[CaseResult], None] | None
) -> None:
    """What every property test of the suite does with one example's result: a crash or hang already
    ended the search; another variant shard's case is passed over unrecorded, as its owner will
    judge it (rejected if refused); a refusal is counted once and the example discarded; the result
    is recorded (a pass or xfail once: hypothesis may draw a case again, and the memoised result was
    not checked again; a failure each time, so that the plugin keeps the final, minimal one), its
    err/budget targeted (in a profile with the target phase), and anything but a pass (or a known
    library bug, xfail) fails the test with the result's text (raised, not `assert`ed: pytest would
    append its own explanation)."""
    if res is None:
        assume(False)  # a CRASH or HANG already ended this search (isolation.Search)
    if variant_shards.is_elsewhere(res):  # the shard that owns its variant checks and records it
        assume(res.status != "skip")
        return
    if res.status == "skip":  # refused by supports(): counted once (harness/search/refusals.py)
        if record and search.ran_last:
            record(as_refused(res))
        assume(False)
    if record and (search.ran_last or res.status not in ("pass", "xfail")):
        record(res)
    if profiles.steers_by_target() and res.verdict is not None and res.verdict.ratio == res.verdict.ratio:
        target(min(res.verdict.ratio, 1e6), label="err/budget")
    if res.status not in ("pass", "xfail"):
        raise AssertionError(res.failure_text())


def run_family(t: Target, record: Callable[[CaseResult], None] | None = None) -> None:
    """Search the family with hypothesis; fail with the shrunk Case and its repro command."""
    backend = t.backend()
    why = _probe_reason(backend, t)
    if why:
        pytest.skip(why)
    caps = backend.capabilities
    strategy = cases(t.family, t.window == "swa", caps, profiles.sizes()).filter(caps.admits)
    pins = [
        c
        for c in pinned_examples(t.family)
        if (c.window_left >= 0) == (t.window == "swa") and backend.supports(c) is None
    ]

    # a worker per case on CUDA: a crash is a result
    search = isolation.Search(backend, t.device, family=t.family)

    def check(case: Case) -> None:
        judge(search(case), search, record)

    test = given(strategy)(check)
    for c in pins:
        test = example(c)(test)
    search_with_refusals(test, search.seen.values, f"{backend.name} on {t.device}, {t.family} ({t.window})")
