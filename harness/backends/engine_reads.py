"""How a gather-based backend reads an engine's metadata: keys per request, the layer's window,
and the first key worth gathering. torch_native and the flex backends read the paged pool the same
way (gather through `req_to_token`), so they share this; each keeps its own masks and kernel."""

from __future__ import annotations

from harness import modes
from harness.backends.base import Backend
from harness.batch import Batch
from harness.modes import Mode


class EngineReads(Backend):
    """The metadata reads; mutants override one of them to reintroduce an engine's bug."""

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
        return max(0, batch.first_position(r) - w)
