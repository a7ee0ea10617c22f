"""On the GPU: every FlashInfer mutant is caught, every healthy adapter is batch-invariant, and each
FlashInfer known issue confirms itself on its own script's shapes, and only there.

Numeric mutants are hunted with the suite's own strategies under the `gpu` profile (bf16,
head_dim 128: only the JIT variants the warm-up builds). The split mutants are caught by the
batch-invariance check on long KV.

A known issue excuses a failing case only when the library, called directly on it, is wrong too
(harness/checks/known_issues.py). The non-causal window bug shows at 257 and 513 tokens with windows
1 and 8 (known_issues/flashinfer_noncausal_window.py) and not at 4096 tokens with windows 1, 8, 64
and 333, nor at 257 tokens with window 333 (measured on an H200, flashinfer 0.7.2.post1): there a
glue bug must count. The graph entry confirms on its script's cases A and B and not on its control D;
on case C (a window under the chunk) only with 0.6.18.post1: 0.7.2.post1 is right there (H200).
The far-negative entries confirm on the catalogue's `logits_below_every_sentinel` on 0.6.18.post1, each
on its kernel (fa2, and "auto": fa3 for vLLM's Hopper prefill), and not at an offset of -120.
The sglang FlashInfer entries confirm on the cases sglang_flashinfer failed on an H200 (sglang 0.5.17,
flashinfer-python 0.6.18.post1), and not where FlashInfer called sglang's way is right: a soft cap that
changes nothing at small logits, a chunk of new tokens inside the window, an FP8 cache of scales 1.
Skipped, with the reason, without CUDA or a supported flashinfer."""

from __future__ import annotations

import pytest
import torch

from harness import backends
from harness.backends.flashinfer_glue import (
    KERNEL_BACKEND,
    PREFILL_NOT_INVARIANT,
    why_unavailable,
    workspace,
)
from harness.backends.versions import distribution_version
from harness.checks import known_issues
from harness.checks.engine_confirm import (
    sglang_flashinfer_fp8_prefix_scales,
    sglang_flashinfer_ragged_window,
    sglang_flashinfer_soft_cap,
)
from harness.checks.flashinfer_confirm import (
    fa3_fp8_prefill_soft_cap,
    far_negative_logits,
    far_negative_logits_auto,
    noncausal_window,
)
from harness.checks.flashinfer_graph_confirm import graph_unsplit_plan
from harness.checks.invariance import check_invariance, compositions
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import by_name, catalogue, hunt
from harness.mutants.flashinfer import CAUGHT_BY_INVARIANCE
from harness.search import profiles
from tests.test_known_issues import CAPPED_DECODE, CHUNK_OVER_WINDOW, FP8_CAPPED, FP8_PREFIX

SKIP = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else why_unavailable()
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=str(SKIP))]

LONG_KV = 4096
NUMERIC = [
    (m, f)
    for m in catalogue()
    if m.name.startswith("flashinfer") and m.check == "numeric"
    for f in m.families
]
DET = dict(head_dim=128, deterministic=True)
HEALTHY = {
    "paged-verify-tree-swa": (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY", requests=(Request(5000, 5, tree=(-1, 0, 0, 1, 2)),), window_left=4200, **DET
        ),
    ),
    "paged-draft_extend_v2": (
        "flashinfer_paged",
        Case(mode="DRAFT_EXTEND_V2", requests=(Request(5000, 4), Request(9, 4)), **DET),
    ),
    "dec_tc-verify-chain": (
        "flashinfer_dec_tc",
        Case(mode="TARGET_VERIFY", requests=(Request(5000, 4, tree=(-1, 0, 1, 2)),), **DET),
    ),
    "enc-decoder-step": (
        "flashinfer_enc",
        Case(mode="CROSS", requests=(Request(7, 1, 6000), Request(3, 1, 70)), **DET),
    ),
}
# A CROSS prefill whose neighbours move fa2's query tile (found by cases/test_deterministic.py).
PREFILL_TILE_CASE = Case(mode="CROSS", requests=(Request(0, 24, 6000), Request(0, 5, 70)), **DET)


