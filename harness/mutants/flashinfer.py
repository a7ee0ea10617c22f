"""FlashInfer mutants: each adapter with one glue decision broken the way engines have shipped it.

Every mutant runs on the GPU only (device "cuda"); tests/test_flashinfer_glue.py hunts the
numeric ones on the CPU against a fake of the library. The two split mutants change no single
output, only whether it depends on the rest of the batch (check "invariance"); besides hunting,
`CAUGHT_BY_INVARIANCE` pins a long-KV case on which the batch-invariance check catches each.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.flashinfer_dec import FlashInferDecTC
from harness.backends.flashinfer_enc import FlashInferEnc
from harness.backends.flashinfer_glue import CustomMask, PageTable
from harness.backends.flashinfer_paged import FlashInferPaged
from harness.backends.flashinfer_ragged import FlashInferRagged, PrefixPass
from harness.core.batch import Batch
from harness.core.case import Case, Request
from harness.core.vocab import TORCH_DTYPES
from harness.mutants import Mutant, named


class _RaggedWithoutWindow(FlashInferRagged):
    def ragged_window(self, batch: Batch) -> int:
        return -1  # the new tokens see every earlier new token


class _PrefixWindowOnly(FlashInferRagged):
    def prefix_pass(self, batch: Batch) -> PrefixPass:
        # The whole prefix with window_left: FlashInfer anchors it at the prefix's end, E tokens early.
        return PrefixPass([(0, p) for p in batch.cpu_list("prefix_lens")], self.window_left(batch), None)


class _LseMergedAsNaturalLog(FlashInferRagged):
    def merge(
        self, o_a: torch.Tensor, s_a: torch.Tensor, o_b: torch.Tensor, s_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # A natural-log merge (exp/log, as a hand-written or Triton merge does) fed base-2 LSEs.
        s = torch.logaddexp(s_a.float(), s_b.float())
        w_a, w_b = torch.exp(s_a.float() - s), torch.exp(s_b.float() - s)
        out = o_a.float() * w_a[..., None] + o_b.float() * w_b[..., None]
        return out.to(o_a.dtype), s


class _OptionsOnlyAtRun(FlashInferPaged):
    def plan_paged(
        self, wrapper: Any, batch: Batch, table: PageTable, causal: bool, options: dict, mask: CustomMask
    ) -> None:
        at_plan = dict(options, window_left=-1, logits_soft_cap=0.0)
        super().plan_paged(wrapper, batch, table, causal, at_plan, mask)
        # What the deprecated forward(..., window_left=, logits_soft_cap=) does before run().
        wrapper._window_left = options["window_left"]
        wrapper._logits_soft_cap = options["logits_soft_cap"]


class _SoftCapOnlyAtRun(FlashInferDecTC):
    def plan_decode(self, wrapper: Any, batch: Batch, table: PageTable, options: dict, q_len: int) -> None:
        super().plan_decode(wrapper, batch, table, dict(options, logits_soft_cap=0.0), q_len)
        wrapper._logits_soft_cap = options["logits_soft_cap"]  # as the deprecated forward() sets it


class _SwaUntranslated(FlashInferPaged):
    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        return slots  # the full pool's page table used on the SWA pool


class _LseLeftInBase2(FlashInferPaged):
    def natural_lse(self, lse: torch.Tensor) -> torch.Tensor:
        return lse.float()


class _VerifyWindowByIndex(FlashInferPaged):
    def paged_window(self, batch: Batch) -> int:
        return self.window_left(batch)  # on top of the tree mask: FlashInfer counts flattened drafts


class _SplitDroppedOnSwa(FlashInferDecTC):
    def split_options(self, batch: Batch, page_size: int) -> dict:
        return {} if self.kv_path(batch) == "swa" else super().split_options(batch, page_size)


class _SplitDroppedOnCross(FlashInferEnc):
    def split_options(self, batch: Batch, page_size: int) -> dict:
        return {} if self.kv_path(batch) == "cross" else super().split_options(batch, page_size)


class _RaggedEncoderCausal(FlashInferRagged):
    def causal(self, batch: Batch) -> bool:
        return True  # the ragged plan of an encoder-only layer keeps causal=True


class _PagedEncoderCausal(FlashInferPaged):
    def causal(self, batch: Batch) -> bool:
        return True  # the paged plan of an encoder-only layer keeps causal=True


class _Fp8KScaleForV(FlashInferPaged):
    def kv_scales(self, batch: Batch, r: int) -> tuple[float, float]:
        return batch.case.k_scale, batch.case.k_scale  # run(v_scale=k_scale)


class _Fp8ScalesNotPassed(FlashInferPaged):
    def run_scales(self, batch: Batch) -> dict:
        return {}  # an FP8 cache run without k_scale / v_scale: the codes taken for the values


class _Fp8KScaleTwice(FlashInferDecTC):
    def kernel_options(self, batch: Batch, window_left: int) -> dict:
        options = super().kernel_options(batch, window_left)
        # k_scale folded into the layer's sm_scale at plan, and given to run() as well
        return dict(options, sm_scale=options["sm_scale"] * batch.case.k_scale)


class _Fp8ReadAsCaseDtype(FlashInferRagged):
    def kv_data_type(self, batch: Batch) -> torch.dtype:
        return TORCH_DTYPES[batch.case.dtype]  # plan told the cache holds the model's dtype


def _mutant(
    name: str, bug: str, method: str, families: tuple, windowed: bool, cls: type, **kw: Any
) -> Mutant:
    return Mutant(
        name=name,
        bug=bug,
        method=method,
        families=families,
        windowed=windowed,
        make=named(cls, name),
        device="cuda",
        **kw,
    )


MUTANTS: list[Mutant] = [
    _mutant(
        "flashinfer_ragged~no_window",
        "ragged pass planned without window_left: new tokens see all earlier new tokens",
        "ragged_window",
        ("prefix", "prefill"),
        True,
        _RaggedWithoutWindow,
    ),
    _mutant(
        "flashinfer_ragged~prefix_window_only",
        "paged prefix pass given window_left alone: FlashInfer anchors it at the prefix end, "
        "not at the queries (no trimming, no custom mask)",
        "prefix_pass",
        ("prefix",),
        True,
        _PrefixWindowOnly,
    ),
    _mutant(
        "flashinfer_ragged~lse_merged_as_ln",
        "base-2 LSEs merged by a natural-log merge",
        "merge",
        ("prefix",),
        False,
        _LseMergedAsNaturalLog,
    ),
    _mutant(
        "flashinfer_paged~options_at_run",
        "window_left and logits_soft_cap given at run time (deprecated forward) but not to plan",
        "plan_paged",
        ("prefill", "prefix"),
        True,
        _OptionsOnlyAtRun,
    ),
    _mutant(
        "flashinfer_dec_tc~soft_cap_at_run",
        "logits_soft_cap given at run time (deprecated forward) but not to plan",
        "plan_decode",
        ("decode",),
        False,
        _SoftCapOnlyAtRun,
        force={"soft_cap": 5.0},
    ),
    _mutant(
        "flashinfer_paged~swa_untranslated",
        "hybrid pool: the SWA pool read with the full pool's (untranslated) page ids",
        "layer_slots",
        ("verify", "prefix"),
        True,
        _SwaUntranslated,
        force={"hybrid_swa_pool": True},
    ),
    _mutant(
        "flashinfer_paged~lse_base2",
        "FlashInfer's base-2 LSE returned as if it were natural log",
        "natural_lse",
        ("prefill",),
        False,
        _LseLeftInBase2,
    ),
    _mutant(
        "flashinfer_paged~verify_window_by_index",
        "window_left given to the verify plan on top of the tree mask: FlashInfer applies it by "
        "flattened draft index, not by depth",
        "paged_window",
        ("verify",),
        True,
        _VerifyWindowByIndex,
    ),
    _mutant(
        "flashinfer_dec_tc~split_dropped_swa",
        "deterministic mode: fixed_split_size/disable_split_kv dropped on the sliding-window path",
        "split_options",
        ("decode",),
        True,
        _SplitDroppedOnSwa,
        check="invariance",
    ),
    _mutant(
        "flashinfer_enc~split_dropped_cross",
        "deterministic mode: fixed_split_size/disable_split_kv dropped on the cross-attention path",
        "split_options",
        ("cross",),
        False,
        _SplitDroppedOnCross,
        check="invariance",
    ),
    _mutant(
        "flashinfer_ragged~encoder_causal",
        "encoder-only layer's ragged prefill planned with causal=True",
        "causal",
        ("encoder",),
        False,
        _RaggedEncoderCausal,
    ),
    _mutant(
        "flashinfer_paged~encoder_causal",
        "encoder-only layer's paged prefill planned with causal=True",
        "causal",
        ("encoder",),
        False,
        _PagedEncoderCausal,
    ),
    _mutant(
        "flashinfer_paged~fp8_k_scale_for_v",
        "FP8 KV cache: run(v_scale=) given the k_scale",
        "kv_scales",
        ("prefix", "verify"),
        False,
        _Fp8KScaleForV,
    ),
    _mutant(
        "flashinfer_paged~fp8_scales_not_passed",
        "FP8 KV cache: run() given no k_scale / v_scale (FlashInfer then takes 1.0)",
        "run_scales",
        ("prefix", "draft_extend_v2"),
        False,
        _Fp8ScalesNotPassed,
    ),
    _mutant(
        "flashinfer_dec_tc~fp8_k_scale_twice",
        "FP8 KV cache: k_scale folded into sm_scale at plan and given to run() too",
        "kernel_options",
        ("decode",),
        False,
        _Fp8KScaleTwice,
    ),
    _mutant(
        "flashinfer_ragged~fp8_read_as_case_dtype",
        "FP8 KV cache: plan's kv_data_type left at the model's dtype; run() rejects the FP8 cache (a CRASH)",
        "kv_data_type",
        ("prefix",),
        False,
        _Fp8ReadAsCaseDtype,
        expect="crash",
    ),
]

# Long KV (> 4k keys, split by FlashInfer's default heuristic when the batch is small) on the path
# whose split parameters the mutant drops; the invariance check varies the batch around it.
CAUGHT_BY_INVARIANCE: dict[str, Case] = {
    "flashinfer_dec_tc~split_dropped_swa": Case(
        mode="DECODE",
        requests=(Request(6000, 1), Request(300, 1)),
        head_dim=128,
        window_left=4500,
        deterministic=True,
        seed=3,
    ),
    "flashinfer_enc~split_dropped_cross": Case(
        mode="CROSS",
        requests=(Request(7, 1, 6000), Request(3, 1, 200)),
        head_dim=128,
        deterministic=True,
        seed=5,
    ),
}
