"""On the GPU: each FlashInfer known issue confirms itself on its own script's shapes, and only there.

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

from harness.backends.flashinfer_glue import why_unavailable
from harness.backends.versions import distribution_version
from harness.checks import known_issues
from harness.checks.engine_confirm import (
    sglang_flashinfer_fp8_prefix_scales,
    sglang_flashinfer_ragged_window,
    sglang_flashinfer_soft_cap,
)
from harness.checks.flashinfer_confirm import far_negative_logits, far_negative_logits_auto, noncausal_window
from harness.checks.flashinfer_graph_confirm import graph_unsplit_plan
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from tests.test_known_issues_sglang_flashinfer import CAPPED_DECODE, CHUNK_OVER_WINDOW, FP8_PREFIX

SKIP = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else why_unavailable()
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=str(SKIP))]

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
