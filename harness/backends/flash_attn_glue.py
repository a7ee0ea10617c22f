"""Engine glue shared by the flash-attn adapters (fa4, fa3, fa2): what every version needs from a Batch.

A serving engine drives flash-attn with varlen queries (`cu_seqlens_q`), a per-request KV extent
(`seqused_k` / `cache_seqlens`) and a page table over an NHD pool ([pages, page_size, heads, dim]).
Each decision is one small method, so that a mutant can override exactly one of them: the engine's
reads (KV extent, slots of this layer's pool, window, page ids) come from glue.py (EngineGlue); here
are the page table, how a version spells the window, the split count, and the LSE layout. This
module registers no backend.

The CUDA-graph path (graph_glue.py), as sglang's flash-attention backend writes it: `cache_seqlens`
[max_batch], `cu_seqlens_q` [max_batch + 1] and `page_table` [max_batch, max pages per request]
allocated once; `cu_seqlens_q` never changes (every request has the captured number of queries);
before each replay the real requests' KV extents and page ids are written into the first rows, the
padding requests get the fill extent on the reserved page. The kernel reads those three from device
memory; every Python value (max_seqlen_q, the window, soft cap, scale, num_splits) is frozen at
capture, so the adapter passes only values a layer fixes: max_seqlen_q = the captured queries per
request (it sizes the grid), max_seqlen_k = the page table's bound (a split heuristic reads it,
never the mask).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.base import Capabilities
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState
from harness.backends.versions import SupportedRange, import_library
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import RESERVED_PAGE


def import_attr(
    module: str, attr: str, supported: SupportedRange | None = None
) -> tuple[object | None, str | None]:
    """(module.attr, None) if it imports, else (None, why not): not installed, or the module without
    `attr`. An installed module that fails to import raises BackendBroken (harness/backends/versions.py)."""
    mod, why = import_library(module, supported)
    if mod is None:
        return None, why
    fn = getattr(mod, attr, None)
    if fn is None:
        return None, f"{module} imports but has no {attr} (another package owns that name here)"
    return fn, None


def is_tree(batch: Batch) -> bool:
    """TARGET_VERIFY with topk > 1: some draft has a sibling, so causality alone cannot mask it."""
    if batch.mode != Mode.TARGET_VERIFY:
        return False
    return any(p != j - 1 for tree in batch.draft_parents for j, p in enumerate(tree))


def capabilities(features: tuple[str, ...], **fields: Any) -> Capabilities:
    """The capabilities every flash-attn adapter shares (every mode, half precision, head_dim a multiple
    of 8 up to 256, an NHD pool, CUDA), plus its own features and fields."""
    return Capabilities.with_features(
        *features,
        modes=frozenset(Mode),
        dtypes=frozenset({"bfloat16", "float16"}),
        head_dims=frozenset(range(8, 257, 8)),
        **fields,
    )


class FlashAttnGlue(GraphGlue):
    """Base adapter: subclasses name the library entry point and implement `run`; a capturable one
    declares graph_modes and implements `graph_kernel` over the buffers written below."""

    library = "flash_attn"
    entry: tuple[str, str] = ("", "")  # (module, function) imported lazily
    supported: SupportedRange | None = None  # the releases this glue supports (None: not checked)
    unbounded: tuple[int | None, int | None] = (-1, -1)  # how this version spells "no window"

    def available(self, device: str) -> str | None:
        why = super().available(device)
        if why:
            return why
        return import_attr(*self.entry, self.supported)[1]

    def kernel(self):  # noqa: ANN201 - the library function
        fn, why = import_attr(*self.entry, self.supported)
        if fn is None:
            raise RuntimeError(why)
        return fn

    # --- engine glue: the shared reads (glue.py), and what flash-attn takes -------------------

    def token_slots(self, batch: Batch, extents: list[int]) -> torch.Tensor:
        """[B, pages * page_size] full-pool slots covering every extent; past a row: reserved slot 0.

        The width follows the extents, as an engine slices `req_to_token[:, :max_seqlen_k]` out of
        a table sized for the longest context: a wrong extent reads the reserved page, never past
        the table.
        """
        ps = batch.case.page_size
        width = -(-max(max(extents), 1) // ps) * ps
        r2t = batch.req_to_token
        if r2t.shape[1] < width:
            r2t = torch.nn.functional.pad(r2t, (0, width - r2t.shape[1]))
        return r2t[:, :width]

    def page_table(self, batch: Batch, extents: list[int]) -> torch.Tensor:
        """[B, pages] int32 page ids of this layer's pool (`page_ids` of each page's first slot)."""
        first_slots = self.token_slots(batch, extents)[:, :: batch.case.page_size]
        return self.page_ids(batch, first_slots).to(torch.int32).contiguous()

    def window_size(self, batch: Batch) -> tuple[int | None, int | None]:
        """(W, 0) on a causal windowed layer; `unbounded` without a window, as this version spells
        it. A non-causal (ENCODER_ONLY) layer gives each edge: (W, R), (W, none) for a left window."""
        w = self.window_left(batch)
        if self.causal(batch):
            return self.unbounded if w < 0 else (w, 0)
        r = self.window_right(batch)
        none_left, none_right = self.unbounded
        return (w if w >= 0 else none_left, r if r >= 0 else none_right)

    def num_splits(self, batch: Batch) -> int:
        """1 (no split-KV) in deterministic mode: a split count that follows the batch changes bits."""
        return 1 if batch.case.deterministic else 0

    def max_seqlen_k(self, extents: list[int]) -> int:
        """max_i(P_i + E_i): the longest extent, not max(P) + max(E)."""
        return max(extents)

    def lse_rows(self, lse: torch.Tensor | None) -> torch.Tensor | None:
        """flash-attn returns varlen LSE as [Hq, total_q] in natural log; the harness wants [total_q, Hq]."""
        return None if lse is None else lse.transpose(0, 1).float()

    # --- the CUDA-graph path (module doc) -----------------------------------------------------

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """cache_seqlens [n], cu_seqlens_q [n + 1] (fixed: `queries` rows a request) and page_table
        [n, max_pages] (the reserved page until written), for n = max_batch."""
        state = super().graph_buffers(limits, batch)
        n, e, dev = limits.max_batch, limits.queries, batch.device
        b = state.buffers
        b["cache_seqlens"] = torch.zeros(n, dtype=torch.int32, device=dev)
        b["cu_seqlens_q"] = torch.arange(0, (n + 1) * e, e, dtype=torch.int32, device=dev)
        b["page_table"] = torch.full((n, limits.max_pages), RESERVED_PAGE, dtype=torch.int32, device=dev)
        return state

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        """A dummy batch of bs padding requests; remembers the page-table columns it wrote."""
        self.capture_out_cache_loc(state, bs)
        n = self.padding_extent(state)
        pages = -(-n // state.limits.page_size)
        state.buffers["cache_seqlens"][:bs].fill_(n)
        state.buffers["page_table"][:bs, :pages].fill_(RESERVED_PAGE)
        state.per_size[bs] = {"pages": pages}

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        self.replay_out_cache_loc(state, batch, bs)
        self.replay_cache_seqlens(state, batch, bs)
        self.replay_page_table(state, batch, bs)

    def replay_cache_seqlens(self, state: GraphState, batch: Batch, bs: int) -> None:
        """The real requests' KV extents (replay_kv_extents), then the fill extent for padding."""
        real = self.replay_kv_extents(state, batch)
        pad = [self.padding_extent(state)] * (bs - len(real))
        state.buffers["cache_seqlens"][:bs].copy_(torch.tensor(real + pad, dtype=torch.int32))

    def replay_page_columns(self, state: GraphState, batch: Batch, bs: int) -> int:
        """Page-table columns this replay writes: the longest real extent in pages, at least the
        padding's (sglang's max_seq_pages, from this batch's max_seq_len_k); later columns keep what
        earlier batches left, which no extent reaches."""
        longest = max(self.replay_kv_extents(state, batch) + [self.padding_extent(state)])
        return -(-longest // state.limits.page_size)

    def replay_page_table(self, state: GraphState, batch: Batch, bs: int) -> None:
        """Rows of the real requests: their page ids in this layer's pool (page_table, translated on
        a hybrid pool); padding rows: the reserved page."""
        cols = self.replay_page_columns(state, batch, bs)
        table = self.page_table(batch, self.replay_kv_extents(state, batch))[:, :cols]
        buf = state.buffers["page_table"]
        b = batch.batch_size
        buf[:b, : table.shape[1]].copy_(table)
        buf[b:bs, :cols].fill_(RESERVED_PAGE)

    def graph_max_seqlen_k(self, state: GraphState) -> int:
        """The host max_seqlen_k a captured call passes: the page table's bound (fixed at capture)."""
        return state.limits.max_pages * state.limits.page_size
