"""torch_split mutants: the ragged + paged + merge fallback with one glue decision broken."""

from __future__ import annotations

import torch

from harness.backends.torch_split import SplitParams, TorchSplit
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.mutants import Mutant, mutants_of


class _RaggedNoWindow(TorchSplit):
    def ragged_window_left(self, batch: Batch) -> int:
        return -1  # the ragged pass over the new tokens gets no window_left


class _PrefixWindowAtEnd(TorchSplit):
    def prefix_query_positions(self, batch: Batch, r: int) -> list[int]:
        # FlashInfer's paged pass aligns its E queries with the end of the KV it is given (the
        # prefix): query j sits at P - E + j for the window, E positions before its true place.
        q0, q1 = batch.query_span(r)
        p = batch.cpu_list("prefix_lens")[r]
        return list(range(p - (q1 - q0), p))


class _LseBase2AsNatural(TorchSplit):
    def natural_lse(self, lse2: torch.Tensor) -> torch.Tensor:
        return lse2  # base-2 LSE merged (and returned) as if it were natural log


class _SplitDroppedSwa(TorchSplit):
    def split_params(self, batch: Batch) -> SplitParams:
        if batch.case.window_left >= 0:
            return SplitParams()  # the SWA path plans without the deterministic split size
        return super().split_params(batch)


class _SplitDroppedCross(TorchSplit):
    def split_params(self, batch: Batch) -> SplitParams:
        if batch.mode == Mode.CROSS:
            return SplitParams()  # the cross-attention path plans without it
        return super().split_params(batch)


class _EncoderCausal(TorchSplit):
    def causal(self, batch: Batch) -> bool:
        return batch.mode != Mode.CROSS  # the ragged pass of an encoder-only layer masked causally


class _TwoSidedLeftOnly(TorchSplit):
    def window_right(self, batch: Batch) -> int:
        return -1  # the right edge of a two-sided window dropped


class _Fp8KScaleForV(TorchSplit):
    def kv_scales(self, batch: Batch, r: int) -> tuple[float, float]:
        return batch.case.k_scale, batch.case.k_scale  # the paged pass's output scaled by k_scale


class _NoRowMax(TorchSplit):
    def weights(self, s: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.where(visible, s, float("-inf"))
        return torch.exp2(s), torch.zeros_like(s[..., 0])  # no row max subtracted: 2^s as it is


class _MaxFloorZero(TorchSplit):
    def weights(self, s: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.where(visible, s, float("-inf"))
        base = torch.nan_to_num(s.amax(-1), neginf=0.0).clamp_min(0.0)  # the running max starts at 0
        return torch.exp2(s - base.unsqueeze(-1)), base


class _SentinelFinite(TorchSplit):
    def weights(self, s: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.where(visible, s, -1e4)  # a finite sentinel: hidden keys are only 1e4 below 0
        base = s.amax(-1)
        return torch.exp2(s - base.unsqueeze(-1)), base


class _TieDropped(TorchSplit):
    def weights(self, s: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.where(visible, s, float("-inf"))
        base = torch.nan_to_num(s.amax(-1), neginf=0.0)
        p = torch.exp2(s - base.unsqueeze(-1))
        first = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, s.argmax(-1, keepdim=True), True)
        return torch.where((p == 1.0) & ~first, 0.0, p), base  # the max's term kept for one key only


_m = mutants_of("torch_split")

MUTANTS: list[Mutant] = [
    _m(
        "ragged_no_window",
        "SWA extend with a prefix: the ragged pass over the new tokens gets no window_left",
        "ragged_window_left",
        ("prefill", "prefix", "draft_extend_v2"),
        True,
        _RaggedNoWindow,
    ),
    _m(
        "prefix_window_at_end",
        "SWA extend with a prefix: the paged prefix pass anchors the window at the end of the prefix",
        "prefix_query_positions",
        ("prefix",),
        True,
        _PrefixWindowAtEnd,
    ),
    _m(
        "lse_base2_as_natural",
        "a kernel's base-2 LSE merged (merge_state) and returned as natural log",
        "natural_lse",
        ("prefix", "decode"),
        False,
        _LseBase2AsNatural,
    ),
    _m(
        "split_dropped_swa",
        "deterministic split-KV parameters dropped on the sliding-window path",
        "split_params",
        ("prefix", "decode"),
        True,
        _SplitDroppedSwa,
        check="invariance",
    ),
    _m(
        "split_dropped_cross",
        "deterministic split-KV parameters dropped on the cross-attention path",
        "split_params",
        ("cross",),
        False,
        _SplitDroppedCross,
        check="invariance",
    ),
    _m(
        "encoder_causal",
        "encoder-only layer's ragged pass planned causal: a query never sees the tokens after it",
        "causal",
        ("encoder",),
        False,
        _EncoderCausal,
    ),
    _m(
        "two_sided_left_only",
        "two-sided encoder window dropped to its left edge: keys past p + R seen",
        "window_right",
        ("encoder",),
        True,
        _TwoSidedLeftOnly,
    ),
    _m(
        "fp8_k_scale_for_v",
        "FP8 KV cache read as FlashInfer does: the paged pass's output scaled by k_scale, not v_scale",
        "kv_scales",
        ("decode", "prefix"),
        False,
        _Fp8KScaleForV,
    ),
    _m(
        "no_row_max",
        "the softmax subtracts no row max: 2^s overflows float32 once a logit passes 88.7 (128 in "
        "base 2), and underflows to no weight when every logit of a row is below -103",
        "weights",
        ("decode", "prefill"),
        False,
        _NoRowMax,
    ),
    _m(
        "max_floor_zero",
        "the softmax's running max starts at 0, not -inf: a row whose every logit is far below 0 "
        "underflows to no weight at all",
        "weights",
        ("prefill", "decode"),
        False,
        _MaxFloorZero,
    ),
    _m(
        "mask_sentinel_finite",
        "hidden keys get a finite sentinel (-1e4 in base-2 logits) instead of -inf: when every visible "
        "logit of a row is below it, the hidden keys take the row",
        "weights",
        ("prefill", "prefix"),
        False,
        _SentinelFinite,
    ),
    _m(
        "tie_dropped",
        "keys tied at a row's max: only one keeps the max's term (weight 1), the others drop out",
        "weights",
        ("prefix", "decode"),
        False,
        _TieDropped,
    ),
]
