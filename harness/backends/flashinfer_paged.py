"""flashinfer_paged: paged-only prefill with FlashInfer, as engines run EXTEND, DRAFT_EXTEND_V2, verify
and ENCODER_ONLY.

New K/V go into the pool first; one paged wrapper then reads every key from the pool. EXTEND and
DRAFT_EXTEND_V2 are causal over the KV extent (DRAFT_EXTEND_V2: the bumped `seq_lens`), with
`window_left` anchored, correctly here, at the end of the KV. ENCODER_ONLY is planned with
causal=False over the request's own tokens (its KV extent is its query count, so the window's
anchor is the query itself); a two-sided window has no FlashInfer spelling (a skip).
TARGET_VERIFY passes the draft tree as a custom mask (plan packs it into bits); the window then
lives in that mask, by depth, because FlashInfer's own `window_left` would anchor it by flattened
draft index.

Attention sinks run through BatchAttentionWithAttentionSinkWrapper: the plain fa2 wrappers
accept `sinks=` at run() and drop it. That variant has no soft cap and ignores custom masks, so
sinks with a soft cap, and sinks in TARGET_VERIFY, are declared exclusive (refused with the reason;
the searches do not draw them).
"""

from __future__ import annotations

import torch

from harness.backends.base import BackendOutput
from harness.backends.flashinfer_glue import FlashInferGlue, capabilities
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.vocab import FEATURES


class FlashInferPaged(FlashInferGlue):
    name = "flashinfer_paged"
    capabilities = capabilities(
        {Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY, Mode.ENCODER_ONLY},
        FEATURES,
        exclusive={
            ("sinks", "soft_cap"): "FlashInfer's AttentionSink variant has no soft cap "
            "(logits_soft_cap would be dropped silently)",
            ("sinks", "TARGET_VERIFY"): "FlashInfer's AttentionSink variant ignores custom "
            "masks (the verify tree)",
        },
    )

    def paged_window(self, batch: Batch) -> int:
        """The window given to plan: none in verify, where the tree mask carries it by depth."""
        return -1 if batch.mode == Mode.TARGET_VERIFY else self.window_left(batch)

    def verify_mask(self, batch: Batch, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """Flat bool mask, per request [num_draft, hi - lo] row-major, from global positions.

        Prefix key k is visible to draft j at position p_j iff k >= p_j - W; draft i is visible iff
        it is j or an ancestor (the engine's tree mask) and p_i >= p_j - W.
        """
        w = self.window_left(batch)
        rows = []
        for r, (lo, hi) in enumerate(ranges):
            qpos = torch.tensor(self.query_positions(batch, r), device=batch.device)
            prefix = hi - batch.num_draft
            kpos = torch.cat([torch.arange(lo, prefix, device=batch.device), qpos])
            mask = torch.ones(len(qpos), hi - lo, dtype=torch.bool, device=batch.device)
            mask[:, prefix - lo :] = batch.tree_mask[r]
            if w >= 0:
                mask &= kpos[None, :] >= qpos[:, None] - w
            rows.append(mask.flatten())
        return torch.cat(rows)

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        sinks = batch.sinks is not None
        with phase("plan"):
            ranges = self.key_ranges(batch)
            table = self.page_table(batch, ranges)
            mask = self.verify_mask(batch, ranges) if batch.mode == Mode.TARGET_VERIFY else None
            wrapper = self.wrapper("sink" if sinks else "paged", batch)
            options = self.kernel_options(batch, self.paged_window(batch))
            self.plan_paged(wrapper, batch, table, self.causal(batch), options, mask)
        extra = (batch.sinks,) if sinks else ()  # the sink variant takes them as its extra tensor
        scales = self.run_scales(batch)
        out, lse = wrapper.run(batch.q, self.kv_cache(batch), *extra, return_lse=True, **scales)
        return BackendOutput(out=out, lse=self.natural_lse(lse))


BACKENDS = {"flashinfer_paged": FlashInferPaged}
