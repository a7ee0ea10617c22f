"""vLLM's CUDA attention backends: FlashAttention (`FLASH_ATTN`, vllm/v1/attention/backends/flash_attn.py)
and FlashInfer (`FLASHINFER`, flashinfer.py), driven like the CPU adapters (driver.py) on a GPU with
vLLM's CUDA build (`vllm`) installed; elsewhere unavailable with the reason.

Capabilities are what vLLM 0.32's code declares for these classes, read from it on a machine without a
GPU (docs/engines.md says what ran on a GPU). Features vLLM decides per device at run time (FA3's sinks
and FP8 cache, FlashInfer's sinks) are left out, each with where vLLM decides; the one refusal vLLM
raises on a known device, FlashInfer's windows on compute capability 9.0 before 0.30, which
requests' queries FlashInfer casts to an FP8 cache's dtype (the prefill requests' on 9.0, every one's
on 10.x) and, on 9.0, those requests' probabilities rounded to it by FlashInfer's FP8 prefill, are
decided on the device, in VllmFlashInfer.capabilities. Both replay under CUDA graphs
through vLLM's own full-cudagraph path (graph.py): the modes are what each metadata builder's
`cudagraph_support` lets vLLM's runner capture on every device of the supported releases.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import torch
from packaging.version import Version

from harness.backends.base import Capabilities
from harness.backends.engines.vllm import FLASHINFER_SM90_WINDOWS
from harness.backends.engines.vllm.driver import GPU_ENGINE, VllmEngine
from harness.backends.engines.vllm.graph import GRAPH_WHY, VllmGraph, graph_modes_for
from harness.core.modes import Mode

GPU_WHY = {
    "returns_lse": "the adapter reads the forward's output only",
    "tree": "vLLM verifies draft trees through its TREE_ATTN backend only",
    **GRAPH_WHY,
    "window_right": "vLLM has no two-sided encoder window: a layer has one `sliding_window`",
}

FLASH_ATTN = Capabilities.with_features(
    "window",
    "soft_cap",
    "hybrid_pool",
    "deterministic",  # supports_batch_invariance: run under VLLM_BATCH_INVARIANT (batch_invariance)
    modes=frozenset(Mode),  # supports_attn_type: DECODER, ENCODER, ENCODER_ONLY, ENCODER_DECODER
    dtypes=frozenset({"bfloat16", "float16"}),
    page_sizes=frozenset({16, 32, 64, 128}),  # get_supported_kernel_block_sizes: MultipleOf(16)
    kv_layouts=frozenset({"NHD", "HND"}),
    whole_page_loads=True,
    exclusive=frozenset({("window", "ENCODER_ONLY")}),
    # FlashAttentionMetadataBuilder._cudagraph_support: ALWAYS with FA3, UNIFORM_BATCH with FA2
    graph_modes=graph_modes_for("UNIFORM_BATCH"),
    why_not={
        **GPU_WHY,
        "sinks": "FlashAttentionBackend.supports_sink is FA3's flash_attn_supports_sinks(), decided per "
        "device at run time",
        "kv_dtype": "FlashAttentionBackend reads FP8 only where flash_attn_supports_kv_cache_dtype says so "
        "(FA3), decided per device at run time",
        "window+ENCODER_ONLY": "vLLM gives an encoder-only layer one `sliding_window` for both sides",
    },
)

FLASHINFER = Capabilities.with_features(
    "window",
    "soft_cap",
    "hybrid_pool",
    modes=frozenset(Mode) - {Mode.CROSS, Mode.ENCODER_ONLY},  # supports_attn_type: the decoder's
    dtypes=frozenset({"bfloat16", "float16"}),
    head_dims=frozenset({64, 128, 256, 512}),  # get_supported_head_sizes
    page_sizes=frozenset({16, 32, 64}),  # get_supported_kernel_block_sizes off Blackwell's trtllm-gen
    kv_layouts=frozenset({"NHD", "HND"}),
    kv_dtypes=frozenset({"float8_e4m3fn", "float8_e5m2"}),  # supported_kv_cache_dtypes fp8_e4m3, fp8_e5m2
    whole_page_loads=True,
    # FlashInferMetadataBuilder.get_cudagraph_support: UNIFORM_SINGLE_TOKEN_DECODE unless trtllm-gen serves
    graph_modes=graph_modes_for("UNIFORM_SINGLE_TOKEN_DECODE"),
    why_not={
        **GPU_WHY,
        "graph TARGET_VERIFY": "FlashInferMetadataBuilder.get_cudagraph_support returns UNIFORM_BATCH "
        "(verify graphs) only where trtllm-gen (0.32: or XQA) decode serves the layer, decided per "
        "device and release; elsewhere UNIFORM_SINGLE_TOKEN_DECODE (0.26.0 on Hopper always)",
        "CROSS": "FlashInferBackend declares the decoder's attention type only",
        "ENCODER_ONLY": "FlashInferBackend declares the decoder's attention type only",
        "sinks": "FlashInferBackend.supports_sink holds on Blackwell's trtllm-gen only, decided per device",
        "deterministic": "FlashInferBackend does not declare batch invariance (supports_batch_invariance is "
        "AttentionBackend's False), although its builder fixes its split sizes under VLLM_BATCH_INVARIANT",
    },
)


SM90_WINDOWS = (
    "vLLM's FlashInferMetadataBuilder refuses a window on a device of compute capability 9.0 (vllm < "
    f"{FLASHINFER_SM90_WINDOWS}): 'FlashInfer backend on SM90 currently crashes with sliding-window "
    "attention layers. Use the default attention backend.'"
)
# FLASHINFER on a device where the installed release's builder raises on a windowed layer: no window,
# and so no hybrid pool (only a window layer reads the SWA pool).
FLASHINFER_NO_WINDOWS = dataclasses.replace(
    FLASHINFER,
    window=False,
    hybrid_pool=False,
    why_not={**FLASHINFER.why_not, "window": SM90_WINDOWS, "hybrid_pool": SM90_WINDOWS},
)


# Where the builder casts the queries to an FP8 cache's dtype (0.26.0 and 0.32.0 read): on a device of
# compute capability 9.0, only the prefill requests' (FA3 prefill takes FP8 queries, XQA decode the
# model dtype); on 10.x, every request's (trtllm-gen); elsewhere none (FA2 only).
FLASHINFER_FP8_QUERIES = (
    "FlashInferMetadataBuilder.get_q_data_type gives the cache's FP8 dtype (model dtype for decodes on "
    "capability 9.0, where use_trtllm_attention is not False; every request's on 10.x) and "
    "FlashInferImpl.forward's maybe_quant_query casts the slice to it with layer._q_scale (1)"
)
# What those FP8 queries reach on capability 9.0 (FlashInfer 0.6.18.post1 read): the prefill wrapper's
# backend "auto" picks fa3 for an FP8 query over an FP8 cache (utils.py is_fa3_backend_supported; fa2
# takes no FP8 query, jit/attention/modules.py), whose FP8 kernel rounds P to the cache's dtype times
# the dtype's largest value. The decode requests keep the model dtype: the tensor-core decode's "auto"
# is fa2 there (decode.py plan), which, as every fa2 path, dequantizes K/V to the query's dtype and
# keeps P in it (prefill.cuh compute_sfm_v) or in fp32 (decode.cuh): nothing rounded to FP8. That is
# the decode of a machine without FlashInfer's cubins (the H200 run logged decode_backend=
# flashinfer-native: vLLM's has_nvidia_artifactory was False). With them vLLM decodes through XQA,
# whose sm90 FP8 kernel (csrc/xqa/mha_sm90.cu, MathElem = CacheElem) casts the decode queries to e4m3
# and rounds their P times 448 too: not declared here. On 10.x the FP8 queries go to trtllm-gen's
# closed kernels: not read, nothing declared. The FP8 kernel also has no soft cap
# (DefaultFP8Attention's LogitsTransform returns the logits; prefill.py's FP8 paged_run is passed no
# logits_soft_cap): a soft-capped prefill over an FP8 cache on 9.0 is judged against the capped
# reference like any other, not excused.
FLASHINFER_FP8_PROBABILITIES = (
    "FlashInfer's sm90 FP8 prefill (DefaultFP8Attention, hopper/quantization/mainloop_mma.cuh mma_fp8) "
    "multiplies P = exp2(s - running max) by p_scale = numeric_limits<DTypeKV>::max() (448 in e4m3, "
    "StandardFP8Attention.PQuantize, hopper/variants.cuh) and converts it, `convert_type<DTypeKV>(tSrS)`, "
    "before the P @ V GEMM; the row sum from the unrounded P (attention_updater.cuh), v_scale / p_scale at "
    "finalize"
)


@cache
def device_capability() -> tuple[int, int] | None:
    """(major, minor) of CUDA device 0, the device vLLM's `current_platform.is_device_capability` asks
    about; None without a CUDA device."""
    return torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None


class VllmFlashAttn(VllmEngine, VllmGraph):
    name = "vllm_flash_attn"
    engine = GPU_ENGINE  # vLLM's CUDA build only
    engine_backend = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
    capabilities = FLASH_ATTN


class VllmFlashInfer(VllmEngine, VllmGraph):
    name = "vllm_flashinfer"
    engine = GPU_ENGINE  # vLLM's CUDA build only
    engine_backend = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        """FLASHINFER, less windows where the builder refuses them (refuses_windows), with the queries
        cast to an FP8 cache's dtype where the builder casts them (fp8_query_rows), and on capability
        9.0 those requests' probabilities rounded to it by FlashInfer's FP8 prefill
        (FLASHINFER_FP8_PROBABILITIES: P times the dtype's largest value)."""
        caps = FLASHINFER_NO_WINDOWS if self.refuses_windows() else FLASHINFER
        rows = self.fp8_query_rows()
        if rows is None:
            return caps
        caps = dataclasses.replace(caps, fp8_queries=FLASHINFER_FP8_QUERIES, fp8_query_rows=rows)
        if device_capability() != (9, 0):
            return caps
        return dataclasses.replace(
            caps, fp8_probabilities=FLASHINFER_FP8_PROBABILITIES, fp8_probability_scale="dtype max"
        )

    def fp8_query_rows(self) -> str | None:
        """Which requests' queries the builder casts to an FP8 cache's dtype here (base.FP8_QUERY_ROWS),
        None for none: get_q_data_type's own device tests, the same in 0.26.0 and 0.32.0. On
        capability 9.0 the decode requests keep the model dtype (the adapter leaves vLLM's
        use_trtllm_attention and disable_flashinfer_q_quantization unset), so only the prefill ones, as
        split_decodes_and_prefills splits the batch (judged_inputs.prefill_requests); on 10.x
        (`is_device_capability_family(100)`) every request's."""
        capability = device_capability()
        if capability == (9, 0):
            return "prefill"
        if capability is not None and capability[0] == 10:
            return "all"
        return None

    def refuses_windows(self) -> bool:
        """Whether the installed release's FlashInferMetadataBuilder raises on a windowed layer here:
        a release before versions.FLASHINFER_SM90_WINDOWS on a device of compute capability 9.0, the
        builder's own test (`current_platform.is_device_capability(90)`). The release is read from its
        metadata and the device from torch, so deciding imports no vLLM."""
        release = self.release()
        if release is None or Version(release) >= Version(FLASHINFER_SM90_WINDOWS):
            return False
        return device_capability() == (9, 0)


BACKENDS = {"vllm_flash_attn": VllmFlashAttn, "vllm_flashinfer": VllmFlashInfer}
