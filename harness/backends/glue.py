"""The engine glue every adapter shares: how a serving engine reads its own metadata around a kernel.

Every adapter family (torch_native, torch_split, flex, the FlashInfer glue, the flash-attn glue)
inherits `EngineGlue`, so each engine decision is written once, as one method a mutant can override:
the KV extent per request, the write of this forward's K/V, full-pool -> layer-pool slots, the slots
of a request's key range, the layer's causality and window (both edges), the query positions, the
first key worth reading, the key positions, page ids, and an FP8 cache's scales and how a fallback
dequantizes it. A
family whose engine differs overrides that one method and says why (FlashInfer's kv_start rounds
down to a page; torch_native's kv_slots pads past the row with slot 0).
It is its own module, not part of base.py: base.py is the protocol the harness sees (capabilities,
`run`); this is what an adapter does inside `run`, and only adapters import it.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.backends.base import Backend
from harness.core import modes
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import translate_slots
from harness.core.transfer import to_device
from harness.core.vocab import TORCH_DTYPES


def dequantized(
    batch: Batch, k: torch.Tensor, v: torch.Tensor, scales: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes as the case dtype times (k_scale, v_scale); a cache in the model's dtype as it is."""
    if batch.case.kv_dtype is None:
        return k, v
    dt = TORCH_DTYPES[batch.case.dtype]
    return k.to(dt) * scales[0], v.to(dt) * scales[1]


class EngineGlue(Backend):
    """The engine's metadata reads, one decision per method.

    Every per-request decision takes the request's index r. Positions are host lists of ints (what
    an engine plans from, read without waiting for the device); `position_tensor` puts one on the
    batch's device for a mask.
    """

    def kv_extents(self, batch: Batch) -> list[int]:
        """Keys per request, from `seq_lens` and the mode's convention (DRAFT_EXTEND_V2: bumped)."""
        seq = batch.cpu_list("seq_lens")
        enc = batch.cpu_list("encoder_lens")
        return [modes.kv_extent(batch.mode, seq[r], batch.num_draft, enc[r]) for r in range(len(seq))]

    def write_kv(self, batch: Batch) -> None:
        """Store this forward's new K/V at `out_cache_loc`, in this layer's pool (CROSS has none)."""
        if batch.k_new.shape[0]:
            batch.pool.write(self.layer_slots(batch, batch.out_cache_loc), batch.k_new, batch.v_new)

    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        """Full-pool slots -> this layer's pool (the SWA pool on a sliding-window layer of a hybrid pool)."""
        return translate_slots(slots, batch.full_to_swa)

    def kv_slots(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        """Full-pool slots of request r's key positions lo..hi-1 (CROSS: the encoder's, leading its row)."""
        return batch.req_to_token[r, lo:hi]

    def causal(self, batch: Batch) -> bool:
        """Whether a query sees only keys up to its own position: every decoder self-attention mode.
        Not CROSS (decoder queries over encoder keys) and not ENCODER_ONLY (bidirectional)."""
        return batch.mode not in (Mode.CROSS, Mode.ENCODER_ONLY)

    def window_left(self, batch: Batch) -> int:
        """This layer's window W (a query at p keeps keys p - W .. p), -1 for none; CROSS has none."""
        return -1 if batch.mode == Mode.CROSS else batch.case.window_left

    def window_right(self, batch: Batch) -> int:
        """The right edge R of an encoder-only layer's two-sided window (a query at p keeps keys up to
        p + R), -1 for none; a causal layer's right edge is the query itself."""
        return batch.case.window_right if batch.mode == Mode.ENCODER_ONLY else -1

    def query_positions(self, batch: Batch, r: int) -> list[int]:
        """Absolute positions of request r's queries, from the engine's `positions` (verify: P + depth)."""
        return batch.query_positions(r)

    def key_positions(self, batch: Batch, r: int, lo: int, hi: int) -> list[int]:
        """Absolute positions of request r's keys lo..hi-1: their index, but a verify request's drafts
        (its last num_draft keys) sit at their queries' positions (P + depth)."""
        if batch.mode == Mode.TARGET_VERIFY:
            return list(range(lo, hi - batch.num_draft)) + self.query_positions(batch, r)
        return list(range(lo, hi))

    def position_tensor(self, batch: Batch, positions: list[int]) -> torch.Tensor:
        """Host positions as an int64 tensor on the batch's device (one queued copy), for a mask."""
        return to_device(np.asarray(positions, dtype=np.int64), batch.device)

    def kv_start(self, batch: Batch, r: int) -> int:
        """First key worth reading: on a windowed layer, the earliest key the first query can see.

        Engines trim the KV of sliding-window layers this way; on a hybrid pool the keys before it
        may be freed (slot 0, poison), so reading them and masking afterwards would give 0 * NaN.
        """
        w = self.window_left(batch)
        if w < 0:
            return 0
        return max(0, min(self.query_positions(batch, r)) - w)

    def key_ranges(self, batch: Batch) -> list[tuple[int, int]]:
        """[lo, hi) key positions each request reads: from kv_start to its KV extent."""
        return [(self.kv_start(batch, r), n) for r, n in enumerate(self.kv_extents(batch))]

    def kv_scales(self, batch: Batch, r: int) -> tuple[float, float]:
        """(k_scale, v_scale) of request r's keys and values: the layer's per-tensor FP8 cache scales,
        as an engine keeps them on the layer ((1, 1) for a cache in the model's dtype)."""
        return batch.case.k_scale, batch.case.v_scale

    def shared_kv_scales(self, batch: Batch) -> tuple[float, float]:
        """The one (k_scale, v_scale) a kernel that takes a scale per launch is given: every request's
        `kv_scales`. Requests with different scales cannot share such a launch (ValueError)."""
        scales = {self.kv_scales(batch, r) for r in range(batch.batch_size)}
        if len(scales) != 1:
            raise ValueError(
                f"{self.name}: one launch takes one (k_scale, v_scale), the requests give {sorted(scales)}"
            )
        return scales.pop()

    def dequantize(
        self, batch: Batch, r: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Request r's K/V read from the pool in the model's dtype, as an SDPA fallback reads an FP8
        cache: each code converted to the case dtype, then times its tensor's scale. A cache in the
        model's dtype passes through."""
        return dequantized(batch, k, v, self.kv_scales(batch, r))

    def page_ids(self, batch: Batch, first_slots: torch.Tensor) -> torch.Tensor:
        """Page ids in this layer's pool of the pages whose first keys sit at `first_slots` (full pool),
        computed where the slots are (an engine builds its page table on the device)."""
        return self.layer_slots(batch, first_slots) // batch.case.page_size
