"""fa4: flash-attn-4 (`flash_attn.cute.flash_attn_varlen_func`, CuTe DSL) over the paged pool.

Queries are varlen (`cu_seqlens_q`), keys come through `page_table` + `seqused_k` (the KV extent
of the mode). Windows are `window_size=(W, 0)`; no window is `(None, None)`: FA4 reads `(-1, 0)`
as a local window whose left edge sits one key right of the query, i.e. an empty one. ENCODER_ONLY
is `causal=False` with `window_size=(L, R)`, None for a missing edge (a left window is `(W, None)`). Trees of
TARGET_VERIFY (topk > 1) go through a `mask_mod` that reads two per-query tables built here.
On sm90 FA4 has no split-KV (`num_splits` must be 1), so every call is batch-invariant. Pages
whose size equals the kernel's key tile (128 at head_dim 128) load by TMA, whole: the tail rows of
a request's last page are read and masked, hence `whole_page_loads`.

Under a CUDA graph (flash_attn_glue.py's graph path) it captures DECODE, TARGET_VERIFY and
DRAFT_EXTEND_V2. TARGET_VERIFY always takes the tree path there, as an engine with topk > 1 captures
it (a chain is a tree of one child per node): the mask_mod is compiled once and its two tables are
buffers of [max_batch * E] and [max_batch * E * E], rewritten before every replay.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from harness.backends.base import BackendOutput
from harness.backends.flash_attn_glue import FlashAttnGlue, capabilities, is_tree
from harness.backends.flash_attn_versions import FA4_RANGE
from harness.backends.graph_glue import GraphLimits, GraphState, StaticInputs
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.transfer import to_device
from harness.core.vocab import FEATURES

# (major) compute capabilities whose FA4 forward reads a paged KV cache (sm80 and sm120 do not).
PAGED_ARCHS = (9, 10, 11)


@cache
def tree_mask_mod():  # noqa: ANN201 - a CuTe DSL function
    """The FA4 mask_mod of a verify tree, compiled once per process (imports the DSL lazily).

    aux_tensors[0][row]: first prefix key the query of packed row `row` sees (its window start).
    aux_tensors[1][row * E + i]: 1 if that query sees draft i of its request (ancestor or itself,
    inside the window). q_idx and kv_idx are positions inside the request; a tile's tail rows
    past the request are clamped (the kernel masks them anyway).
    """
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def verify_tree_mask(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):  # noqa: ANN001 - the DSL reads annotations
        num_q = seqlen_info.seqlen_q
        num_prefix = seqlen_info.seqlen_k - num_q
        q = cute.make_rmem_tensor(1, cutlass.Int32)
        q.store(q_idx)
        kv = cute.make_rmem_tensor(1, cutlass.Int32)
        kv.store(kv_idx)
        row = seqlen_info.offset_q + cutlass.min(q[0], num_q - 1)
        draft = cutlass.min(cutlass.max(kv[0] - num_prefix, 0), num_q - 1)
        first = utils.scalar_to_ssa(aux_tensors[0][row], cutlass.Int32)
        seen = utils.scalar_to_ssa(aux_tensors[1][row * num_q + draft], cutlass.Int32)
        prefix_end = utils.scalar_to_ssa(num_prefix, cutlass.Int32)
        zero = utils.scalar_to_ssa(0, cutlass.Int32)
        in_prefix = (kv_idx < prefix_end) & (kv_idx >= first)
        in_tree = (kv_idx >= prefix_end) & (seen > zero)
        return in_prefix | in_tree

    return verify_tree_mask


class FA4(FlashAttnGlue):
    name = "fa4"
    library = "flash-attn-4"
    entry = ("flash_attn.cute", "flash_attn_varlen_func")
    supported = FA4_RANGE
    unbounded = (None, None)  # FA4's "no window": it reads -1 as a window edge (an empty window)
    capabilities = capabilities(
        FEATURES,
        whole_page_loads=True,
        graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
        why_not={
            "kv_dtype": "flash-attn-4 (4.0.0b26 to b36) reads FP8 only with q, k and v all in one FP8 dtype "
            "(interface.py asserts it), and only on sm100: an FP8 KV cache under a bf16/fp16 query "
            "has no path (quantizing the query is another computation than the references model)"
        },
    )

    def available(self, device: str) -> str | None:
        why = super().available(device)
        if why or device != "cuda":
            return why
        major, minor = torch.cuda.get_device_capability()
        if major not in PAGED_ARCHS:
            return f"FA4 reads a paged KV cache on sm90/sm100/sm110 only, not sm{major}{minor}"
        return None

    # --- engine glue, one decision per method -------------------------------------------------

    def num_splits(self, batch: Batch) -> int:
        """1: sm90 FA4 has no split-KV, and deterministic mode needs none anywhere."""
        return 1

    def tree_tables(self, batch: Batch) -> list[torch.Tensor]:
        """The two tables `tree_mask_mod` reads: per query its first visible prefix key, and per
        (query, draft) whether it may see that draft. Window by position (P + depth), not index."""
        e = batch.num_draft
        pos = batch.positions.long().view(-1, e)  # [B, E]: P + depth of each draft
        see = batch.tree_mask.clone()  # [B, E(query), E(draft)]: ancestor or itself
        w = self.window_left(batch)
        first = torch.zeros_like(pos)
        if w >= 0:
            see &= pos[:, None, :] >= pos[:, :, None] - w
            first = (pos - w).clamp(min=0)
        return [first.reshape(-1).to(torch.int32).contiguous(), see.reshape(-1).to(torch.int32).contiguous()]

    def mask_args(self, batch: Batch) -> dict:
        """Causal/window arguments; a tree replaces them with its mask_mod (causal then off)."""
        if is_tree(batch):
            return {
                "causal": False,
                "window_size": (None, None),
                "mask_mod": tree_mask_mod(),
                "aux_tensors": self.tree_tables(batch),
            }
        return {"causal": self.causal(batch), "window_size": self.window_size(batch)}

    # --- the forward --------------------------------------------------------------------------

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):  # the varlen metadata: extents, page table, mask arguments
            extents = self.kv_extents(batch)
            meta = dict(
                cu_seqlens_q=batch.qo_indptr,
                seqused_k=to_device(np.asarray(extents, dtype=np.int32), batch.device),
                page_table=self.page_table(batch, extents),
                max_seqlen_q=max(batch.cpu_list("extend_lens")),
                max_seqlen_k=self.max_seqlen_k(extents),
                **self.mask_args(batch),
            )
        out, lse = self.kernel()(
            batch.q,
            batch.pool.k,
            batch.pool.v,
            softmax_scale=batch.case.scale,
            softcap=batch.case.soft_cap,
            learnable_sink=batch.sinks,
            num_splits=self.num_splits(batch),
            deterministic=batch.case.deterministic,
            return_lse=True,
            **meta,
        )
        return BackendOutput(out=out, lse=self.lse_rows(lse))

    # --- the CUDA-graph path: the tree tables as buffers, and the captured call ----------------

    def graph_tree(self, state: GraphState) -> bool:
        """Whether the captured call takes the tree path (its mask_mod and tables): TARGET_VERIFY."""
        return state.mode == Mode.TARGET_VERIFY

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """The shared buffers, and in TARGET_VERIFY the tree tables: tree_first [n * E], tree_see
        [n * E * E]."""
        state = super().graph_buffers(limits, batch)
        if self.graph_tree(state):
            n, e = limits.max_batch, limits.queries
            state.buffers["tree_first"] = torch.zeros(n * e, dtype=torch.int32, device=batch.device)
            state.buffers["tree_see"] = torch.zeros(n * e * e, dtype=torch.int32, device=batch.device)
        return state

    def padding_tree_tables(self, state: GraphState, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables of `rows` padding requests: a chain over the prefix from key 0."""
        e = state.limits.queries
        see = torch.ones(e, e, dtype=torch.int32, device=state.device).tril().repeat(rows, 1)
        return torch.zeros(rows * e, dtype=torch.int32, device=state.device), see.reshape(-1)

    def write_tree_tables(self, state: GraphState, first: torch.Tensor, see: torch.Tensor, bs: int) -> None:
        """The real requests' tables, then padding requests' up to bs."""
        e = state.limits.queries
        pad_first, pad_see = self.padding_tree_tables(state, bs - first.numel() // e)
        state.buffers["tree_first"][: bs * e].copy_(torch.cat([first, pad_first]))
        state.buffers["tree_see"][: bs * e * e].copy_(torch.cat([see, pad_see]))

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        super().capture_metadata(state, bs)
        if self.graph_tree(state):
            empty = torch.zeros(0, dtype=torch.int32, device=state.device)
            self.write_tree_tables(state, empty, empty, bs)

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        super().replay_metadata(state, batch, bs)
        if self.graph_tree(state):
            self.replay_tree_tables(state, batch, bs)

    def replay_tree_tables(self, state: GraphState, batch: Batch, bs: int) -> None:
        """The batch's tables (tree_tables: window by position), padded to bs."""
        self.write_tree_tables(state, *self.tree_tables(batch), bs)

    def graph_mask_args(self, state: GraphState, bs: int) -> dict:
        """mask_args of the captured call: the layer's causality and window, or the tree path over
        the table buffers."""
        if not self.graph_tree(state):
            return {"causal": self.causal(state.layer), "window_size": self.window_size(state.layer)}
        e = state.limits.queries
        b = state.buffers
        return {
            "causal": False,
            "window_size": (None, None),
            "mask_mod": tree_mask_mod(),
            "aux_tensors": [b["tree_first"][: bs * e], b["tree_see"][: bs * e * e]],
        }

    def graph_kernel(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        b, bs, layer = state.buffers, static.bs, state.layer
        out, _ = self.kernel()(
            static.q,
            static.pool.k,
            static.pool.v,
            cu_seqlens_q=b["cu_seqlens_q"][: bs + 1],
            seqused_k=b["cache_seqlens"][:bs],
            page_table=b["page_table"][:bs],
            max_seqlen_q=state.limits.queries,
            max_seqlen_k=self.graph_max_seqlen_k(state),
            softmax_scale=layer.case.scale,
            softcap=layer.case.soft_cap,
            learnable_sink=static.sinks,
            num_splits=self.num_splits(layer),
            deterministic=layer.case.deterministic,
            return_lse=True,
            **self.graph_mask_args(state, bs),
        )
        return out


BACKENDS = {"fa4": FA4}
