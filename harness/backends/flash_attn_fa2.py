"""fa2: FlashAttention-2 (`flash_attn.flash_attn_varlen_func`) over K/V gathered out of the pool.

FA2 reads a paged cache (`block_table`) only with pages of a multiple of 256 tokens; the harness's
pools use 1 to 128, as serving engines do, so this adapter takes the other engine route: gather
each request's keys from its (translated) slots into ragged K/V with `cu_seqlens_k`, starting at
the first key the window can reach (a hybrid SWA pool has freed the ones before it). Causality is
bottom-right aligned, so a gathered range that ends at the KV extent keeps every query in place.
"No window" is -1, as in FA3. FA2 has no sinks and no custom masks (verify trees).

Only tested against a recording fake of the library here. With flash-attn-4 alone installed,
`flash_attn` is a namespace package without `flash_attn_varlen_func`: FA2 then reports absent.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.backends.base import BackendOutput
from harness.backends.flash_attn_glue import FlashAttnGlue, capabilities
from harness.core.batch import Batch
from harness.core.timing import phase
from harness.core.transfer import to_device


class FA2(FlashAttnGlue):
    name = "fa2"
    library = "flash-attn-2"
    entry = ("flash_attn", "flash_attn_varlen_func")
    capabilities = capabilities(
        ("window", "window_right", "soft_cap", "hybrid_pool", "deterministic", "returns_lse"),
        kv_layouts=frozenset({"NHD", "HND"}),
        why_not={
            "sinks": "FA2 has no attention-sink argument",
            "tree": "FA2 has no custom mask: verify trees with topk > 1 need one",
            "kv_dtype": "FA2 has no FP8 path: its kernels take fp16/bf16 K/V only",
            "graph": "not capturable: this glue gathers each request's keys into ragged K/V in a "
            "per-request loop, its sizes and cu_seqlens_k from the batch (FA2 reads a paged cache only "
            "with pages of 256+ tokens, so no fixed page-table buffer)",
        },
    )

    def gather_kv(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Ragged K, V ([sum L, Hkv, D]) of each request's key range (`key_ranges`), and each L."""
        ks, vs, lens = [], [], []
        for r, (lo, hi) in enumerate(self.key_ranges(batch)):
            k, v = batch.pool.read(self.layer_slots(batch, self.kv_slots(batch, r, lo, hi)))
            ks.append(k)
            vs.append(v)
            lens.append(hi - lo)
        return torch.cat(ks), torch.cat(vs), lens

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):  # gathering the keys and their varlen offsets
            k, v, lens = self.gather_kv(batch)
            cu_k = to_device(np.asarray([0] + lens, dtype=np.int32), batch.device)
            cu_k = cu_k.cumsum(0, dtype=torch.int32)
        out, lse, _ = self.kernel()(
            batch.q,
            k,
            v,
            batch.qo_indptr,
            cu_k,
            max(batch.cpu_list("extend_lens")),
            self.max_seqlen_k(lens),
            softmax_scale=batch.case.scale,
            causal=self.causal(batch),
            window_size=self.window_size(batch),
            softcap=batch.case.soft_cap,
            deterministic=batch.case.deterministic,
            return_attn_probs=True,
        )
        return BackendOutput(out=out, lse=self.lse_rows(lse))


BACKENDS = {"fa2": FA2}
