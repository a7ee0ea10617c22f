"""sglang_flex: sglang's own TorchFlexAttnBackend (FlexAttention per request), on the CPU and CUDA.

What it supports is read from its code (sglang/srt/layers/attention/torch_flex_backend.py): causal
decode and extend with one block mask per request; no window (it never reads
`layer.sliding_window_size`), and its forward_extend raises NotImplementedError for cross and
encoder-only layers.
"""

from __future__ import annotations

from harness.backends.base import Capabilities
from harness.backends.engines.sglang.engine import SglangAdapter
from harness.core.case import PAGE_SIZES
from harness.core.modes import Mode

NO_SPEC = (
    "TorchFlexAttnBackend has no speculative-decoding path: it builds a causal block mask over seq_lens "
    "and reads no spec_info"
)
NOT_CAUSAL = "TorchFlexAttnBackend.forward_extend raises NotImplementedError for a non-causal layer"


class SglangFlex(SglangAdapter):
    name = "sglang_flex"
    engine_backend = "sglang.srt.layers.attention.torch_flex_backend:TorchFlexAttnBackend"
    capabilities = Capabilities.with_features(
        modes=frozenset({Mode.DECODE, Mode.EXTEND}),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        page_sizes=frozenset(PAGE_SIZES),
        devices=frozenset({"cpu", "cuda"}),
        why_not={
            str(Mode.TARGET_VERIFY): NO_SPEC,
            str(Mode.DRAFT_EXTEND_V2): NO_SPEC,
            str(Mode.CROSS): NOT_CAUSAL,
            str(Mode.ENCODER_ONLY): NOT_CAUSAL,
            "window": "TorchFlexAttnBackend never reads layer.sliding_window_size",
            "window_right": "TorchFlexAttnBackend never reads layer.sliding_window_size",
            "soft_cap": "TorchFlexAttnBackend never reads layer.logit_cap",
            "sinks": "TorchFlexAttnBackend takes no sinks",
            "hybrid_pool": "TorchFlexAttnBackend has no SWA-pool path",
            "deterministic": "sglang's deterministic inference covers the flashinfer, fa3 and triton "
            "backends, not flex",
            "kv_dtype": "TorchFlexAttnBackend reads the cache buffers as they are, without the layer's "
            "FP8 scales",
            "returns_lse": "TorchFlexAttnBackend returns no log-sum-exp",
            "tree": NO_SPEC,
            "graph": "TorchFlexAttnBackend has no CUDA-graph path (no init_cuda_graph_state)",
            "kv_layout": "MHATokenToKVPool is NHD unless SGLANG_USE_HND_KVCACHE, which this backend "
            "does not read",
        },
    )


BACKENDS = {"sglang_flex": SglangFlex}
