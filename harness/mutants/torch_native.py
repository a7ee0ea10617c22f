"""torch_native mutants: the SDPA fallback with one glue decision broken."""

from __future__ import annotations

import torch

from harness.backends.torch_native import TorchNative
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES
from harness.mutants import Mutant, mutants_of


class _WindowIgnored(TorchNative):
    def window_left(self, batch: Batch) -> int:
        return -1


class _WindowShort(TorchNative):
    def in_window(self, batch: Batch, r: int, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        return key_pos > query_pos - self.window_left(batch)  # W keys instead of W + 1


class _WindowLong(TorchNative):
    def in_window(self, batch: Batch, r: int, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        return key_pos >= query_pos - self.window_left(batch) - 1  # W + 2 keys instead of W + 1


class _VerifyWindowFlat(TorchNative):
    def query_positions(self, batch: Batch, r: int) -> list[int]:
        q0, q1 = batch.query_span(r)
        p = batch.cpu_list("prefix_lens")[r]
        return list(range(p, p + q1 - q0))  # P + j, not P + depth


class _SoftCapMissing(TorchNative):
    def soft_cap(self, batch: Batch) -> float:
        return 0.0


class _SoftCapAfterMask(TorchNative):
    def logits(self, qh: torch.Tensor, kh: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
        s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * self.softmax_scale(batch)
        s = s.masked_fill(~mask, float("-inf"))
        cap = self.soft_cap(batch)
        return cap * torch.tanh(s / cap)  # masked keys come back as -cap: visible again


class _GqaModulo(TorchNative):
    def expand_kv_heads(self, t: torch.Tensor, groups: int) -> torch.Tensor:
        return t.repeat(1, groups, 1, 1)  # query head h reads kv head h % Hkv, not h // groups


class _SmScaleDefault(TorchNative):
    def softmax_scale(self, batch: Batch) -> float:
        return batch.case.head_dim**-0.5  # the model's sm_scale dropped


class _CrossOffset(TorchNative):
    def kv_slots(self, batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
        if batch.mode != Mode.CROSS:
            return super().kv_slots(batch, r, lo, hi)
        dec = int(batch.seq_lens[r])  # encoder keys read from the decoder's length on
        return super().kv_slots(batch, r, lo + dec, hi + dec)


class _StalePage(TorchNative):
    def write_kv(self, batch: Batch) -> None:
        return None  # the new tokens' slots keep what their page held before (poison here)


class _DraftExtendPrefixOnly(TorchNative):
    def kv_extents(self, batch: Batch) -> list[int]:
        if batch.mode != Mode.DRAFT_EXTEND_V2:  # the field exists in DRAFT_EXTEND_V2 only
            return super().kv_extents(batch)
        return batch.cpu_list("seq_lens_before_bump")  # reads P keys, misses the written drafts


class _DraftExtendDoubleCounted(TorchNative):
    def kv_extents(self, batch: Batch) -> list[int]:
        return [s + batch.num_draft for s in batch.cpu_list("seq_lens")]  # bumped twice


class _SwaUntranslated(TorchNative):
    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        return slots  # full-pool slots used on the SWA pool


class _EncoderCausal(TorchNative):
    def causal(self, batch: Batch) -> bool:
        return batch.mode != Mode.CROSS  # an encoder-only layer masked like a decoder's


class _WindowWrongSide(TorchNative):
    def in_window(self, batch: Batch, r: int, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        return key_pos <= query_pos + self.window_left(batch)  # the left window bounds the right side instead


class _WindowAtEnd(TorchNative):
    def kv_start(self, batch: Batch, r: int) -> int:
        # decode's trimming (seq_len - W): the first key from the last query's window, not the first's
        w = self.window_left(batch)
        return 0 if w < 0 else max(0, max(self.query_positions(batch, r)) - w)


class _TwoSidedLeftOnly(TorchNative):
    def window_right(self, batch: Batch) -> int:
        return -1  # the right edge of a two-sided window dropped


class _Fp8KScaleForV(TorchNative):
    def kv_scales(self, batch: Batch, r: int) -> tuple[float, float]:
        return batch.case.k_scale, batch.case.k_scale  # V dequantized with K's scale


class _Fp8ScaleTwice(TorchNative):
    def dequantize(
        self, batch: Batch, r: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if batch.case.kv_dtype is None:
            return k, v
        dt = TORCH_DTYPES[batch.case.dtype]
        k_scale, v_scale = self.kv_scales(batch, r)
        return k.to(dt) * k_scale * k_scale, v.to(dt) * v_scale * v_scale  # the scale applied twice


class _Fp8ScaleMissing(TorchNative):
    def dequantize(
        self, batch: Batch, r: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt = TORCH_DTYPES[batch.case.dtype]
        return k.to(dt), v.to(dt)  # the codes taken for the values: no scale at all


class _Fp8ReadAsCaseDtype(TorchNative):
    def dequantize(
        self, batch: Batch, r: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt = TORCH_DTYPES[batch.case.dtype]
        return k.view(dt), v.view(dt)  # the cache's bytes read as if they held the model's dtype


_m = mutants_of("torch_native")
FP8_FAMILIES = ("decode", "prefix")  # families whose keys come from the pool

HYBRID = {"hybrid_swa_pool": True}
EXACT = {"hybrid_swa_pool": True, "swa_pool_exact": True}

MUTANTS: list[Mutant] = [
    _m(
        "window_ignored",
        "SDPA fallback ignores the sliding window: every query sees the whole prefix",
        "window_left",
        ("prefix", "prefill", "decode"),
        True,
        _WindowIgnored,
    ),
    _m(
        "window_short",
        "window off by one: W keys instead of W + 1",
        "in_window",
        ("prefix", "prefill", "decode"),
        True,
        _WindowShort,
    ),
    _m(
        "window_long",
        "window off by one the other way: W + 2 keys instead of W + 1",
        "in_window",
        ("prefix", "prefill"),
        True,
        _WindowLong,
    ),
    _m(
        "verify_window_flat",
        "tree verify applies the window by flattened draft index instead of tree depth",
        "query_positions",
        ("verify",),
        True,
        _VerifyWindowFlat,
    ),
    _m(
        "soft_cap_missing",
        "logit soft cap not passed to the kernel",
        "soft_cap",
        ("prefill", "decode"),
        False,
        _SoftCapMissing,
    ),
    _m(
        "soft_cap_after_mask",
        "soft cap applied after masking: masked logits become -cap instead of -inf",
        "logits",
        ("prefill", "prefix"),
        False,
        _SoftCapAfterMask,
    ),
    _m(
        "gqa_modulo",
        "GQA head mapping wrong: query head h reads kv head h % Hkv instead of h // group",
        "expand_kv_heads",
        ("prefill", "decode"),
        False,
        _GqaModulo,
    ),
    _m(
        "sm_scale_default",
        "the model's sm_scale dropped: 1/sqrt(head_dim) used instead",
        "softmax_scale",
        ("prefill", "decode"),
        False,
        _SmScaleDefault,
    ),
    _m(
        "cross_offset",
        "cross-attention reads encoder keys offset by the decoder length",
        "kv_slots",
        ("cross",),
        False,
        _CrossOffset,
    ),
    _m(
        "stale_page",
        "a freed page reused without being rewritten: this forward's K/V never reach the pool",
        "write_kv",
        ("decode", "prefix"),
        False,
        _StalePage,
    ),
    _m(
        "de_v2_prefix_only",
        "DRAFT_EXTEND_V2 reads only the P prefix keys, not the bumped seq_lens = P + num_draft",
        "kv_extents",
        ("draft_extend_v2",),
        False,
        _DraftExtendPrefixOnly,
    ),
    _m(
        "de_v2_double_counted",
        "DRAFT_EXTEND_V2 extent double-counted: seq_lens (already bumped) + num_draft keys read",
        "kv_extents",
        ("draft_extend_v2",),
        False,
        _DraftExtendDoubleCounted,
    ),
    _m(
        "swa_untranslated",
        "sliding-window layer reads the SWA pool with untranslated full-pool slots",
        "layer_slots",
        ("prefix", "decode", "verify"),
        True,
        _SwaUntranslated,
        force=HYBRID,
    ),
    _m(
        "swa_untranslated_exact",
        "untranslated hybrid-pool read on an exact-size SWA pool: out of bounds, a CRASH",
        "layer_slots",
        ("verify", "decode"),
        True,
        _SwaUntranslated,
        force=EXACT,
        expect="crash",
    ),
    _m(
        "encoder_causal",
        "encoder-only layer run with the causal mask: a query never sees the tokens after it",
        "causal",
        ("encoder",),
        False,
        _EncoderCausal,
    ),
    _m(
        "window_wrong_side",
        "window applied on the wrong side: an encoder query keeps keys up to p + W, not from p - W",
        "in_window",
        ("encoder",),
        True,
        _WindowWrongSide,
    ),
    _m(
        "window_at_end",
        "window anchored at the end: keys trimmed from the last query's window start (decode's "
        "seq_len - W), so earlier queries of an encoder request lose keys inside their windows",
        "kv_start",
        ("encoder",),
        True,
        _WindowAtEnd,
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
        "FP8 KV cache: V dequantized with k_scale",
        "kv_scales",
        FP8_FAMILIES,
        False,
        _Fp8KScaleForV,
    ),
    _m(
        "fp8_scale_twice",
        "FP8 KV cache: each scale applied twice when dequantizing",
        "dequantize",
        FP8_FAMILIES,
        False,
        _Fp8ScaleTwice,
    ),
    _m(
        "fp8_scale_missing",
        "FP8 KV cache: the codes read without their scales",
        "dequantize",
        FP8_FAMILIES,
        False,
        _Fp8ScaleMissing,
    ),
    _m(
        "fp8_read_as_case_dtype",
        "FP8 KV cache read as if it held the model's dtype (its bytes viewed as bf16/fp16): a CRASH",
        "dequantize",
        FP8_FAMILIES,
        False,
        _Fp8ReadAsCaseDtype,
        expect="crash",
    ),
]
