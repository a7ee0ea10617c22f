"""vllm_flex: vLLM's FlexAttention backend (`FLEX_ATTENTION`, vllm/v1/attention/backends/flex_attention.py),
on the CPU and on CUDA.

The cache is vLLM's flex layout, [blocks, kv heads, block size, 2 * head_dim] logically over a
[blocks, block size, kv heads, 2 * head_dim] buffer (KVCacheLayout.LBNHC: K then V in each token's
row); the write is `reshape_and_cache_flash` through `do_kv_cache_update`; the forward is
`flex_attention` compiled by torch.compile over the builder's block mask (direct build: each query's
pages from the block table, pruned to its window). A decoder window is causal and |q - k| < S; an
encoder-only one is |q - k| < S on both sides. Capabilities are what the backend's code declares: batch
invariance (`supports_batch_invariance`; VLLM_BATCH_INVARIANT pins the kernel's 16 x 16 blocks and turns
IS_DIVISIBLE off) and CUDA graphs through vLLM's full-cudagraph path (graph.py), whose builder declares
`_cudagraph_support = ALWAYS` in every release read (0.26.0, 0.32.0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.backends.base import Capabilities
from harness.backends.engines.vllm.driver import GPU_ENGINE, VllmEngine
from harness.backends.engines.vllm.graph import GRAPH_WHY, PAD_SLOT, VllmGraph, graph_modes_for
from harness.core.batch import Batch
from harness.core.modes import Mode

CAPABILITIES = Capabilities.with_features(
    "window",
    "hybrid_pool",
    "deterministic",  # supports_batch_invariance: run under VLLM_BATCH_INVARIANT (batch_invariance)
    modes=frozenset(Mode) - {Mode.CROSS},  # supports_attn_type: DECODER and ENCODER_ONLY
    dtypes=frozenset({"bfloat16", "float16", "float32"}),  # FlexAttentionBackend.supported_dtypes
    page_sizes=frozenset({16, 32, 64, 128}),  # get_supported_kernel_block_sizes: MultipleOf(16)
    kv_layouts=frozenset({"NHD", "HND"}),  # the adapter writes either pool layout into vLLM's
    devices=frozenset({"cpu", "cuda"}),
    whole_page_loads=True,
    exclusive=frozenset({("window", "ENCODER_ONLY")}),
    graph_modes=graph_modes_for("ALWAYS"),  # FlexAttentionMetadataBuilder._cudagraph_support
    why_not={
        **GRAPH_WHY,
        "CROSS": "FlexAttentionImpl raises NotImplementedError for ENCODER_DECODER attention",
        "window_right": "vLLM has no two-sided encoder window of its own: a layer has one `sliding_window`",
        "window+ENCODER_ONLY": "vLLM's flex sliding window is |q - k| < S on both sides for an encoder-only "
        "layer; the harness's one-sided encoder window has no vLLM equivalent",
        "soft_cap": "FlexAttentionImpl raises NotImplementedError for a logits soft cap",
        "sinks": "FlexAttentionBackend does not support attention sinks (supports_sink is False)",
        "kv_dtype": "FlexAttentionImpl raises NotImplementedError for a quantized KV cache",
        "returns_lse": "the flex forward writes the output only",
        "tree": "vLLM verifies draft trees through its TREE_ATTN backend only; FLEX_ATTENTION verifies "
        "chains",
    },
)

# vLLM's CPU build: CpuPlatform keeps the platform's support_static_graph_mode() False, so VllmConfig
# sets cudagraph_mode NONE and no builder keeps full-cudagraph state (check_full_decode_mode would raise).
CPU_BUILD = dataclasses.replace(
    CAPABILITIES,
    graph_modes=frozenset(),
    why_not={
        **CAPABILITIES.why_not,
        "graph": "vLLM's CPU build captures no CUDA graphs (VllmConfig sets cudagraph_mode NONE where "
        "the platform's support_static_graph_mode() is False, as CpuPlatform's is)",
    },
)


class VllmFlex(VllmEngine, VllmGraph):
    name = "vllm_flex"
    engine_backend = "vllm.v1.attention.backends.flex_attention.FlexAttentionBackend"

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """CAPABILITIES under vLLM's CUDA build; CPU_BUILD, without CUDA graphs, under its CPU build."""
        return CAPABILITIES if self.engine is GPU_ENGINE else CPU_BUILD

    def make_layer(self, batch: Batch, config: Any) -> Any:
        """vLLM's layer, built with dynamo's caches emptied. vLLM compiles flex_attention with
        fullgraph=True under a recompile limit of 16 (flex_attention.py), which one serving process of
        one model stays within; a check runs many models' shapes in one process and hit that limit on an
        H200 (FailOnRecompileLimitHit), so each layer compiles as a fresh process would. On the CPU it
        also avoids torch 2.13.0+cpu's failed rebuild with dynamic shapes (`cur_kvSplitSize4` undeclared;
        docs/engines.md)."""
        torch._dynamo.reset()
        return super().make_layer(batch, config)

    def has_cache_write(self) -> bool:
        """Whether vLLM's build registers the flex cache write's op (`_C_cache_ops.reshape_and_cache_flash`):
        its CUDA build does; its CPU build does not (its CPU platform never selects FLEX_ATTENTION for a
        decoder, docs/engines.md)."""
        return hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash")

    def store(
        self,
        batch: Batch,
        layer: Any,
        kv_cache: torch.Tensor,
        slots: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """K/V at `slots` through FlexAttentionImpl.do_kv_cache_update where the build has its op; else laid
        out as that method's own views lay them ((B, H, N, 2 * D) -> (B, N, H, D) key and value halves),
        the way vLLM's attention tests prepopulate a cache, skipping a padding token's slot (-1) as the
        op does."""
        if self.has_cache_write():
            super().store(batch, layer, kv_cache, slots, k, v)
            return
        d = batch.case.head_dim
        key, value = kv_cache.transpose(1, 2).split(d, dim=-1)
        heads = batch.case.num_kv_heads
        real = slots != PAD_SLOT
        key.view(-1, heads, d)[slots[real]] = k[real].to(key.dtype)
        value.view(-1, heads, d)[slots[real]] = v[real].to(value.dtype)


BACKENDS = {"vllm_flex": VllmFlex}
