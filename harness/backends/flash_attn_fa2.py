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

import torch

from harness.backends.base import BackendOutput, Capabilities
from harness.backends.flash_attn_glue import FlashAttnGlue
from harness.batch import Batch
from harness.modes import Mode
from harness.timing import phase


class FA2(FlashAttnGlue):
    name = "fa2"
    library = "flash-attn-2"
    entry = ("flash_attn", "flash_attn_varlen_func")
    capabilities = Capabilities(
        modes=frozenset(Mode),
        dtypes=frozenset({"bfloat16", "float16"}),
        head_dims=frozenset(range(8, 257, 8)),
        kv_layouts=frozenset({"NHD", "HND"}),
        window=True,
        soft_cap=True,
        hybrid_pool=True,
        deterministic=True,
        returns_lse=True,
        why_not={
            "sinks": "FA2 has no attention-sink argument",
            "tree": "FA2 has no custom mask: verify trees with topk > 1 need one",
        },
    )

    def window_size(self, batch: Batch) -> tuple[int, int]:
        """(W, 0) on a windowed layer, (-1, -1) otherwise (FA2's "unbounded")."""
        w = self.window_left(batch)
        return (-1, -1) if w < 0 else (w, 0)

    def kv_start(self, batch: Batch, r: int) -> int:
        """First key worth gathering: the window start of the request's earliest query (0 without)."""
        w = self.window_left(batch)
        if w < 0:
            return 0
        return max(0, batch.first_position(r) - w)

    def gather_kv(self, batch: Batch, extents: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Ragged K, V ([sum L, Hkv, D]) of keys kv_start .. extent - 1 per request, and each L."""
        ks, vs, lens = [], [], []
        for r, end in enumerate(extents):
            lo = self.kv_start(batch, r)
            k, v = batch.pool.read(self.layer_slots(batch, batch.req_to_token[r, lo:end]))
            ks.append(k)
            vs.append(v)
            lens.append(end - lo)
        return torch.cat(ks), torch.cat(vs), lens

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):  # gathering the keys and their varlen offsets
            k, v, lens = self.gather_kv(batch, self.kv_extents(batch))
            cu_k = torch.tensor([0] + lens, dtype=torch.int32, device=batch.device)
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