def _qo_tile(qo_lens: list[int], group: int) -> int:
    """FlashInfer fa2's query tile for head_dim 128 (FA2DetermineCtaTileQ): from the batch's mean."""
    avg = sum(q * group for q in qo_lens) // len(qo_lens)
    return 128 if avg > 64 else 64 if avg > 16 else 16


def _tiles(case: Case, failing: str | None) -> tuple[int, int] | None:
    """fa2's query tile for the target alone and in the failing batch (a reduction order per batch)."""
    group = case.num_q_heads // case.num_kv_heads
    for name, reqs, _ in compositions(case, LONG_KV):
        if name == failing:
            alone = _qo_tile([case.requests[0].extend_len], group)
            return alone, _qo_tile([r.extend_len for r in reqs], group)
    return None


def _explain(case: Case, failing: str | None) -> str:
    tiles = _tiles(case, failing)
    return f"; fa2 query tile alone {tiles[0]}, in '{failing}' {tiles[1]}" if tiles else ""


@pytest.mark.parametrize("mutant,family", NUMERIC, ids=[f"{m.name.split('~')[1]}@{f}" for m, f in NUMERIC])
def test_mutant_is_caught(mutant, family):
    profiles.load("gpu")
    d = hunt(mutant, family)
    print(
        f"\n{mutant.name} on {family}: caught={d.caught} after {d.examples} examples, {d.seconds:.1f}s; "
        f"shrunk to {d.shrunk.to_json() if d.shrunk else None}; {d.reason}"
    )
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived {d.examples} examples of {family}"


# A long encoder request (FlashInfer splits its key range) next to a short one, both non-causal paths.
ENCODER_LONG = Case(mode="ENCODER_ONLY", requests=(Request(0, 6000), Request(0, 40)), head_dim=128)


@pytest.mark.parametrize("window", [-1, 1000])
@pytest.mark.parametrize("name", ["flashinfer_ragged", "flashinfer_paged"])
def test_a_long_encoder_request_passes(name, window):
    res = check_case(backends.load(name), ENCODER_LONG.replace(window_left=window), "cuda")
    print(f"\n{name} encoder 6000 + 40 tokens, window_left {window}: {res.reason}")
    assert res.status == "pass", res.failure_text()


@pytest.mark.parametrize("name", sorted(CAUGHT_BY_INVARIANCE))
def test_split_mutant_breaks_batch_invariance_where_the_healthy_adapter_keeps_it(name):
    mutant = by_name(name)
    case = CAUGHT_BY_INVARIANCE[name]
    healthy = check_invariance(backends.load(name.split("~")[0]), case, "cuda", LONG_KV)
    broken = check_invariance(mutant.make(), case, "cuda", LONG_KV)
    print(f"\n{name}: healthy: {healthy.reason}; mutant: {broken.reason}")
    assert healthy.passed, healthy.reason + _explain(case, healthy.failing)
    assert not broken.passed, f"{name} ({mutant.bug}) stayed batch-invariant: {broken.reason}"


@pytest.mark.parametrize("label", sorted(HEALTHY))
def test_healthy_adapter_is_batch_invariant(label):
    name, case = HEALTHY[label]
    res = check_invariance(backends.load(name), case, "cuda", LONG_KV)
    print(f"\n{label}: {res.reason}")
    assert res.passed, res.reason + _explain(case, res.failing)


def test_fa2_prefill_tile_follows_the_batch():
    """Why EXTEND and CROSS prefill declare no deterministic mode: the request moves with its batch.

    If a FlashInfer release keeps the query tile fixed, this fails: declare the mode again.
    """
    enc = backends.load("flashinfer_enc")
    assert enc.supports(PREFILL_TILE_CASE) == PREFILL_NOT_INVARIANT
    enc.supports = lambda case: None  # run what the adapter refuses
    res = check_invariance(enc, PREFILL_TILE_CASE, "cuda", LONG_KV)
    print(f"\nCROSS prefill: {res.reason}{_explain(PREFILL_TILE_CASE, res.failing)}")
    assert not res.passed, f"fa2 prefill stayed batch-invariant: {res.reason}"
    alone, there = _tiles(PREFILL_TILE_CASE, res.failing)
    assert alone != there, f"moved without a change of query tile ({alone}): {res.reason}"


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["decode_cc", "decode_tc"])
def test_plain_fa2_wrappers_drop_sinks(tensor_cores):
    """Why only flashinfer_paged declares sinks: the plain fa2 paths take `sinks=` and ignore it."""
    import flashinfer

    ws = workspace(torch.device("cuda"))
    k = torch.randn(4, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    sinks = torch.full((8,), 5.0, device="cuda")
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_tensor_cores=tensor_cores, backend=KERNEL_BACKEND
    )
    i32 = dict(dtype=torch.int32)
    dec.plan(
        torch.tensor([0, 2, 4], **i32),
        torch.tensor([0, 1, 2, 3], **i32),
        torch.tensor([16, 9], **i32),
        8,
        2,
        128,
        16,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )
    plain = dec.run(q, (k, v))
    with_sinks = dec.run(q, (k, v), sinks=sinks)
    assert torch.equal(plain, with_sinks), (
        "this decode path now honours sinks: declare them in flashinfer_dec"
    )


