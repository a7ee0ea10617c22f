"""Replay-path mutants: FlashInfer's CUDA-graph path (harness/backends/graph_glue.py) with one
decision broken the way engines have shipped it. Each overrides one replay-path method, so the
eager suite (which never replays) passes it; only the replay check (check "graph") can catch it.

They run on the GPU (device "cuda"); tests/test_graph_replay.py hunts them on the CPU against the
FlashInfer fake, replayed by the graph emulator (harness/backends/graphs.py), and shows the eager suite
passes each. The page-table mutant of the issue (rows of an earlier, larger batch left while the
maximum comes from capture) needs a dense page table and a max_seqlen argument: FlashInfer takes a
CSR table bounded by indptr, so it belongs to the flash-attn graph path.
"""

from __future__ import annotations

from harness.backends.flashinfer_dec import FlashInferDecTC
from harness.backends.graph_glue import GraphState
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.mutants import Mutant, mutants_of


class _CaptureSeqLensKept(FlashInferDecTC):
    def replay_kv_extents(self, state: GraphState, batch: Batch) -> list[int]:
        return [self.padding_extent(state)] * batch.batch_size


class _DraftExtentNotBumpedAtReplay(FlashInferDecTC):
    def replay_kv_extents(self, state: GraphState, batch: Batch) -> list[int]:
        if batch.mode != Mode.DRAFT_EXTEND_V2:
            return super().replay_kv_extents(state, batch)
        return batch.cpu_list("seq_lens_before_bump")


class _SplitOnlyAtCapture(FlashInferDecTC):
    def replay_options(self, state: GraphState, batch: Batch) -> dict:
        return {**self.graph_options(state), "split": {}}


class _WindowOnlyAtReplay(FlashInferDecTC):
    def capture_options(self, state: GraphState) -> dict:
        options = self.graph_options(state)
        return {**options, "options": {**options["options"], "window_left": -1}}


class _PaddingSlotsStale(FlashInferDecTC):
    def replay_out_cache_loc(self, state: GraphState, batch: Batch, bs: int) -> None:
        # only the real rows written
        state.buffers["out_cache_loc"][: batch.out_cache_loc.numel()].copy_(batch.out_cache_loc)


_make = mutants_of("flashinfer_dec_tc")
GRAPH = dict(device="cuda", check="graph")

MUTANTS: list[Mutant] = [
    _make(
        "replay_capture_seq_lens",
        "CUDA-graph replay: the seq_lens of the capture's dummy batch kept at replay (the fill length)",
        "replay_kv_extents",
        ("decode", "verify"),
        False,
        _CaptureSeqLensKept,
        **GRAPH,
    ),
    _make(
        "replay_de_v2_unbumped",
        "CUDA-graph replay: DRAFT_EXTEND_V2's KV extent bumped by num_draft in the eager path only",
        "replay_kv_extents",
        ("draft_extend_v2",),
        False,
        _DraftExtentNotBumpedAtReplay,
        **GRAPH,
    ),
    _make(
        "replay_split_at_capture_only",
        "CUDA-graph replay: deterministic split parameters planned at capture, not before a replay "
        "(the replay's split follows the batch: not bitwise the eager output)",
        "replay_options",
        ("decode",),
        False,
        _SplitOnlyAtCapture,
        force={"deterministic": True},
        **GRAPH,
    ),
    _make(
        "replay_window_at_replay_only",
        "CUDA-graph replay: the window planned before each replay but not before the capture, whose "
        "kernel launch (window_left=-1) is what replays",
        "capture_options",
        ("decode",),
        True,
        _WindowOnlyAtReplay,
        **GRAPH,
    ),
    _make(
        "replay_padding_slots_stale",
        "CUDA-graph replay: padding rows of out_cache_loc not reset to the reserved slot: padding "
        "requests write K/V into slots of the previous batch, live ones of this batch",
        "replay_out_cache_loc",
        ("decode",),
        False,
        _PaddingSlotsStale,
        **GRAPH,
    ),
]
