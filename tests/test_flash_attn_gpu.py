"""On the GPU: fa4's injected glue bugs are caught on the real kernel, fa4 is batch-invariant, and the
known issue of vLLM's FA3 under graphs confirms where the suite failed.

Each fa4 mutant is hunted with the suite's own strategies under the `gpu` profile (bf16,
head_dim 128). One case per FA4 code path (the verify-tree mask_mod and the hybrid-pool
translation among them) must pass, and prints what its first call cost (JIT compile, or a load
from FA4's disk cache). Cases run in the harness's isolated worker, so a device fault is a
result. Skipped, with the reason, without CUDA or without flash-attn-4 (setup.sh prints whether
its CuTe DSL libraries were unpacked).

On a Hopper GPU with vLLM's CUDA build the FA3 graph window entry confirms on the graphs the suite failed
and not where FA3 plans the capture and the replays alike. vllm-fa3-graph-window-metadata: a replay whose
requests all fit the window is planned by FA3 without it (and, at one query per request and a head size
of 64 or less, without the causal mask), the capture at max_model_len with it. The suite's failing graphs
on an H200 (vllm 0.26.0) were window 0, 4 heads of 32, one request of one key (next_token-swa; spec-swa
the same as a verify of one draft). Skipped, with the reason, without CUDA or vLLM's FA3."""

from __future__ import annotations

import time

import pytest
import torch

from harness.backends.flash_attn_fa4 import FA4
from harness.checks import library
from harness.checks.engine_confirm import vllm_fa3_graph_window_metadata as confirm
from harness.checks.engine_confirm import vllm_flashinfer_e5m2_query
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import hunt
from harness.mutants.flash_attn import MUTANTS
from harness.run import isolation
from harness.search import profiles
from tests.test_known_issues import E5M2_PREFIX

SKIP = FA4().available("cuda")
pytestmark = pytest.mark.gpu
ON_FA4 = pytest.mark.skipif(SKIP is not None, reason=f"fa4 unavailable: {SKIP}")

GPU = dict(head_dim=128, num_q_heads=8, num_kv_heads=2)
TREE = (-1, 0, 0, 1, 2)
PATHS = {  # one case per FA4 code path (each is its own kernel variant)
    "causal-page16": Case(mode="EXTEND", requests=(Request(40, 9), Request(0, 30)), **GPU),
    "local-page128-tma": Case(
        mode="EXTEND", requests=(Request(300, 20),), window_left=100, page_size=128, **GPU
    ),
    "tree-mask_mod-hybrid": Case(
        mode="TARGET_VERIFY",
        requests=(Request(50, 5, tree=TREE), Request(7, 5, tree=TREE)),
        window_left=9,
        hybrid_swa_pool=True,
        **GPU,
    ),
    "cross": Case(mode="CROSS", requests=(Request(0, 24, 70), Request(0, 5, 9)), **GPU),
    "encoder-long": Case(mode="ENCODER_ONLY", requests=(Request(0, 3000), Request(0, 37)), **GPU),
    "encoder-local": Case(
        mode="ENCODER_ONLY", requests=(Request(0, 700), Request(0, 9)), window_left=64, **GPU
    ),
    "encoder-two-sided-page128": Case(
        mode="ENCODER_ONLY",
        requests=(Request(0, 500),),
        window_left=64,
        window_right=32,
        page_size=128,
        **GPU,
    ),
}
DET = dict(deterministic=True, **GPU)
INVARIANT = {
    "prefix-swa": Case(mode="EXTEND", requests=(Request(5000, 40), Request(30, 9)), window_left=3000, **DET),
    "verify-tree-swa": Case(
        mode="TARGET_VERIFY", requests=(Request(5000, 5, tree=TREE),), window_left=4200, **DET
    ),
    "draft_extend_v2": Case(mode="DRAFT_EXTEND_V2", requests=(Request(5000, 4), Request(9, 4)), **DET),
}
HUNTS = [(m, f) for m in MUTANTS for f in m.families]
SHRINK_RUNS = 40  # each new shrink candidate may compile a kernel variant: bound the GPU time


