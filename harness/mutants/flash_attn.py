"""fa4 mutants: flash-attn-4's glue with one decision broken. They run on the GPU (device cuda);
tests/test_flash_attn.py also hunts them on the CPU against a fake of the library.

The `graph_*` mutants break one step of the CUDA-graph replay path (flash_attn_glue.py) and leave the
eager path intact: only the replay check can catch them (tests/test_graph_flash_attn.py, on the CPU)."""

from __future__ import annotations

import torch

from harness.backends.flash_attn_fa4 import FA4
from harness.backends.flash_attn_glue import is_tree
from harness.backends.graph_glue import GraphState
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import page_table_from_req_to_token
from harness.mutants import Mutant, named


class _DraftExtendPrefixOnly(FA4):
    def kv_extents(self, batch: Batch) -> list[int]:
        if batch.mode == Mode.DRAFT_EXTEND_V2:
            return batch.cpu_list("seq_lens_before_bump")  # P keys: the drafts just written are missed
        return super().kv_extents(batch)


class _DraftExtendDraftsTwice(FA4):
    def kv_extents(self, batch: Batch) -> list[int]:
        if batch.mode == Mode.DRAFT_EXTEND_V2:  # verify's "seq_lens + num_draft" on bumped seq_lens
            return [s + batch.num_draft for s in batch.cpu_list("seq_lens")]
        return super().kv_extents(batch)


class _SwaTreeUntranslated(FA4):
    def page_table(self, batch: Batch, extents: list[int]) -> torch.Tensor:
        if not is_tree(batch):
            return super().page_table(batch, extents)
        slots = self.token_slots(batch, extents)  # full-pool pages used on the SWA pool
        return page_table_from_req_to_token(slots, batch.case.page_size).to(torch.int32).contiguous()


class _NoWindowAsMinusOne(FA4):
    def window_size(self, batch: Batch) -> tuple[int | None, int | None]:
        w = self.window_left(batch)
        return (-1, 0) if w < 0 else (w, 0)  # FA2/FA3's "no window", an empty window to FA4


class _EncoderCausal(FA4):
    def causal(self, batch: Batch) -> bool:
        return batch.mode != Mode.CROSS  # causal=True on an encoder-only layer


class _EncoderWindowAsDecoder(FA4):
    def window_size(self, batch: Batch) -> tuple[int | None, int | None]:
        w = self.window_left(batch)  # the decoder's spelling: (W, 0) cuts an encoder's right side
        return self.unbounded if w < 0 else (w, 0)


class _WindowSidesSwapped(FA4):
    def window_size(self, batch: Batch) -> tuple[int | None, int | None]:
        left, right = super().window_size(batch)
        return (right, left) if not self.causal(batch) else (left, right)  # (right, left) on an encoder


class _TwoSidedLeftOnly(FA4):
    def window_right(self, batch: Batch) -> int:
        return -1  # window_size=(L, None): the right edge of a two-sided window dropped


class _GraphSeqlensFromCapture(FA4):
    def replay_cache_seqlens(self, state: GraphState, batch: Batch, bs: int) -> None:
        pass


class _GraphPageColumnsFromCapture(FA4):
    def replay_page_columns(self, state: GraphState, batch: Batch, bs: int) -> int:
        return state.per_size[bs]["pages"]


class _GraphDraftExtendUnbumped(FA4):
    def replay_kv_extents(self, state: GraphState, batch: Batch) -> list[int]:
        if batch.mode == Mode.DRAFT_EXTEND_V2:  # the bump fixed in the eager path only
            return batch.cpu_list("seq_lens_before_bump")
        return super().replay_kv_extents(state, batch)


class _GraphTreeTablesFromCapture(FA4):
    def replay_tree_tables(self, state: GraphState, batch: Batch, bs: int) -> None:
        pass


