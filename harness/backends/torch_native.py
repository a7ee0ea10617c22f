"""torch_native: the SDPA fallback a serving engine ships, on the CPU and on CUDA.

Per request it gathers K/V through `req_to_token` (translated through the full-to-SWA map on a
sliding-window layer of a hybrid pool), builds its own causal/window/tree/cross/encoder mask from
the engine metadata, and calls `scaled_dot_product_attention`; an FP8 cache is dequantized into the
case dtype first (glue.py, `dequantize`), as an engine's SDPA fallback does. Sinks ride along as one
extra key of zeros whose additive bias is the sink logit; a soft cap needs the scores, so it takes
the explicit matmul path. The masks here are written independently of references/masks.py on purpose.
SDPA chooses among its flash, memory-efficient and math kernels, never cuDNN's (`SDPA_KERNELS`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.backends.base import ALL_CAPABILITIES, BackendOutput
from harness.backends.glue import EngineGlue
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase

# The SDPA kernels the backend lets torch choose from. cuDNN's is left out: it builds a plan for
# every new shape (13 ms each on an H200), and every request of every case is a new shape, so it
# took torch_native's check 2 to 5 times as long (docs/design.md). The glue under check is the same.
SDPA_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


class TorchNative(EngineGlue):
    name = "torch_native"
    library = "torch"
    capabilities = dataclasses.replace(
        ALL_CAPABILITIES,
        returns_lse=False,
        why_not={
            "returns_lse": "SDPA does not return the log-sum-exp",
            "graph": "not capturable: one SDPA call per request in a Python loop, each over keys "
            "gathered to that request's length read from the batch on the host: no fixed buffers",
        },
    )

    # --- engine glue: the shared reads (glue.py), and this fallback's masks -------------------

    def kv_slots(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        """Slots lo..hi-1 of request r's `req_to_token` row. An engine's row is as wide as the longest
        context, with slot 0 (reserved, poisoned) past the request's tokens: reading beyond the batch's
        widest row gives slot 0 here too, so an over-long KV extent reads poison instead of failing."""
        row = super().kv_slots(batch, r, lo, hi)
        short = (hi - lo) - row.numel()
        return torch.cat([row, row.new_zeros(short)]) if short > 0 else row

    def in_window(self, batch: Batch, r: int, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        """Sliding window: a query at p keeps keys p - W .. p (W + 1 keys), W = `window_left`."""
        return key_pos >= query_pos - self.window_left(batch)

    def in_right_window(
        self, batch: Batch, r: int, key_pos: torch.Tensor, query_pos: torch.Tensor
    ) -> torch.Tensor:
        """A two-sided (encoder) window's right edge: a query at p keeps keys up to p + R
        (R = `window_right`)."""
        return key_pos <= query_pos + self.window_right(batch)

    def build_mask(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        """[E, hi-lo] bool mask from positions (+ the verify tree); all-visible in CROSS; no causal
        term in ENCODER_ONLY, whose window may have a right edge."""
        q0, q1 = batch.query_span(r)
        visible = torch.ones(q1 - q0, hi - lo, dtype=torch.bool, device=batch.device)
        if batch.mode == Mode.CROSS:
            return visible
        qpos = self.position_tensor(batch, self.query_positions(batch, r))[:, None]
        kpos = self.position_tensor(batch, self.key_positions(batch, r, lo, hi))[None, :]
        mask = kpos <= qpos if self.causal(batch) else visible
        if self.window_left(batch) >= 0:
            mask &= self.in_window(batch, r, kpos, qpos)
        if self.window_right(batch) >= 0:
            mask &= self.in_right_window(batch, r, kpos, qpos)
        if batch.mode == Mode.TARGET_VERIFY:
            mask[:, hi - lo - batch.num_draft :] &= batch.tree_mask[r]
        return mask

    def softmax_scale(self, batch: Batch) -> float:
        """The scale applied to q.k: the case's sm_scale, or 1/sqrt(head_dim) when it gives none."""
        return batch.case.scale

    def soft_cap(self, batch: Batch) -> float:
        """The logit soft cap passed to the kernel (0: none)."""
        return batch.case.soft_cap

    def expand_kv_heads(self, t: torch.Tensor, groups: int) -> torch.Tensor:
        """[1, Hkv, n, D] -> [1, Hq, n, D]: query head h reads kv head h // groups (GQA)."""
        return t.repeat_interleave(groups, dim=1) if groups > 1 else t

    def logits(self, qh: torch.Tensor, kh: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Float32 scores for the soft-cap path: scale, then cap, then mask (-inf where not visible)."""
        s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * self.softmax_scale(batch)
        cap = self.soft_cap(batch)
        s = cap * torch.tanh(s / cap)
        return s.masked_fill(~mask, float("-inf"))

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
        kh, vh = self.expand_kv_heads(kh, groups), self.expand_kv_heads(vh, groups)
        scale = self.softmax_scale(batch)
        if self.soft_cap(batch) > 0:
            s = self.logits(qh, kh, mask, batch)
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
                qh, kh, vh, attn_mask=torch.cat([bias, sink], dim=-1).unsqueeze(0), scale=scale
            )
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        return o.squeeze(0).transpose(0, 1)

    # --- the forward --------------------------------------------------------------------------

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        outs = []
        with sdpa_kernel(list(SDPA_KERNELS)):
            for r, (lo, n) in enumerate(self.key_ranges(batch)):
                with phase("plan"):  # the gather and the mask: what an engine's metadata step builds
                    q0, q1 = batch.query_span(r)
                    k, v = batch.pool.read(self.layer_slots(batch, self.kv_slots(batch, r, lo, n)))
                    k, v = self.dequantize(batch, r, k, v)
                    mask = self.build_mask(batch, r, lo, n)
                outs.append(self.attend(batch.q[q0:q1], k, v, mask, batch))
        return BackendOutput(out=torch.cat(outs))


BACKENDS = {"torch_native": TorchNative}
