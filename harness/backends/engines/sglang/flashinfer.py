"""sglang_flashinfer: sglang's own FlashInferAttnBackend (FlashInfer's paged and ragged wrappers), on a
GPU with sglang's CUDA build and flashinfer-python; elsewhere unavailable with the reason.

What it supports is read from its code (sglang/srt/layers/attention/flashinfer_backend.py, 0.5.17,
read again in each release through 0.5.23, where it holds):
decode and extend (with or without a cached prefix) over token-granular KV indices (the wrappers are
planned with page size 1 whatever the pool's page size), a sliding window (the model runner's
`sliding_window_size` gives two wrappers, WrapperDispatch.SLIDING_WINDOW; a decode keeps the last W + 1
keys, `seq_lens` clamped to `sliding_window_size + 1`, and extend passes `window_left` =
`layer.sliding_window_size`: W + 1 keys, the harness's count), the layer's soft cap, encoder-only
layers (non-causal ragged prefill), an FP8 cache read with the layer's k_scale / v_scale, TARGET_VERIFY
(chains and trees: init_forward_metadata plans `prefill_wrappers_verify` from the EagleVerifyInput's
generate_attn_arg_prefill, whose custom mask carries the tree) and DRAFT_EXTEND_V2 (its eager path plans
an extend over the cached prefix from the ForwardBatch, spec_info unread). Under a CUDA graph
(harness/backends/engines/sglang/graph.py) it captures DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2, the
modes of init_forward_metadata_out_graph. Run on an H200 with 0.5.17, eagerly (docs/engines.md): two of
its paths drop what the layer declares, FlashInfer compiling both into the kernel plan() picks while
sglang passes them to forward() only: the soft cap on every wrapper, the window on the ragged prefill
(known issues sglang-flashinfer-soft-cap and sglang-flashinfer-ragged-window).

With an FP8 cache nothing is rounded to FP8 but the cache (no `fp8_queries`, no `fp8_probabilities`):
the paged prefill and decode wrappers are built with backend "fa2" (FlashInferAttnBackend.__init__,
`self.prefill_backend = "fa2"`, `self.decode_backend = "fa2"`) and planned with the model's dtype for
the queries (`q_data_type = model_runner.dtype`); an FP8 cache makes the decode use tensor cores
(should_use_tensor_core), i.e. fa2's prefill kernel. fa2 (FlashInfer 0.6.18.post1) dequantizes K and V
to the query's dtype and keeps P in it (include/flashinfer/attention/prefill.cuh, compute_sfm_v:
`vec_cast<DTypeQ, float>` of P, `vec_cast<DTypeQ, DTypeKV>` of V) or in fp32 (decode.cuh). The ragged
wrapper's "auto" may pick fa3 on Hopper, but over the batch's new keys and values in the model's dtype,
not the cache.
"""

from __future__ import annotations

from harness.backends.base import Capabilities
from harness.backends.engines.sglang.graph import SglangGraphAdapter
from harness.backends.versions import distribution_version, pinned_requirement
from harness.core.case import PAGE_SIZES
from harness.core.modes import Mode

FLASHINFER = Capabilities.with_features(
    "window",
    "soft_cap",
    "tree",
    "deterministic",
    modes=frozenset({Mode.DECODE, Mode.EXTEND, Mode.ENCODER_ONLY, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
    dtypes=frozenset({"bfloat16", "float16"}),
    head_dims=frozenset({64, 128, 256}),
    page_sizes=frozenset(PAGE_SIZES),
    kv_dtypes=frozenset({"float8_e4m3fn", "float8_e5m2"}),
    exclusive=frozenset({("window", "ENCODER_ONLY"), ("window", "TARGET_VERIFY")}),
    # FlashInferAttnBackend.init_forward_metadata_out_graph's branches (0.5.17 .. 0.5.23)
    graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
    why_not={
        "window+TARGET_VERIFY": "with a window the verify is planned per wrapper from "
        "EagleVerifyInput.generate_attn_arg_prefill, which takes no kv_start_idx: the window wrapper's "
        "trimmed key counts are read from the start of the request's row, not its end "
        "(FlashInferIndicesUpdaterPrefill.update_sliding_window / call_begin_forward)",
        str(Mode.CROSS): "forward_extend's ragged path (taken unless deterministic inference or "
        "SGLANG_FLASHINFER_USE_PAGED) plans K/V at the queries' own indptr "
        "(FlashInferIndicesUpdaterPrefill.call_begin_forward: wrapper_ragged.begin_forward(qo_indptr, "
        "qo_indptr, ...)) and, for a cross layer given no K/V, reads the pool's buffer from slot 0",
        "window+ENCODER_ONLY": "an encoder-only extend without a prefix runs prefill_wrapper_ragged.forward, "
        "which is given no window_left (FlashInferAttnBackend.forward_extend)",
        "window_right": "RadixAttention has no right edge for a window",
        "sinks": "FlashInferAttnBackend.forward_extend / forward_decode take no sinks",
        "hybrid_pool": "the adapter builds an MHATokenToKVPool, not sglang's SWAKVPool, whose slots "
        "_resolve_swa_kv_pool translates: not driven yet",
        "returns_lse": "FlashInferAttnBackend.forward returns the output only",
        "kv_layout": "FlashInferAttnBackend builds every wrapper with the 'NHD' layout",
    },
)


GRAPH_WINDOW_DRAFT_EXTEND = (
    "with a window, a captured DRAFT_EXTEND_V2 is planned per wrapper from the EagleDraftExtendInput's "
    "generate_attn_arg_prefill (init_forward_metadata_out_graph passes spec_info), which takes no "
    "kv_start_idx and gets no window_left (FlashInferIndicesUpdaterPrefill.update_sliding_window)"
)


class SglangFlashInfer(SglangGraphAdapter):
    name = "sglang_flashinfer"
    engine_backend = "sglang.srt.layers.attention.flashinfer_backend:FlashInferAttnBackend"
    attention_backend_name = "flashinfer"
    requires = (
        *SglangGraphAdapter.requires,
        ("flashinfer-python", "FlashInfer, whose wrappers the backend plans and runs"),
    )
    capabilities = FLASHINFER

    def graph_window_reason(self, mode: Mode) -> str | None:
        """What the eager path runs and the graph path does not: a windowed draft extend."""
        return GRAPH_WINDOW_DRAFT_EXTEND if mode == Mode.DRAFT_EXTEND_V2 else None

    def graph_mode_reason(self, mode: Mode) -> str | None:
        """A captured DRAFT_EXTEND_V2 replays through sglang's fast_prefill_plan, which calls FlashInfer's
        private `_cached_module.plan(*args)` with the argument list of the FlashInfer release the sglang
        release pins (0.5.17 pins 0.6.15.post1 and passes 19; 0.6.18.post1's plan takes 20): on any
        other FlashInfer the replay raises a TypeError, a mismatch of the environment, not sglang's bug."""
        if mode != Mode.DRAFT_EXTEND_V2:
            return None
        pin = pinned_requirement("sglang", "flashinfer-python")
        installed = distribution_version("flashinfer-python")
        if pin is None or installed is None or pin.specifier.contains(installed, prereleases=True):
            return None
        return (
            f"sglang {distribution_version('sglang')} pins {pin.name}{pin.specifier} and "
            f"flashinfer-python {installed} is installed: a captured DRAFT_EXTEND_V2 replays through "
            "fast_prefill_plan, which calls FlashInfer's private _cached_module.plan with the pinned "
            "release's arguments"
        )


BACKENDS = {"sglang_flashinfer": SglangFlashInfer}