def test_sink_module_name_collision_is_there_on_exactly_the_releases_its_known_issue_names(tmp_path):
    """flashinfer_paged names each sink variant's module itself, so the suite no longer reaches the
    library's collision (known issue flashinfer-sink-module-name); this keeps it in view: FlashInfer's
    own wrapper, a bf16 then an e4m3 cache in one fresh process (its script's child mode), is wrong on
    the releases the entry names and right on any other, where the entry would need updating."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from harness.backends.versions import distribution_version
    from harness.checks.known_issues import KNOWN_ISSUES

    issue = next(i for i in KNOWN_ISSUES if i.id == "flashinfer-sink-module-name")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path)}  # nothing prebuilt shared
    run = subprocess.run(
        [sys.executable, str(root / issue.repro), "bf16", "e4m3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = [x for x in run.stdout.splitlines() if x.startswith("max err ")]
    assert line, f"no error printed (exit {run.returncode}): {run.stdout[-1500:]}{run.stderr[-1500:]}"
    wrong = float(line[-1].split()[2].rstrip(";")) > 0.05
    release = distribution_version(issue.library)
    if release in issue.versions:
        assert wrong, f"{issue.id} is gone on {release}: drop the release from the entry ({line[-1]})"
    else:
        assert not wrong, f"{issue.id} is there on {release} too: add the release to the entry ({line[-1]})"



SCRIPT = dict(num_q_heads=8, num_kv_heads=8, head_dim=128, dtype="bfloat16")


def encoder(tokens: int, window: int) -> Case:
    return Case(mode="ENCODER_ONLY", requests=(Request(0, tokens),), window_left=window, **SCRIPT)


@pytest.mark.parametrize("tokens,window", [(257, 1), (513, 1), (257, 8), (513, 8)])
def test_the_noncausal_window_issue_confirms_on_its_scripts_shape(tokens, window):
    assert noncausal_window(encoder(tokens, window), "cuda")


@pytest.mark.parametrize("tokens,window", [(4096, 1), (4096, 8), (4096, 64), (4096, 333), (257, 333)])
def test_the_noncausal_window_issue_does_not_confirm_where_the_kernel_is_right(tokens, window):
    """Inside the entry's predicate, yet the kernel is right: a failure there is the glue's."""
    case = encoder(tokens, window)
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == "flashinfer-noncausal-window"]
    assert issue.reaches(case)
    assert not noncausal_window(case, "cuda")


# Case C's window under the split chunk: wrong on 0.6.18.post1, right on 0.7.2.post1 (both on an H200).
WINDOW_UNDER_CHUNK_WRONG = distribution_version("flashinfer-python") == "0.6.18.post1"


def graph(kv_heads: int, q_len: int, window: int, max_kv: int, lens: list[int]) -> GraphCase:
    """The script's shape as a GraphCase: deterministic, page 16, one batch of `lens` keys."""
    mode = "DECODE" if q_len == 1 else "TARGET_VERIFY"
    chain = None if q_len == 1 else tuple(range(-1, q_len - 1))  # a verify chain: [-1, 0, 1, ...]
    batch = Case(
        mode=mode,
        requests=tuple(Request(n - q_len, q_len, tree=chain) for n in lens),
        window_left=window,
        deterministic=True,
        page_size=16,
        **{**SCRIPT, "num_kv_heads": kv_heads},
    )
    return GraphCase((batch,), len(lens), max_kv)


