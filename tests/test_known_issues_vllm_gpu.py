"""On a Hopper GPU with vLLM's CUDA build: the FA3 graph window entry confirms on the graphs the suite
failed and not where FA3 plans the capture and the replays alike.

known issue vllm-fa3-graph-window-metadata: a replay whose requests all fit the window is planned by
FA3 without it (and, at one query per request and a head size of 64 or less, without the causal mask),
the capture at max_model_len with it. The suite's failing graphs on an H200 (vllm 0.26.0) were window 0,
4 heads of 32, one request of one key (next_token-swa; spec-swa the same as a verify of one draft).
Skipped, with the reason, without CUDA or vLLM's FA3.
"""

from __future__ import annotations

import pytest
import torch

from harness.checks import library
from harness.checks.engine_confirm import vllm_fa3_graph_window_metadata as confirm
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase

SKIP = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else None
    if library("vllm.vllm_flash_attn") is not None
    else "vLLM's CUDA build (vllm.vllm_flash_attn) is not installed"
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=str(SKIP))]

LAYER = dict(num_q_heads=4, num_kv_heads=4, head_dim=32, dtype="bfloat16", window_left=0)


def decode(*prefixes: int, **fields) -> Case:
    return Case(mode="DECODE", requests=tuple(Request(p, 1) for p in prefixes), **{**LAYER, **fields})


def test_the_fa3_graph_window_issue_confirms_on_the_suites_failing_graphs():
    assert confirm(GraphCase((decode(0), decode(0)), 1, 1), "cuda")  # next_token-swa
    verify = Case(mode="TARGET_VERIFY", requests=(Request(0, 1, tree=(-1,)),), **LAYER)
    assert confirm(GraphCase((verify, verify), 1, 2), "cuda")  # spec-swa


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
