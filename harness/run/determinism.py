"""How cases/test_deterministic.py is generated: batch invariance for every deterministic backend.

One property test per (backend, device, window) for each backend that declares `deterministic`.
Hypothesis draws a case from any family (CROSS only in the `full` tests), forces deterministic=true,
and harness/checks/invariance.py runs request 0 alone, permuted, between requests of very different
lengths, and in batches of 1 to 64: every bit must stay. Ids read
`test_deterministic[<backend>-<device>-<full|swa>]`, so `-k deterministic` selects these and no
family keyword does; the swa ones are sliding-window tests and `-k swa` selects them too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import backends
from harness.backends.base import Capabilities
from harness.checks.invariance import neighbour_sizes
from harness.core.case import Case
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.core.results import CaseResult
from harness.run import isolation
from harness.run.suite import WINDOWS, Target, judge
from harness.search import profiles
from harness.search.refusals import search_with_refusals
from harness.search.strategies import cases

FAMILY = "deterministic"
# An invariance check runs the backend on about a dozen batches (up to 64 requests): fewer examples.
EXAMPLES_DIVISOR = 6


def params() -> list:
    """pytest params over every selected backend that declares a deterministic mode."""
    out = []
    for name in backends.selected():
        b = backends.load(name)
        if not b.capabilities.deterministic:
            continue
        for device in sorted(b.capabilities.devices):
            for w in WINDOWS:
                if not families(w, b.capabilities) or (w == "swa" and not b.capabilities.window):
                    continue
                out.append(Target(name, device, FAMILY, w).param())
    return out


def families(window: str, caps: Capabilities) -> list[str]:
    """The families of the backend's modes that it declares deterministic (no `exclusive` pair of
    deterministic and the mode), less CROSS (which has no window) in the sliding-window tests."""
    return [
        f
        for f in FAMILIES
        if FAMILY_MODE[f] in caps.modes
        and not caps.excludes("deterministic", str(FAMILY_MODE[f]))
        and (window == "full" or FAMILY_MODE[f] != Mode.CROSS)
    ]


def run(t: Target, record: Callable[[CaseResult], None] | None = None) -> None:
    """Search deterministic cases of every family; fail with the case and the batch that moved it."""
    backend = t.backend()
    why = backend.available(t.device)
    if why:
        pytest.skip(why)
    sizes = profiles.sizes()
    windowed = t.window == "swa"
    strategy = st.sampled_from(families(t.window, backend.capabilities)).flatmap(
        lambda fam: cases(fam, windowed, backend.capabilities, sizes)
    )
    strategy = strategy.map(lambda c: c.replace(deterministic=True)).filter(backend.capabilities.admits)
    search = isolation.Search(backend, t.device, "invariance", neighbour_sizes(sizes), FAMILY)
    current = settings.default  # the active profile's settings

    @settings(max_examples=max(2, current.max_examples // EXAMPLES_DIVISOR))
    @given(strategy)
    def check(case: Case) -> None:
        judge(search(case), search, record)

    what = f"{backend.name} on {t.device}, deterministic ({t.window})"
    search_with_refusals(check, search.seen.values, what)
