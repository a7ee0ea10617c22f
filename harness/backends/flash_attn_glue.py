"""Engine glue shared by the flash-attn adapters (fa4, fa3, fa2): what every version needs from a Batch.

A serving engine drives flash-attn with varlen queries (`cu_seqlens_q`), a per-request KV extent
(`seqused_k` / `cache_seqlens`) and a page table over an NHD pool ([pages, page_size, heads, dim]).
Each decision is one small method, so that a mutant can override exactly one of them: the engine's
reads (KV extent, slots of this layer's pool, window, page ids) come from glue.py (EngineGlue); here
are the page table, how a version spells the window, the split count, and the LSE layout. This
module registers no backend.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.base import Capabilities
from harness.backends.glue import EngineGlue
from harness.backends.library import import_library
from harness.backends.versions import SupportedRange
from harness.core.batch import Batch
from harness.core.modes import Mode


def import_attr(
    module: str, attr: str, supported: SupportedRange | None = None
) -> tuple[object | None, str | None]:
    """(module.attr, None) if it imports, else (None, why not): not installed, or the module without
    `attr`. An installed module that fails to import raises BackendBroken (harness/backends/library.py)."""
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
    return any(p != j - 1 for r in batch.case.requests for j, p in enumerate(r.tree))


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


class FlashAttnGlue(EngineGlue):
    """Base adapter: subclasses name the library entry point and implement `run`."""

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