@ON_FA4
@pytest.mark.parametrize("label", list(PATHS))
def test_each_path_passes_and_its_first_call_pays_the_jit(label):
    fa4, c = FA4(), PATHS[label]
    t0 = time.perf_counter()
    first = isolation.check(fa4, c, "cuda")
    t1 = time.perf_counter()
    again = isolation.check(fa4, c.replace(seed=c.seed + 1), "cuda")
    t2 = time.perf_counter()
    print(
        f"\nfa4 {label}: first call {t1 - t0:.1f}s (JIT or cache load + run), "
        f"again {t2 - t1:.2f}s; {first.reason}"
    )
    assert first.status == "pass" and again.status == "pass", first.failure_text() + again.failure_text()


@ON_FA4
@pytest.mark.parametrize("label", sorted(INVARIANT))
def test_fa4_is_batch_invariant(label):
    res = isolation.check_invariant(FA4(), INVARIANT[label], "cuda", 4096, 512)
    print(f"\nfa4 {label}: {res.status}: {res.reason}")
    assert res.status == "pass", res.reason


@ON_FA4
@pytest.mark.parametrize("mutant,family", HUNTS, ids=[f"{m.name.split('~')[1]}@{f}" for m, f in HUNTS])
def test_fa4_mutant_is_caught(mutant, family):
    profiles.load("gpu")
    try:
        d = hunt(mutant, family, device="cuda", shrink_runs=SHRINK_RUNS)
    finally:
        profiles.load("ci")
    size = None if d.shrunk is None else getattr(d.shrunk, "batch_size", None) or len(d.shrunk.batches)
    unit = "batch(es) replayed" if mutant.check == "graph" else "request(s)"
    print(
        f"\n{mutant.name} on {family}: caught={d.caught} ({d.status}) after {d.examples} examples, "
        f"{d.seconds:.1f}s; shrunk to {size} {unit}: "
        f"{d.shrunk.to_json() if d.shrunk else None}; {d.reason}"
    )
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived {d.examples} examples of {family}"
    if "untranslated" in mutant.name:  # a poison read or a crash, never a numeric near-miss
        assert d.status == "crash" or "NaN" in d.reason, d.reason


NO_VLLM_FA3 = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else None
    if library("vllm.vllm_flash_attn") is not None
    else "vLLM's CUDA build (vllm.vllm_flash_attn) is not installed"
)
ON_VLLM_FA3 = pytest.mark.skipif(NO_VLLM_FA3 is not None, reason=str(NO_VLLM_FA3))

LAYER = dict(num_q_heads=4, num_kv_heads=4, head_dim=32, dtype="bfloat16", window_left=0)


def decode(*prefixes: int, **fields) -> Case:
    return Case(mode="DECODE", requests=tuple(Request(p, 1) for p in prefixes), **{**LAYER, **fields})


@ON_VLLM_FA3
def test_the_fa3_graph_window_issue_confirms_on_the_suites_failing_graphs():
    assert confirm(GraphCase((decode(0), decode(0)), 1, 1), "cuda")  # next_token-swa
    verify = Case(mode="TARGET_VERIFY", requests=(Request(0, 1, tree=(-1,)),), **LAYER)
    assert confirm(GraphCase((verify, verify), 1, 2), "cuda")  # spec-swa


@ON_VLLM_FA3
@pytest.mark.parametrize(
    "g",
    [
        GraphCase((decode(0, head_dim=128), decode(0, head_dim=128)), 1, 1),  # FA3 keeps causal at 128
        GraphCase((decode(1), decode(3, 5)), 2, 40),  # every replay past the window
        GraphCase((decode(0, window_left=-1),), 1, 1),  # no window
    ],
    ids=["head_dim_128", "past_the_window", "no_window"],
)
def test_the_fa3_graph_window_issue_does_not_confirm_where_the_plans_agree(g):
    assert not confirm(g, "cuda")


NO_VLLM_FLASHINFER = (
    "no Hopper GPU: vLLM casts FlashInfer's prefill queries to the cache's dtype on 9.x (and 10.x) only"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9
    else None
    if library("vllm.v1.attention.backends.flashinfer") is not None
    else "vLLM's CUDA build with FlashInfer (vllm.v1.attention.backends.flashinfer) is not installed"
)


@pytest.mark.skipif(NO_VLLM_FLASHINFER is not None, reason=str(NO_VLLM_FLASHINFER))
def test_the_e5m2_entry_confirms_on_the_crashed_prefix_case_and_not_on_its_e4m3_twin():
    assert vllm_flashinfer_e5m2_query(E5M2_PREFIX, "cuda")
    assert not vllm_flashinfer_e5m2_query(E5M2_PREFIX.replace(kv_dtype="float8_e4m3fn"), "cuda")
