"""vllm_cpu_attn: vLLM's CPU attention backend (`CPU_ATTN`, vllm/v1/attention/backends/cpu_attn.py).

The cache is vLLM's CPU layout, [blocks, kv heads, block size, 2 * head_dim] read as K rows then V
rows per (block, head); the write is `cpu_attn_reshape_and_cache` through `do_kv_cache_update`, the
forward `cpu_attention_with_kv_cache` over the builder's scheduler metadata. The kernel reads whole
blocks (`whole_page_loads`: the unowned tail of an owned block holds a finite canary; NaN there would
turn every output of the request NaN). Capabilities are what the backend declares in its code for
the supported releases, each lack with where vLLM says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from packaging.version import Version

from harness.backends.base import BackendOutput, Capabilities
from harness.backends.engines.vllm import CPU_BLOCKS_OF_32, CPU_SINKS_FLOAT32
from harness.backends.engines.vllm.driver import CPU_ENGINE, VllmEngine
from harness.core.batch import Batch
from harness.core.modes import Mode

CAPABILITIES = Capabilities.with_features(
    "window",
    "soft_cap",
    "sinks",
    "hybrid_pool",
    modes=frozenset(Mode),
    dtypes=frozenset({"bfloat16", "float16", "float32"}),  # CPUAttentionBackend.supported_dtypes
    head_dims=frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}),  # get_supported_head_sizes
    page_sizes=frozenset({32, 64, 128}),  # get_supported_kernel_block_sizes: MultipleOf(32) (0.28.0: 16)
    kv_layouts=frozenset({"NHD", "HND"}),  # the adapter copies either pool layout into vLLM's
    devices=frozenset({"cpu"}),
    kv_dtypes=frozenset({"float8_e4m3fn", "float8_e5m2"}),  # supported_kv_cache_dtypes fp8_e4m3, fp8_e5m2
    whole_page_loads=True,
    exclusive=frozenset({("soft_cap", "ENCODER_ONLY"), ("window", "ENCODER_ONLY")}),
    why_not={
        "window_right": "vLLM has no two-sided encoder window: a layer has one `sliding_window`",
        "window+ENCODER_ONLY": "vLLM's CPU attention applies an encoder-only layer's `sliding_window` to "
        "both sides of the query; the harness's one-sided encoder window has no vLLM equivalent",
        "soft_cap+ENCODER_ONLY": "CPUAttentionBackendImpl warns that it does not support a logits soft cap "
        "for ENCODER and ENCODER_ONLY layers ('outputs may be slightly off')",
        "deterministic": "CPUAttentionBackend does not declare batch invariance (supports_batch_invariance "
        "is False; VLLM_BATCH_INVARIANT is a GPU mode)",
        "returns_lse": "the CPU attention forward writes the output only",
        "tree": "vLLM verifies draft trees through its TREE_ATTN backend only; CPU_ATTN verifies chains",
        "graph": "no CUDA graphs on the CPU",
    },
)


# Before versions.CPU_BLOCKS_OF_32, get_supported_kernel_block_sizes is MultipleOf(16).
CAPABILITIES_BLOCKS_OF_16 = dataclasses.replace(CAPABILITIES, page_sizes=CAPABILITIES.page_sizes | {16})


class VllmCpuAttn(VllmEngine):
    name = "vllm_cpu_attn"
    engine = CPU_ENGINE  # vLLM's CPU build only
    engine_backend = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """The installed release's declarations: blocks of 16 too before versions.CPU_BLOCKS_OF_32."""
        release = self.release()
        if release is not None and Version(release) < Version(CPU_BLOCKS_OF_32):
            return CAPABILITIES_BLOCKS_OF_16
        return CAPABILITIES

    def supports(self, case: Any) -> str | None:
        why = super().supports(case)
        if why or case.kv_dtype is None:
            return why
        if case.mode == Mode.ENCODER_ONLY:
            return (
                "vLLM's CPU builder stages an encoder-only layer's K/V in a scratch cache of the model's "
                "dtype, which its FP8 write rejects ('key_cache must be uint8 for FP8 path'): an "
                "encoder-only layer keeps no KV cache to quantize"
            )
        if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
            return "vLLM's CPU attention reads an FP8 KV cache only on x86 with AVX-512 or AMX"
        if case.page_size % 32:
            return (
                "vLLM's CPU attention runs blocks of 16 with its `vec16` kernel, which has no FP8 cache "
                "variant ('Unsupported CPU attention configuration: ... isa=2 kv_cache_idx=1'; vllm-cpu "
                "0.28.0, which declares blocks of 16)"
            )
        return None

    def run(self, batch: Batch) -> BackendOutput:
        # A serving process has run bf16 linear layers through oneDNN before its first attention, which
        # asks Linux for the AMX tile state; vLLM's AMX attention kernel does not ask for it itself
        # (known issue vllm-cpu-amx-permission): this stands in for those earlier layers.
        torch._C._cpu._init_amx()
        return super().run(batch)

    def sinks(self, batch: Batch) -> torch.Tensor:
        """float32 where the release's layer takes it; before versions.CPU_SINKS_FLOAT32 bf16, the one
        dtype that release's kernel reads, whatever the layer's (known issue vllm-cpu-sinks-bf16-only:
        a float16 or float32 model's sinks parameter, in the model's dtype, raises there)."""
        if Version(self.release() or "0") >= Version(CPU_SINKS_FLOAT32):
            return super().sinks(batch)
        return batch.sinks.to(torch.bfloat16)

    def kv_cache(self, batch: Batch, layer: Any, num_pages: int | None = None) -> torch.Tensor:
        """[blocks, kv heads, block size, 2 * head_dim] in the layer's cache dtype (CPU_ATTN's LBHNC)."""
        case = batch.case
        blocks = batch.pool.num_pages if num_pages is None else num_pages
        shape = (blocks, case.num_kv_heads, case.page_size, 2 * case.head_dim)
        return torch.empty(shape, dtype=layer.kv_cache_torch_dtype, device=batch.device)


BACKENDS = {"vllm_cpu_attn": VllmCpuAttn}
