"""fa3: FlashAttention-3 (`flash_attn_interface.flash_attn_with_kvcache`, Hopper) over the paged pool.

Queries are varlen (`cu_seqlens_q`, `max_seqlen_q`), keys come through `page_table` +
`cache_seqlens` (any page size). FA3 spells "no window" -1: `window_size=(-1, -1)` with
`causal=True` is plain causal, `(W, 0)` a window. `num_splits=0` lets FA3 pick a split count
from the batch, so deterministic mode pins it to 1. FA3 has no learnable-sink argument and no
mask hook, so sinks and verify trees (topk > 1) are declared unsupported. Under a CUDA graph it
captures DECODE, TARGET_VERIFY (chains) and DRAFT_EXTEND_V2 over the buffers of
flash_attn_glue.py's graph path (cache_seqlens, cu_seqlens_q, page_table), as sglang does.

Only tested against a recording fake of the library here: FA3 cannot be installed on the device
machine this project runs on.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.backends.base import BackendOutput
from harness.backends.flash_attn_glue import FlashAttnGlue, capabilities
from harness.backends.graph_glue import GraphState, StaticInputs
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.transfer import to_device


class FA3(FlashAttnGlue):
    name = "fa3"
    library = "flash-attn-3"
    entry = ("flash_attn_interface", "flash_attn_with_kvcache")
    capabilities = capabilities(
        ("window", "window_right", "soft_cap", "hybrid_pool", "deterministic", "returns_lse"),
        whole_page_loads=True,
        graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
        why_not={
            "sinks": "FA3's flash_attn_with_kvcache has no learnable-sink argument",
            "tree": "FA3 has no custom mask: verify trees with topk > 1 need one",
            "kv_dtype": "FA3 reads FP8 only with the query in the cache's FP8 dtype too (q and k must "
            "share a dtype): an FP8 cache under a bf16/fp16 query has no path",
        },
    )

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):  # the varlen metadata: extents and page table
            extents = self.kv_extents(batch)
            meta = dict(
                cache_seqlens=to_device(np.asarray(extents, dtype=np.int32), batch.device),
                page_table=self.page_table(batch, extents),
                cu_seqlens_q=batch.qo_indptr,
                max_seqlen_q=max(batch.cpu_list("extend_lens")),
            )
        out, lse, *_ = self.kernel()(
            batch.q,
            batch.pool.k,
            batch.pool.v,
            **meta,
            softmax_scale=batch.case.scale,
            causal=self.causal(batch),
            window_size=self.window_size(batch),
            softcap=batch.case.soft_cap,
            num_splits=self.num_splits(batch),
            return_softmax_lse=True,
        )
        return BackendOutput(out=out, lse=self.lse_rows(lse))


    def graph_kernel(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        b, bs, layer = state.buffers, static.bs, state.layer
        out, *_ = self.kernel()(
            static.q,
            static.pool.k,
            static.pool.v,
            cache_seqlens=b["cache_seqlens"][:bs],
            page_table=b["page_table"][:bs],
            cu_seqlens_q=b["cu_seqlens_q"][: bs + 1],
            max_seqlen_q=state.limits.queries,
            softmax_scale=layer.case.scale,
            causal=self.causal(layer),
            window_size=self.window_size(layer),
            softcap=layer.case.soft_cap,
            num_splits=self.num_splits(layer),
            return_softmax_lse=True,
        )
        return out


BACKENDS = {"fa3": FA3}