@pytest.mark.parametrize(
    "g,wrong",
    [
        (graph(8, 1, -1, 2049, [1, 1]), True),  # A: capture split, replay unsplit
        (graph(8, 3, -1, 2049, [3, 3, 3]), True),  # B: verify, the same
        (graph(2, 1, 745, 3200, [276, 745, 193]), WINDOW_UNDER_CHUNK_WRONG),  # C: a window under the chunk
        (graph(8, 1, -1, 2049, [2049, 2049]), False),  # D: the replay splits too
    ],
    ids=["A", "B", "C", "D"],
)
def test_the_graph_issue_confirms_on_its_scripts_cases_and_not_on_the_control(g, wrong):
    assert graph_unsplit_plan(g, "cuda") is wrong


@pytest.mark.skipif(
    distribution_version("flashinfer-python") != "0.6.18.post1", reason="flashinfer-python 0.6.18.post1 only"
)
@pytest.mark.parametrize("confirm", [far_negative_logits, far_negative_logits_auto], ids=["fa2", "auto"])
def test_the_far_negative_entries_confirm_on_the_sentinel_case_and_not_near_zero(confirm):
    sentinel = Case(
        mode="EXTEND", requests=(Request(10, 6),), logits="dominant", logit_offset=-3e4, head_dim=64,
        dtype="bfloat16",
    )
    assert confirm(sentinel, "cuda")
    assert not confirm(sentinel.replace(logit_offset=-120.0), "cuda")


@pytest.mark.skipif(
    distribution_version("flashinfer-python") != "0.6.18.post1"
    or not torch.cuda.is_available()
    or torch.cuda.get_device_capability()[0] != 9,
    reason="flashinfer-python 0.6.18.post1 on a Hopper GPU only",
)
def test_the_fp8_soft_cap_entry_confirms_on_the_failed_prefill_and_not_under_a_cap_far_above_it():
    assert fa3_fp8_prefill_soft_cap(FP8_CAPPED, "cuda")
    assert not fa3_fp8_prefill_soft_cap(FP8_CAPPED.replace(soft_cap=1e5), "cuda")


def reaches(issue_id: str, case: Case) -> bool:
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == issue_id]
    return issue.reaches(case)


def test_the_soft_cap_issue_confirms_on_the_failed_decode_and_extend():
    assert sglang_flashinfer_soft_cap(CAPPED_DECODE, "cuda")
    catalogue = dict(mode="EXTEND", requests=(Request(8, 6),), dtype="bfloat16", q_amplitude=8.0)
    assert sglang_flashinfer_soft_cap(CAPPED_DECODE.replace(**catalogue), "cuda")  # soft_capped_logits


def test_the_soft_cap_issue_does_not_confirm_where_the_cap_changes_nothing():
    small = CAPPED_DECODE.replace(q_amplitude=1.0, soft_cap=1000.0)
    assert reaches("sglang-flashinfer-soft-cap", small)
    assert not sglang_flashinfer_soft_cap(small, "cuda")


def test_the_ragged_window_issue_confirms_on_chunk_over_window_and_a_prefill():
    assert sglang_flashinfer_ragged_window(CHUNK_OVER_WINDOW, "cuda")
    assert sglang_flashinfer_ragged_window(CHUNK_OVER_WINDOW.replace(requests=(Request(0, 40),)), "cuda")


def test_the_ragged_window_issue_does_not_confirm_inside_the_window():
    """Every new token within W + 1 of the chunk's first: the unplanned window hides nothing there."""
    inside = CHUNK_OVER_WINDOW.replace(window_left=40)
    assert not reaches("sglang-flashinfer-ragged-window", inside)
    assert not sglang_flashinfer_ragged_window(inside, "cuda")


def test_the_fp8_prefix_issue_confirms_on_the_failed_extend_and_not_at_scales_of_one():
    assert sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX, "cuda")
    two = FP8_PREFIX.replace(requests=(Request(24, 4), Request(0, 3)))
    assert sglang_flashinfer_fp8_prefix_scales(two, "cuda")
    assert not sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX.replace(v_scale=1.0), "cuda")
