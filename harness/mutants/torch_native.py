"""torch_native mutants: the SDPA fallback with one glue decision broken."""

from __future__ import annotations

import torch

from harness.backends.torch_native import TorchNative
from harness.batch import Batch
from harness.mutants import Mutant, named


class _WindowIgnored(TorchNative):
    def window_left(self, batch: Batch) -> int:
        return -1


class _WindowShort(TorchNative):
    def in_window(self, key_pos: torch.Tensor, query_pos: torch.Tensor, window_left: int) -> torch.Tensor:
        return key_pos > query_pos - window_left  # W keys instead of W + 1


class _DraftExtendPrefixOnly(TorchNative):
    def kv_lens(self, batch: Batch) -> list[int]:
        return batch.cpu_list("seq_lens_before_bump")  # reads P keys, misses the written drafts


class _SwaUntranslated(TorchNative):
    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        return slots  # full-pool slots used on the SWA pool


MUTANTS: list[Mutant] = [
    Mutant(
        "torch_native~window_ignored",
        "SDPA fallback ignores the sliding window: every query sees the whole prefix",
        "window_left",
        ("prefix", "prefill", "decode"),
        True,
        named(_WindowIgnored, "torch_native~window_ignored"),
    ),
    Mutant(
        "torch_native~window_short",
        "window off by one: W keys instead of W + 1",
        "in_window",
        ("prefix", "prefill", "decode"),
        True,
        named(_WindowShort, "torch_native~window_short"),
    ),
    Mutant(
        "torch_native~de_v2_prefix_only",
        "DRAFT_EXTEND_V2 reads only the P prefix keys, not the bumped seq_lens = P + num_draft",
        "kv_lens",
        ("draft_extend_v2",),
        False,
        named(_DraftExtendPrefixOnly, "torch_native~de_v2_prefix_only"),
    ),
    Mutant(
        "torch_native~swa_untranslated",
        "sliding-window layer reads the SWA pool with untranslated full-pool slots",
        "layer_slots",
        ("prefix", "decode", "verify"),
        True,
        named(_SwaUntranslated, "torch_native~swa_untranslated"),
        force={"hybrid_swa_pool": True},
    ),
]
