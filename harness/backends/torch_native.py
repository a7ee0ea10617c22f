"""torch_native: the SDPA fallback a serving engine ships, on the CPU and on CUDA.

Per request it gathers K/V through `req_to_token` (translated through the full-to-SWA map on a
sliding-window layer of a hybrid pool), builds its own causal/window/tree/cross mask from the
engine metadata, and calls `scaled_dot_product_attention`. Sinks ride along as one extra key of
zeros whose additive bias is the sink logit; a soft cap needs the scores, so it takes the explicit
matmul path. The masks here are written independently of references/masks.py on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness import modes
from harness.backends.base import Backend, BackendOutput, Capabilities
from harness.batch import Batch
from harness.modes import Mode
from harness.pool import translate_slots


class TorchNative(Backend):
    name = "torch_native"
    library = "torch"
    capabilities = Capabilities(
        modes=frozenset(Mode),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        kv_layouts=frozenset({"NHD", "HND"}),
        devices=frozenset({"cpu", "cuda"}),
        window=True,
        soft_cap=True,
        sinks=True,
        hybrid_pool=True,
        deterministic=True,
        tree=True,
        why_not={"returns_lse": "SDPA does not return the log-sum-exp"},
    )

    # --- engine glue, one decision per method -------------------------------------------------

    def write_kv(self, batch: Batch) -> None:
        """Store this forward's new K/V at `out_cache_loc` before attention."""
        if batch.k_new.shape[0]:
            slots = self.layer_slots(batch, batch.out_cache_loc)
            batch.pool.write(slots, batch.k_new, batch.v_new)

    def kv_lens(self, batch: Batch) -> list[int]:
        """Keys to read per request, from `seq_lens` and the mode's convention."""
        seq = batch.cpu_list("seq_lens")
        enc = batch.cpu_list("encoder_lens")
        return [modes.kv_extent(batch.mode, seq[r], batch.num_draft, enc[r]) for r in range(len(seq))]

    def window_left(self, batch: Batch) -> int:
        """This layer's window (-1: none), as the engine passes it to the attention call."""
        return batch.case.window_left

    def kv_start(self, batch: Batch, r: int) -> int:
        """First key worth gathering: on a windowed layer, the earliest key the first query can see.
        (On a hybrid pool the keys before it may be freed: reading them would read slot 0.)"""
        w = self.window_left(batch)
        if w < 0 or batch.mode == Mode.CROSS:
            return 0
        q0, q1 = int(batch.qo_indptr[r]), int(batch.qo_indptr[r + 1])
        return max(0, int(batch.positions[q0:q1].min()) - w)

    def kv_slots(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        """Full-pool slots of request r's positions lo..hi-1 (CROSS: its encoder tokens)."""
        return batch.req_to_token[r, lo:hi]

    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        """Translate full-pool slots into this layer's pool (the SWA pool on a hybrid SWA layer)."""
        return translate_slots(slots, batch.full_to_swa)

    def in_window(self, key_pos: torch.Tensor, query_pos: torch.Tensor, window_left: int) -> torch.Tensor:
        """Sliding window: a query at p keeps keys p - W .. p (W + 1 keys)."""
        return key_pos >= query_pos - window_left

    def key_positions(self, batch: Batch, lo: int, hi: int, query_pos: torch.Tensor) -> torch.Tensor:
        """Absolute position of keys lo..hi-1: their index, but verify drafts sit at their depth."""
        if batch.mode == Mode.TARGET_VERIFY:
            prefix = hi - batch.num_draft
            return torch.cat([torch.arange(lo, prefix, device=query_pos.device), query_pos])
        return torch.arange(lo, hi, device=query_pos.device)

    def build_mask(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        """[E, hi-lo] bool mask from positions (+ the verify tree); all-visible in CROSS."""
        q0, q1 = int(batch.qo_indptr[r]), int(batch.qo_indptr[r + 1])
        if batch.mode == Mode.CROSS:
            return torch.ones(q1 - q0, hi - lo, dtype=torch.bool, device=batch.device)
        qpos = batch.positions[q0:q1].long()
        kpos = self.key_positions(batch, lo, hi, qpos)
        mask = kpos[None, :] <= qpos[:, None]
        w = self.window_left(batch)
        if w >= 0:
            mask &= self.in_window(kpos[None, :], qpos[:, None], w)
        if batch.mode == Mode.TARGET_VERIFY:
            mask[:, hi - lo - batch.num_draft :] &= batch.tree_mask[r]
        return mask

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        batch: Batch,
    ) -> torch.Tensor:
        """q [E, Hq, D], k/v [n, Hkv, D] -> [E, Hq, D]."""
        case = batch.case
        qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        groups = case.num_q_heads // case.num_kv_heads
        if groups > 1:
            kh = kh.repeat_interleave(groups, dim=1)
            vh = vh.repeat_interleave(groups, dim=1)
        if case.soft_cap > 0:
            s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * case.scale
            s = case.soft_cap * torch.tanh(s / case.soft_cap)
            s = s.masked_fill(~mask, float("-inf"))
            if batch.sinks is not None:
                sink = batch.sinks.float().view(1, -1, 1, 1).expand(1, -1, s.shape[2], 1)
                p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
            else:
                p = torch.softmax(s, dim=-1)
            o = torch.matmul(p.to(vh.dtype), vh)
        elif batch.sinks is not None:
            zeros = torch.zeros_like(kh[:, :, :1])
            kh = torch.cat([kh, zeros], dim=2)
            vh = torch.cat([vh, zeros], dim=2)
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            bias = bias.unsqueeze(0).expand(case.num_q_heads, -1, -1)
            sink = batch.sinks.to(q.dtype).view(-1, 1, 1).expand(-1, mask.shape[0], 1)
            o = F.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=torch.cat([bias, sink], dim=-1).unsqueeze(0), scale=case.scale
            )
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=case.scale)
        return o.squeeze(0).transpose(0, 1)

    # --- the forward --------------------------------------------------------------------------

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        outs = []
        for r, n in enumerate(self.kv_lens(batch)):
            q0, q1 = int(batch.qo_indptr[r]), int(batch.qo_indptr[r + 1])
            lo = self.kv_start(batch, r)
            k, v = batch.pool.read(self.layer_slots(batch, self.kv_slots(batch, r, lo, n)))
            outs.append(self.attend(batch.q[q0:q1], k, v, self.build_mask(batch, r, lo, n), batch))
        return BackendOutput(out=torch.cat(outs))


BACKENDS = {"torch_native": TorchNative}
