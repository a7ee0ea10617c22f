"""On CUDA: both flex variants on one case per mode (the first call's compile cost printed), the
compiled kernel's batch invariance, its CUDA-graph replays, and its mutants caught on the Triton
kernel (the graph mutant by the replay check).

Skipped, with the reason, without CUDA. The suite itself (`python -m harness check --backend
flex_compiled --device cuda --profile gpu`) is the main GPU run; this file pins the paths.
"""

from __future__ import annotations

import time

import pytest

from harness.backends.flex_compiled import FlexCompiled
from harness.backends.flex_eager import FlexEager
from harness.checks.invariance import check_invariance
from harness.checks.numeric import check_case
from harness.checks.replay import replay_result
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import hunt
from harness.mutants.flex import MUTANTS
from harness.search import profiles

SKIP = FlexCompiled().available("cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=f"flex on CUDA: {SKIP}")]

GPU = dict(head_dim=128, num_q_heads=8, num_kv_heads=2)
TREE = (-1, 0, 0, 1, 2)
PER_MODE = {
    "prefill": Case(mode="EXTEND", requests=(Request(0, 300), Request(0, 17)), window_left=100, **GPU),
    "prefix-hybrid-sinks": Case(
        mode="EXTEND",
        requests=(Request(2000, 40), Request(30, 9)),
        window_left=511,
        hybrid_swa_pool=True,
        sinks=True,
        **GPU,
    ),
    "decode-softcap": Case(
        mode="DECODE", requests=tuple(Request(p, 1) for p in (4000, 1, 700)), soft_cap=30.0, **GPU
    ),
    "draft_extend_v2": Case(mode="DRAFT_EXTEND_V2", requests=(Request(33, 4), Request(900, 4)), **GPU),
    "verify-tree-hybrid": Case(
        mode="TARGET_VERIFY",
        requests=(Request(50, 5, tree=TREE), Request(700, 5, tree=TREE)),
        window_left=9,
        hybrid_swa_pool=True,
        **GPU,
    ),
    "cross-sinks": Case(mode="CROSS", requests=(Request(0, 24, 70), Request(0, 5, 900)), sinks=True, **GPU),
}
DET = dict(deterministic=True, **GPU)
INVARIANT = {
    "prefix-swa": Case(mode="EXTEND", requests=(Request(5000, 40), Request(30, 9)), window_left=3000, **DET),
    "decode": Case(mode="DECODE", requests=(Request(6000, 1), Request(3, 1)), **DET),
    "verify-tree-swa": Case(
        mode="TARGET_VERIFY", requests=(Request(5000, 5, tree=TREE),), window_left=4200, **DET
    ),
}


@pytest.mark.parametrize("backend", [FlexCompiled(), FlexEager()], ids=["compiled", "eager"])
@pytest.mark.parametrize("label", list(PER_MODE))
def test_each_mode_passes_and_its_first_call_pays_the_compile(backend, label):
    c = PER_MODE[label]
    t0 = time.perf_counter()
    first = check_case(backend, c, "cuda")
    t1 = time.perf_counter()
    again = check_case(backend, c.replace(seed=1), "cuda")
    t2 = time.perf_counter()
    print(f"\n{backend.name} {label}: first {t1 - t0:.1f}s, again {t2 - t1:.2f}s; {first.reason}")
    assert first.status == "pass", first.failure_text()
    assert again.status == "pass", again.failure_text()
    assert first.verdict.lse_err is not None or c.sinks, "the CUDA kernel's LSE was not checked"


@pytest.mark.parametrize("label", list(INVARIANT))
def test_compiled_is_batch_invariant(label):
    t0 = time.perf_counter()
    res = check_invariance(FlexCompiled(), INVARIANT[label], "cuda")
    print(f"\nflex_compiled invariance {label}: {res.reason} ({time.perf_counter() - t0:.1f}s)")
    assert res.passed, res.reason


def _sequence(mode: str, queries: int, **kw) -> GraphCase:
    """Three replays of one layer: 3 requests (at 4), 9 longer ones (at 16), then 1 (at 1)."""
    lens = [[700, 30, 4000], [5, 2000, 17, 900, 3000, 1, 60, 12, 5800], [100]]
    tree = TREE[:queries] if mode == "TARGET_VERIFY" else None
    batches = tuple(
        Case(mode=mode, requests=tuple(Request(p, queries, tree=tree) for p in ls), seed=i, **GPU, **kw)
        for i, ls in enumerate(lens)
    )
    return GraphCase(batches, max_batch=16, max_kv=6000)


GRAPH_SEQUENCES = {
    "decode-softcap-sinks": _sequence("DECODE", 1, soft_cap=30.0, sinks=True),
    "verify-tree-hybrid-swa": _sequence("TARGET_VERIFY", 5, window_left=9, hybrid_swa_pool=True),
    "draft_extend_v2-deterministic": _sequence("DRAFT_EXTEND_V2", 4, deterministic=True),
}


@pytest.mark.parametrize("label", list(GRAPH_SEQUENCES))
def test_compiled_graph_replays_pass(label):
    t0 = time.perf_counter()
    res = replay_result(FlexCompiled(), GRAPH_SEQUENCES[label], "cuda")
    print(f"\nflex_compiled graph {label}: {res.status}: {res.reason} ({time.perf_counter() - t0:.1f}s)")
    assert res.status == "pass", res.reason


COMPILED_MUTANTS = [m for m in MUTANTS if m.backend == "flex_compiled"]


@pytest.mark.parametrize("mutant", COMPILED_MUTANTS, ids=[m.name for m in COMPILED_MUTANTS])
def test_compiled_mutants_are_caught_on_cuda(mutant):
    profiles.load("gpu")
    try:
        d = hunt(mutant, mutant.families[0], device="cuda")
    finally:
        profiles.load("ci")
    assert d.caught, d.reason
    print(f"\n{mutant.name}: caught after {d.examples} examples, {d.seconds:.1f}s; {d.shrunk.to_json()}")
