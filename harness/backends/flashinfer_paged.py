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

from typing import Any

import torch

from harness.backends.base import BackendOutput
from harness.backends.flashinfer_glue import (
    KERNEL_BACKEND,
    CustomMask,
    FlashInferGlue,
    PageTable,
    capabilities,
    flashinfer,
    workspace,
)
from harness.backends.graph_glue import GraphLimits, GraphState
from harness.core.batch import Batch
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.vocab import FEATURES

# Measured on the H100 (flashinfer 0.7.2.post1): replays of verify trees and DRAFT_EXTEND_V2 differed
# from the eager output by 0.0039 in deterministic mode, with contexts of 30 keys.
DETERMINISTIC_TILE_AT_CAPTURE = (
    "deterministic mode under a CUDA graph: with use_cuda_graph=True FlashInfer's fa2 prefill plan sizes "
    "its query tile from the largest query count the batch could hold (total rows - batch + 1), not "
    "the queries per request as the eager plan does, and the capture freezes that tile: a replay "
    "is not bitwise the eager output (plan(uniform_q_len=), from 0.7.2.post1, would pin it; not "
    "passed by this glue). flashinfer_dec_tc replays chains and DRAFT_EXTEND_V2 deterministically"
)
SINKS_NOT_CAPTURED = (
    "the graph path plans the plain paged wrapper: sinks run through the AttentionSink wrapper, "
    "whose CUDA-graph buffers are not wired"
)


class FlashInferPaged(FlashInferGlue):
    name = "flashinfer_paged"
    capabilities = capabilities(
        {Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY, Mode.ENCODER_ONLY},
        FEATURES,
        graph_modes=frozenset({Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
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
            qpos = self.position_tensor(batch, self.query_positions(batch, r))
            kpos = self.position_tensor(batch, self.key_positions(batch, r, lo, hi))
            prefix = hi - batch.num_draft
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

    # --- the CUDA-graph path: TARGET_VERIFY (trees, by custom mask) and DRAFT_EXTEND_V2 ----------

    def graph_supports(self, case: Case) -> str | None:
        if case.deterministic:
            return DETERMINISTIC_TILE_AT_CAPTURE
        return SINKS_NOT_CAPTURED if case.sinks else None

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """The page-table buffers, qo_indptr [n + 1], and for verify the packed tree-mask buffer (one bit
        per query and key of every request, each request's bits starting on a byte) and mask_indptr."""
        state = super().graph_buffers(limits, batch)
        n, dev = limits.max_batch, batch.device
        state.buffers["qo_indptr"] = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        if batch.mode == Mode.TARGET_VERIFY:
            per_request = -(-limits.queries * limits.max_kv // 8)
            state.buffers["custom_mask"] = torch.zeros(n * per_request, dtype=torch.uint8, device=dev)
            state.buffers["mask_indptr"] = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        return state

    def graph_wrapper(self, state: GraphState, bs: int) -> Any:
        """The paged prefill wrapper with use_cuda_graph=True over views of the buffers."""
        b = state.buffers
        masks = {}
        if "custom_mask" in b:
            masks = {"custom_mask_buf": b["custom_mask"], "mask_indptr_buf": b["mask_indptr"][: bs + 1]}
        return flashinfer().BatchPrefillWithPagedKVCacheWrapper(
            workspace(state.device),
            state.layer.case.kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=b["qo_indptr"][: bs + 1],
            paged_kv_indptr_buf=b["kv_indptr"][: bs + 1],
            paged_kv_indices_buf=b["kv_indices"],
            paged_kv_last_page_len_buf=b["kv_last_page_len"][:bs],
            backend=KERNEL_BACKEND,
            **masks,
        )

    def graph_options(self, state: GraphState) -> dict:
        layer = state.layer
        split = self.split_options(layer, layer.case.page_size)
        return {"options": self.kernel_options(layer, self.paged_window(layer)), "split": split}

    def padding_mask(self, state: GraphState, requests: int) -> torch.Tensor:
        """The tree mask of padding requests: every query sees every key of its padding extent."""
        rows = requests * state.limits.queries * self.padding_extent(state)
        return torch.ones(rows, dtype=torch.bool, device=state.device)

    def capture_mask(self, state: GraphState, bs: int) -> CustomMask:
        return self.padding_mask(state, bs) if state.mode == Mode.TARGET_VERIFY else None

    def replay_mask(self, state: GraphState, batch: Batch, bs: int) -> CustomMask:
        """The real requests' verify mask over their replay key ranges, then the padding requests'."""
        if state.mode != Mode.TARGET_VERIFY:
            return None
        real = self.verify_mask(batch, self.replay_key_ranges(state, batch))
        return torch.cat([real, self.padding_mask(state, bs - batch.batch_size)])

    def plan_graph(
        self, state: GraphState, bs: int, table: PageTable, options: dict, mask: CustomMask = None
    ) -> None:
        layer = state.layer
        args, kwargs = self.plan_arguments(layer, table, options["options"], options["split"])
        qo = torch.arange(bs + 1, dtype=torch.int32) * state.limits.queries
        causal = self.causal(layer) and mask is None
        state.per_size[bs].plan(qo, *args, custom_mask=mask, causal=causal, **kwargs)

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        self.capture_out_cache_loc(state, bs)
        state.per_size[bs] = self.graph_wrapper(state, bs)
        table = self.capture_table(state, bs)
        self.plan_graph(state, bs, table, self.capture_options(state), self.capture_mask(state, bs))

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        self.replay_out_cache_loc(state, batch, bs)
        table = self.replay_table(state, batch, bs)
        mask = self.replay_mask(state, batch, bs)
        self.plan_graph(state, bs, table, self.replay_options(state, batch), mask)


BACKENDS = {"flashinfer_paged": FlashInferPaged}