MUTANTS: list[Mutant] = [
    Mutant(
        name="fa4~de_v2_prefix_only",
        bug="DRAFT_EXTEND_V2 reads seqused_k = P: the draft tokens just written are missed",
        method="kv_extents",
        families=("draft_extend_v2",),
        windowed=False,
        make=named(_DraftExtendPrefixOnly, "fa4~de_v2_prefix_only"),
        device="cuda",
    ),
    Mutant(
        name="fa4~de_v2_drafts_twice",
        bug="DRAFT_EXTEND_V2 adds num_draft to the already bumped seq_lens: reads P + 2 * num_draft keys",
        method="kv_extents",
        families=("draft_extend_v2",),
        windowed=False,
        make=named(_DraftExtendDraftsTwice, "fa4~de_v2_drafts_twice"),
        device="cuda",
    ),
    Mutant(
        name="fa4~swa_tree_untranslated",
        bug="verify tree (topk > 1) on a hybrid SWA pool reads the SWA pool through the full pool's "
        "page table",
        method="page_table",
        families=("verify",),
        windowed=True,
        make=named(_SwaTreeUntranslated, "fa4~swa_tree_untranslated"),
        device="cuda",
        force={"hybrid_swa_pool": True},
    ),
    Mutant(
        name="fa4~no_window_as_minus_one",
        bug="window_size=(-1, 0) passed for 'no window': FA4 reads it as an empty local window",
        method="window_size",
        families=("prefix",),
        windowed=False,
        make=named(_NoWindowAsMinusOne, "fa4~no_window_as_minus_one"),
        device="cuda",
    ),
    Mutant(
        name="fa4~encoder_causal",
        bug="encoder-only layer called with causal=True: a query never sees the tokens after it",
        method="causal",
        families=("encoder",),
        windowed=False,
        make=named(_EncoderCausal, "fa4~encoder_causal"),
        device="cuda",
    ),
    Mutant(
        name="fa4~encoder_window_as_decoder",
        bug="an encoder's left window spelled as a decoder's, window_size=(W, 0): keys after the query cut",
        method="window_size",
        families=("encoder",),
        windowed=True,
        make=named(_EncoderWindowAsDecoder, "fa4~encoder_window_as_decoder"),
        device="cuda",
    ),
    Mutant(
        name="fa4~window_sides_swapped",
        bug="an encoder's window_size given as (right, left): the window applied on the wrong side",
        method="window_size",
        families=("encoder",),
        windowed=True,
        make=named(_WindowSidesSwapped, "fa4~window_sides_swapped"),
        device="cuda",
    ),
    Mutant(
        name="fa4~two_sided_left_only",
        bug="two-sided encoder window passed as window_size=(L, None): keys past p + R seen",
        method="window_right",
        families=("encoder",),
        windowed=True,
        make=named(_TwoSidedLeftOnly, "fa4~two_sided_left_only"),
        device="cuda",
    ),
    Mutant(
        name="fa4~graph_seqlens_from_capture",
        bug="under a CUDA graph, cache_seqlens written at capture only: every replay reads the dummy "
        "batch's extents",
        method="replay_cache_seqlens",
        families=("decode", "draft_extend_v2", "verify"),
        windowed=False,
        make=named(_GraphSeqlensFromCapture, "fa4~graph_seqlens_from_capture"),
        device="cuda",
        check="graph",
    ),
    Mutant(
        name="fa4~graph_page_columns_from_capture",
        bug="under a CUDA graph, page-table columns written up to the capture's max_seq_len_k: a longer "
        "context reads pages an earlier batch (or nobody) left",
        method="replay_page_columns",
        families=("decode", "draft_extend_v2", "verify"),
        windowed=False,
        make=named(_GraphPageColumnsFromCapture, "fa4~graph_page_columns_from_capture"),
        device="cuda",
        check="graph",
    ),
    Mutant(
        name="fa4~graph_de_v2_extent_unbumped",
        bug="DRAFT_EXTEND_V2 extent bumped in the eager path but not on replay: the graph reads P keys",
        method="replay_kv_extents",
        families=("draft_extend_v2",),
        windowed=False,
        make=named(_GraphDraftExtendUnbumped, "fa4~graph_de_v2_extent_unbumped"),
        device="cuda",
        check="graph",
    ),
    Mutant(
        name="fa4~graph_tree_tables_from_capture",
        bug="under a CUDA graph, the verify tree's mask_mod tables filled at capture only: replays see "
        "the dummy chain, without the window",
        method="replay_tree_tables",
        families=("verify",),
        windowed=True,
        make=named(_GraphTreeTablesFromCapture, "fa4~graph_tree_tables_from_capture"),
        device="cuda",
        check="graph",
    ),
]
