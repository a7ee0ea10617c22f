"""How cases/test_graph.py is generated: the CUDA-graph replay check for every capturable backend.

One property test per (backend, device, graph family, window): hypothesis draws a replay sequence
(strategies.graph_cases) and harness/checks/replay.py captures the backend's graph path at the
engine's sizes and replays every batch, each judged against the references (and bitwise against
the eager run in deterministic mode). Ids read `test_graph[<backend>-<device>-<label>-<full|swa>]`
with a label that names the mode without a family keyword (`next_token`, `spec`, `draft`), and the
tests carry the `graph` marker, not a family's: `-k graph` selects exactly these, `-k decode` none of
them, `-k swa` the windowed ones. A backend that cannot be captured has one test per device, which
skips with its reason (`Capabilities.graph_reason`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings

from harness import backends
from harness.backends.graph_glue import GraphGlue
from harness.core.graph_case import GraphCase
from harness.core.modes import FAMILY_MODE, Mode
from harness.core.results import GRAPH_CHECK, CaseResult
from harness.run import isolation
from harness.run.suite import WINDOWS, Target, judge
from harness.search import kept, profiles
from harness.search.pinned import PINNED_GRAPHS
from harness.search.refusals import search_with_refusals
from harness.search.strategies import GRAPH_FAMILIES, graph_cases

LABELS = {"decode": "next_token", "verify": "spec", "draft_extend_v2": "draft"}
UNCAPTURED = "uncaptured"  # the label of a backend's one test when it has no graph path
# A replay check captures up to five sizes and replays up to five batches: fewer examples.
EXAMPLES_DIVISOR = 2


@dataclass(frozen=True)
class GraphTarget(Target):
    """A Target of the `graph` family; `graph_family` is the suite family whose mode is replayed."""

    graph_family: str = ""

    @property
    def id(self) -> str:
        label = LABELS.get(self.graph_family, UNCAPTURED)
        window = "" if label == UNCAPTURED else f"-{self.window}"
        return f"{self.backend_name}-{self.device}-{label}{window}"


def params() -> list:
    """pytest params over every selected backend and device: its graph families and windows, or one
    test that skips with the reason it cannot be captured."""
    out = []
    for name in backends.selected():
        caps = backends.load(name).capabilities
        for device in sorted(caps.devices):
            families = [f for f in GRAPH_FAMILIES if FAMILY_MODE[f] in caps.graph_modes & caps.modes]
            if not families:
                out.append(GraphTarget(name, device, GRAPH_CHECK, "full", "").param())
            for fam in families:
                windows = WINDOWS if caps.window else ("full",)
                out += [GraphTarget(name, device, GRAPH_CHECK, w, fam).param() for w in windows]
    return out


def pinned_graphs(graph_family: str, windowed: bool) -> list[GraphCase]:
    """The GraphCases pinned for this graph family (harness/search/pinned.py, then the pins file a
    run replays: harness/search/kept.py), windowed or not."""
    pins = [GraphCase.from_dict(d) for d in PINNED_GRAPHS.get(graph_family, [])] + kept.graphs(graph_family)
    return [g for g in pins if (g.layer.window_left >= 0) == windowed]


def window_reason(backend: GraphGlue, t: GraphTarget, mode: Mode | None) -> str | None:
    """Why a windowed graph test cannot draw a case: the window excluded from the mode, eagerly
    (`exclusive`) or under a graph alone (`graph_window_reason`)."""
    if t.window != "swa" or mode is None:
        return None
    caps = backend.capabilities
    if caps.excludes("window", str(mode)):
        return caps.reason(f"window+{mode}", f"{backend.name} has no sliding window in {mode}")
    return backend.graph_window_reason(mode)


def run(t: GraphTarget, record: Callable[[CaseResult], None] | None = None) -> None:
    """Search replay sequences; fail with the GraphCase, the replay that failed and its repro."""
    backend = t.backend()
    caps = backend.capabilities
    mode = FAMILY_MODE.get(t.graph_family)
    why = (
        backend.available(t.device)
        or caps.graph_reason(mode)
        or (mode is not None and backend.graph_mode_reason(mode))
        or window_reason(backend, t, mode)
    )
    if why:
        pytest.skip(why)
    def admitted(g: GraphCase) -> bool:
        """Not drawn: what the backend declares it cannot combine (`exclusive`) or run under a graph."""
        return all(caps.admits(c) for c in g.batches) and backend.graph_supports(g.layer) is None

    strategy = graph_cases(t.graph_family, t.window == "swa", caps, profiles.sizes()).filter(admitted)
    search = isolation.Search(backend, t.device, "graph")
    current = settings.default

    @settings(max_examples=max(2, current.max_examples // EXAMPLES_DIVISOR))
    @given(strategy)
    def check(g: GraphCase) -> None:
        judge(search(g), search, record)

    for g in pinned_graphs(t.graph_family, t.window == "swa"):
        if admitted(g) and all(backend.supports(c) is None for c in g.batches):
            check = example(g)(check)

    what = f"{backend.name} on {t.device}, graph {t.graph_family} ({t.window})"
    search_with_refusals(check, search.seen.values, what)
