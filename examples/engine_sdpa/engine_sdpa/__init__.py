"""An engine's SDPA fallback as an attn-harness backend plugin (docs/backends.md).

Written the way an engine team writes its glue: from the forward's metadata alone (seq_lens,
qo_indptr, positions, req_to_token, out_cache_loc) and the layer's KV pool, not from the harness's
own adapters. It handles DECODE and EXTEND (with or without a cached prefix), a sliding window and
GQA; everything else it declares unsupported, so those cases are skips with the reason, never passes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.api import Backend, BackendOutput, Batch, Capabilities, Mode


class EngineSDPA(Backend):
    name = "sdpa_fallback"  # the harness renames it to its entry point's name, engine_sdpa
    library = "torch"
    capabilities = Capabilities(
        modes=frozenset({Mode.DECODE, Mode.EXTEND}),
        devices=frozenset({"cpu", "cuda"}),
        window=True,
        why_not={
            "soft_cap": "SDPA has no logit soft cap",
            "sinks": "this fallback has no attention sinks",
            "hybrid_pool": "this engine has no hybrid SWA pool",
            "returns_lse": "SDPA does not return the log-sum-exp",
        },
    )

    def run(self, batch: Batch) -> BackendOutput:
        # The engine's cache write comes first: this forward's K/V go to their slots in the pool.
        batch.pool.write(batch.out_cache_loc, batch.k_new, batch.v_new)
        seq_lens = batch.cpu_list("seq_lens")  # DECODE and EXTEND: cached + new tokens = KV extent
        window = batch.case.window_left  # the layer's sliding window, -1 for none
        outs = []
        for r, kv_len in enumerate(seq_lens):
            q0, q1 = batch.query_span(r)  # qo_indptr[r], qo_indptr[r + 1]
            k, v = batch.pool.read(batch.req_to_token[r, :kv_len])  # [kv_len, Hkv, D] each
            query_pos = batch.positions[q0:q1].long()[:, None]
            key_pos = torch.arange(kv_len, device=batch.device)[None, :]
            visible = key_pos <= query_pos
            if window >= 0:
                visible &= key_pos >= query_pos - window
            q, k, v = (t.transpose(0, 1) for t in (batch.q[q0:q1], k, v))  # heads first
            scale = batch.case.scale  # the layer's softmax scale
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=True)
            outs.append(o.transpose(0, 1))
        return BackendOutput(out=torch.cat(outs))
