"""sglang_fa3: sglang's own FlashAttentionBackend with FA3 (sgl_kernel.flash_attn), on a Hopper GPU
with sglang's CUDA build; elsewhere unavailable with the reason.

What it supports is read from its code (sglang/srt/layers/attention/flashattention_backend.py, 0.5.17,
read again in each release through 0.5.23, where it holds):
decode and extend over a page table of the pool's pages, a sliding window (`window_size =
(layer.sliding_window_size, 0)`, both ends inclusive: W + 1 keys, the harness's count), the layer's
soft cap (`softcap=layer.logit_cap`), sinks (forward's `sinks`, handed to the kernel), cross layers
(the encoder's pages, is_encoder_decoder), encoder-only layers (causal False) and an FP8 E4M3 cache
(the query cast to the cache dtype, k_descale / v_descale from the layer's scales: declared
`fp8_queries`, so its output is judged over the queries rounded so; FA3's FP8 forward rounds the
softmax probabilities to E4M3 before P @ V: declared `fp8_probabilities`), TARGET_VERIFY
(a chain, topk 1: a causal pass over seq_lens + draft_token_num keys; a tree, topk > 1: a cascade of a
pass over the cached keys and one over each draft's ancestors, taken from the EagleVerifyInput's custom
mask) and DRAFT_EXTEND_V2 (an extend over the bumped seq_lens). Under a CUDA graph
(harness/backends/engines/sglang/graph.py) it captures DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2, the
modes of _init_full_cg_decode_metadata. Run on an H200 with 0.5.17 (docs/engines.md, "Results on the GPU").
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.base import Capabilities
from harness.backends.engines.sglang.graph import SglangGraphAdapter
from harness.backends.graph_glue import StaticInputs
from harness.core.batch import Batch
from harness.core.case import PAGE_SIZES, Case, case_traits
from harness.core.modes import Mode

TREE_FP8 = (
    "a verify tree's cascade runs its second pass over batch_size * draft_token_num one-query "
    "sequences with k_descale / v_descale expanded to (batch_size, heads) "
    "(FlashAttentionBackend.forward_extend): shapes FA3 does not take together"
)

FA3 = Capabilities.with_features(
    "window",
    "soft_cap",
    "sinks",
    "tree",
    "deterministic",
    modes=frozenset(
        {Mode.DECODE, Mode.EXTEND, Mode.CROSS, Mode.ENCODER_ONLY, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}
    ),
    dtypes=frozenset({"bfloat16", "float16"}),
    head_dims=frozenset({64, 96, 128, 192, 256}),
    page_sizes=frozenset(PAGE_SIZES),
    kv_dtypes=frozenset({"float8_e4m3fn"}),
    fp8_queries="FlashAttentionBackend.forward_extend and forward_decode cast the queries to the cache's "
    "dtype with no query scale, `q = q.to(self.kv_cache_dtype)`, passing only k_descale / v_descale "
    "(flashattention_backend.py, 0.5.17)",
    fp8_probabilities="FA3's FP8 forward (sgl_kernel.flash_attn, FlashAttention-3's hopper kernel) converts "
    "P to the FP8 element type before the P @ V GEMM, `convert_type_out(tOrP_acc, tOrP)` "
    "(mainloop_fwd_sm90_tma_gmma_ws.hpp), P = exp2(s - running max + 8) (softmax.h, Max_offset 8 for FP8), "
    "the row sum from the unrounded P",
    exclusive=frozenset({("window", "ENCODER_ONLY"), ("window", "tree"), ("sinks", "tree")}),
    # FlashAttentionBackend._init_full_cg_decode_metadata's modes (0.5.17 .. 0.5.23)
    graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
    why_not={
        "window+tree": "a sliding-window layer verifies a tree without the cascade, through "
        "_init_sliding_window_attn_spec_metadata's expanded metadata, which the adapter does not "
        "reason about yet",
        "sinks+tree": "a verify tree's cascade hands the sinks to both passes and merges them "
        "(FlashAttentionBackend.forward_extend, merge_state_v2_wrapper): the sink counts twice",
        "window+ENCODER_ONLY": "FlashAttentionBackend.forward_extend gives a non-causal layer the window "
        "(W, W): the left window on the right too",
        "window_right": "FlashAttentionBackend.forward_extend's two-sided window is (W, W), one "
        "sliding_window_size for both sides, not a separate right edge",
        "kv_dtype": "FA3 reads an FP8 cache as E4M3 only (forward_extend casts q to the cache dtype and "
        "passes k_descale / v_descale)",
        "hybrid_pool": "the adapter builds an MHATokenToKVPool, not sglang's SWAKVPool "
        "(use_sliding_window_kv_pool): not driven yet",
        "returns_lse": "FlashAttentionBackend.forward returns the output only",
        "kv_layout": "MHATokenToKVPool is NHD unless SGLANG_USE_HND_KVCACHE, which the adapter does not set",
    },
)


class SglangFA3(SglangGraphAdapter):
    name = "sglang_fa3"
    engine_backend = "sglang.srt.layers.attention.flashattention_backend:FlashAttentionBackend"
    attention_backend_name = "fa3"
    capabilities = FA3

    def supports(self, case: Case) -> str | None:
        """The capabilities, and no verify tree over an FP8 cache (TREE_FP8: the kv dtype is not a trait
        an `exclusive` pair can name)."""
        why = super().supports(case)
        if why is None and case.kv_dtype is not None and "tree" in case_traits(case):
            return TREE_FP8
        return why

    def forward_kwargs(self, batch: Batch) -> dict[str, Any]:
        return sink_kwargs(batch.sinks)

    def graph_forward_kwargs(self, static: StaticInputs) -> dict[str, Any]:
        return sink_kwargs(static.sinks)


def sink_kwargs(sinks: torch.Tensor | None) -> dict[str, Any]:
    """The layer's sink logits [Hq] in bfloat16, as sglang's gpt_oss.py holds them for this backend:
    sgl_kernel's FA3 takes no other dtype (float32 sinks raise "sinks must have dtype bfloat16", seen
    on an H200 with sglang-kernel 0.4.5)."""
    return {"sinks": sinks.to(torch.bfloat16)} if sinks is not None else {}


BACKENDS = {"sglang_fa3": SglangFA3}
