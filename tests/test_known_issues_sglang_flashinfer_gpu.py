"""On the GPU: the sglang FlashInfer entries confirm themselves on the cases sglang_flashinfer failed on
an H200 (sglang 0.5.17, flashinfer-python 0.6.18.post1), and not where FlashInfer called sglang's way
is right: a soft cap that changes nothing at small logits, a chunk of new tokens inside the window, an
FP8 cache of scales 1.
Skipped, with the reason, without CUDA or a supported flashinfer.
"""

from __future__ import annotations

import pytest
import torch

from harness.backends.flashinfer_glue import why_unavailable
from harness.checks import known_issues
from harness.checks.engine_confirm import (
    sglang_flashinfer_fp8_prefix_scales,
    sglang_flashinfer_ragged_window,
    sglang_flashinfer_soft_cap,
)
from harness.core.case import Case, Request
from tests.sglang_flashinfer_cases import CAPPED_DECODE, CHUNK_OVER_WINDOW, FP8_PREFIX

SKIP = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else why_unavailable()
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=str(SKIP))]


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
