"""sglang_native: sglang's own TorchNativeAttnBackend (SDPA per request), on the CPU and CUDA.

What it supports is read from its code (sglang/srt/layers/attention/torch_native_backend.py, the
releases of engine.SGLANG): decode and extend with a sliding window (`layer.sliding_window_size`,
W + 1 keys, as the harness counts), cross attention (`layer.is_cross_attention`, keys from the
encoder's part of the row) and encoder-only layers (`AttentionType.ENCODER_ONLY`, no causal mask).
"""

from __future__ import annotations

from harness.backends.base import Capabilities
from harness.backends.engines.sglang.engine import SglangAdapter
from harness.core.case import PAGE_SIZES
from harness.core.modes import Mode

NO_SPEC = (
    "TorchNativeAttnBackend has no speculative-decoding path: forward_extend reads no spec_info, takes "
    "seq_lens as each request's whole KV extent and masks causally by index"
)


class SglangTorchNative(SglangAdapter):
    name = "sglang_native"
    engine_backend = "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend"
    capabilities = Capabilities.with_features(
        "window",
        modes=frozenset({Mode.DECODE, Mode.EXTEND, Mode.CROSS, Mode.ENCODER_ONLY}),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        page_sizes=frozenset(PAGE_SIZES),
        devices=frozenset({"cpu", "cuda"}),
        exclusive=frozenset({("window", "ENCODER_ONLY")}),
        why_not={
            str(Mode.TARGET_VERIFY): NO_SPEC,
            str(Mode.DRAFT_EXTEND_V2): NO_SPEC,
            "window+ENCODER_ONLY": "forward_extend passes sliding_window_size only to causal layers: an "
            "encoder-only layer's window is dropped",
            "window_right": "RadixAttention has no right edge for a window",
            "soft_cap": "TorchNativeAttnBackend never reads layer.logit_cap",
            "sinks": "TorchNativeAttnBackend takes no sinks (forward takes no `sinks` argument)",
            "hybrid_pool": "not checked yet: TorchNativeAttnBackend translates its KV write to the SWA "
            "pool but reads req_to_token's full-pool slots unchanged",
            "deterministic": "sglang's deterministic inference covers the flashinfer, fa3 and triton "
            "backends, not torch_native",
            "kv_dtype": "TorchNativeAttnBackend casts an FP8 cache to the query dtype without the "
            "layer's k_scale / v_scale",
            "returns_lse": "TorchNativeAttnBackend returns no log-sum-exp",
            "tree": NO_SPEC,
            "graph": "TorchNativeAttnBackend has no CUDA-graph path (no init_cuda_graph_state)",
            "kv_layout": "MHATokenToKVPool is NHD unless SGLANG_USE_HND_KVCACHE, which this backend "
            "does not read",
        },
    )


BACKENDS = {"sglang_native": SglangTorchNative}
