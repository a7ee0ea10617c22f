"""FlexAttention mutants: the window term of the backend's mask_mod broken, eager and compiled, and
an encoder-only layer's causality or right window edge dropped (eager).

The window mutants override `window_mask`, the one mask function that encodes the sliding window. A DECODE
request has one query, and the glue gathers its keys from that query's window start on
(`kv_start`), so there the window term of the mask is redundant and ignoring it is no bug: the
window-ignored mutant is hunted where a request's queries span more than one window.

The compiled mutants are hunted at one fixed dtype and head shape (`force`), so a hunt costs a
few C++ compiles on the CPU rather than one per drawn head shape. CPU CI hunts the compiled
off-by-one (the subtle one); the compiled window-ignored mutant is hunted on the GPU only, as the
eager one already shows the same mask function caught on the CPU.

`flex_compiled~graph_extents_from_capture` breaks the CUDA-graph path only (the layout written
before a replay): the eager suite passes it, the replay check (check "graph") catches it;
tests/test_graph_flex.py shows both on the CPU.
"""

from __future__ import annotations

import torch

from harness.backends.flex_compiled import FlexCompiled
from harness.backends.flex_eager import FlexEager
from harness.backends.flex_launch import MaskMod
from harness.backends.graph_glue import GraphState
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.mutants import Mutant, named


def _ignored(q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
    def every_key(b, h, q, k):  # noqa: ANN001, ANN202 - flex's mask_mod signature
        return kv_pos[k] >= 0  # the window never masks: every query sees the whole prefix

    return every_key


def _short(q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
    def short_window(b, h, q, k):  # noqa: ANN001, ANN202
        return kv_pos[k] > q_pos[q] - window  # W keys instead of W + 1

    return short_window


class _EagerWindowIgnored(FlexEager):
    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        return _ignored(q_pos, kv_pos, window)


class _EagerWindowShort(FlexEager):
    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        return _short(q_pos, kv_pos, window)


class _CompiledWindowIgnored(FlexCompiled):
    cpu_in_suite = True

    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        return _ignored(q_pos, kv_pos, window)


class _CompiledWindowShort(FlexCompiled):
    cpu_in_suite = True

    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        return _short(q_pos, kv_pos, window)


class _CompiledGraphExtentsFromCapture(FlexCompiled):
    cpu_in_suite = True

    def replay_kv_extents(self, state: GraphState, batch: Batch) -> list[int]:
        # the dummy batch's seq_lens (the fill value) kept: every request's layout ends there
        return [self.padding_extent(state)] * batch.batch_size


class _EagerEncoderCausal(FlexEager):
    def causal(self, batch: Batch) -> bool:
        return batch.mode != Mode.CROSS  # an encoder-only layer masked like a decoder's


class _EagerTwoSidedLeftOnly(FlexEager):
    def window_right(self, batch: Batch) -> int:
        return -1  # the right edge of a two-sided window left out of the mask_mod


# One dtype and head shape for the compiled hunts: each new one would be a C++ compile.
COMPILED_SHAPE = {"dtype": "bfloat16", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64}

MUTANTS: list[Mutant] = [
    Mutant(
        name="flex_eager~window_ignored",
        bug="flex mask_mod without its window term: every query sees the whole prefix",
        method="window_mask",
        families=("prefix", "prefill", "draft_extend_v2", "verify"),
        windowed=True,
        make=named(_EagerWindowIgnored, "flex_eager~window_ignored"),
    ),
    Mutant(
        name="flex_eager~window_short",
        bug="flex mask_mod window off by one: W keys instead of W + 1",
        method="window_mask",
        families=("prefix", "prefill", "decode", "draft_extend_v2", "verify"),
        windowed=True,
        make=named(_EagerWindowShort, "flex_eager~window_short"),
    ),
    Mutant(
        name="flex_compiled~window_ignored",
        bug="compiled flex kernel with a mask_mod without its window term",
        method="window_mask",
        families=("prefix",),
        windowed=True,
        make=named(_CompiledWindowIgnored, "flex_compiled~window_ignored"),
        device="cuda",
        force=COMPILED_SHAPE,
    ),
    Mutant(
        name="flex_compiled~window_short",
        bug="compiled flex kernel with the window off by one: W keys instead of W + 1",
        method="window_mask",
        families=("prefix",),
        windowed=True,
        make=named(_CompiledWindowShort, "flex_compiled~window_short"),
        force=COMPILED_SHAPE,
    ),
    Mutant(
        name="flex_compiled~graph_extents_from_capture",
        bug="under a CUDA graph, the key layout written from the capture's seq_lens (the fill value): "
        "every replayed request reads its first keys only",
        method="replay_kv_extents",
        families=("decode", "draft_extend_v2", "verify"),
        windowed=False,
        make=named(_CompiledGraphExtentsFromCapture, "flex_compiled~graph_extents_from_capture"),
        device="cuda",
        check="graph",
        force=COMPILED_SHAPE,
    ),
    Mutant(
        name="flex_eager~encoder_causal",
        bug="encoder-only layer with the causal term in its mask_mod: a query never sees later tokens",
        method="causal",
        families=("encoder",),
        windowed=False,
        make=named(_EagerEncoderCausal, "flex_eager~encoder_causal"),
    ),
    Mutant(
        name="flex_eager~two_sided_left_only",
        bug="two-sided encoder window without its right-edge term: keys past p + R seen",
        method="window_right",
        families=("encoder",),
        windowed=True,
        make=named(_EagerTwoSidedLeftOnly, "flex_eager~two_sided_left_only"),
    ),
]
