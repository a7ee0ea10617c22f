"""Whether FlashInfer itself, called directly on a case, is wrong: confirmation of its known issues.

A known issue's predicate says which cases can reach a library bug; only the library's own output
on the case says whether this one does. Each function here calls FlashInfer as the entry's script
in known_issues/ does, on the inputs the harness draws for the case (make_inputs, build_batch's
queries and new K/V), never through an adapter, and judges the output with the numeric check's
references and budget. True: the library is wrong on this case, so a backend's failure on it is the
library's. False: the library is right here (or is not installed), so a failure is the glue's.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import ModuleType

import torch

from harness.checks import library, library_verdict
from harness.checks.judged_inputs import rounded_queries
from harness.core import pool
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES, TORCH_KV_DTYPES
from references.torch_ref import references

WORKSPACE_BYTES = 128 << 20  # the scripts' float workspace


def indptr(lengths: list[int]) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as int32 on the host, where plan() reads it."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def noncausal_window(case: Case, device: str) -> bool:
    """Known issue flashinfer-noncausal-window on an ENCODER_ONLY case, as
    known_issues/flashinfer_noncausal_window.py calls it. Sinks are not part of the bug (FlashInfer's
    ragged wrapper has none): a sink case is confirmed on its sink-free twin."""
    fi = library("flashinfer")
    if fi is None:
        return False
    case = case.replace(sinks=False)
    inputs = make_inputs(case, device)
    batch = build_batch(case, inputs, device)
    lengths = [r.extend_len for r in case.requests]
    out = ragged_prefill(fi, case, (batch.q, batch.k_new, batch.v_new), lengths, lengths, False, device)
    return not library_verdict(case, inputs, out, device).passed


def far_negative_logits(case: Case, device: str, backend: str = "fa2") -> bool:
    """Known issue flashinfer-prefill-far-negative-logits (fa2; on "auto", fa3 on Hopper, its twin
    flashinfer-fa3-prefill-far-negative-logits): the ragged prefill over each request's whole keys, as
    known_issues/flashinfer_prefill_far_negative_logits.py (--backend) calls it."""
    fi = library("flashinfer")
    if fi is None:
        return False
    inputs = make_inputs(case, device)
    qkv = (inputs.q_all, inputs.kv_all[0], inputs.kv_all[1])
    causal = case.mode != Mode.ENCODER_ONLY
    out = ragged_prefill(fi, case, qkv, list(inputs.q_lens), list(inputs.kv_lens), causal, device, backend)
    return not library_verdict(case, inputs, out, device).passed


def far_negative_logits_auto(case: Case, device: str) -> bool:
    """far_negative_logits on the kernel FlashInfer's "auto" picks here, as vLLM's FlashInfer backend
    prefills: fa3 on Hopper (16-bit inputs), fa2 elsewhere."""
    return far_negative_logits(case, device, "auto")


def ragged_prefill(
    fi: ModuleType,
    case: Case,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    qo_lens: list[int],
    kv_lens: list[int],
    causal: bool,
    device: str,
    backend: str = "fa2",
) -> torch.Tensor:
    """FlashInfer's ragged prefill on a kernel backend, as the entries' scripts call it, on packed
    (q, k, v)."""
    dt = TORCH_DTYPES[case.dtype]
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
        torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD", backend=backend
    )
    wrapper.plan(
        indptr(qo_lens),
        indptr(kv_lens),
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        causal=causal,
        window_left=case.window_left,
        logits_soft_cap=float(case.soft_cap),
        sm_scale=case.scale,
        q_data_type=dt,
        kv_data_type=dt,
    )
    return wrapper.run(*qkv)


def hopper(device: str) -> bool:
    """Whether `device` is a CUDA device of compute capability 9.x, where FlashInfer's "auto" prefill
    runs FP8 queries on fa3."""
    return device.startswith("cuda") and torch.cuda.get_device_capability(device)[0] == 9


def fa3_fp8_prefill_soft_cap(case: Case, device: str) -> bool:
    """Known issue flashinfer-fa3-fp8-prefill-soft-cap: FlashInfer's paged prefill as vLLM's FlashInfer
    backend runs it on Hopper over an FP8 cache ("auto", fa3 there; queries cast to the cache's dtype,
    scale 1; the cache's codes with the case's scales), as
    known_issues/flashinfer_fa3_fp8_prefill_soft_cap.py calls it, returns with the case's soft cap
    what it returns without it, where the cap moves the attention more than four times as far as that
    uncapped output is from its own reference."""
    fi = library("flashinfer")
    if fi is None or case.kv_dtype is None or not case.soft_cap or not hopper(device):
        return False
    inputs = rounded_queries(case, make_inputs(case, device))
    lens = list(inputs.q_lens), list(inputs.kv_lens)
    capped, uncapped = (
        paged_fp8_prefill(fi, case, inputs.q_all, inputs.kv_all, cap, *lens, device)
        for cap in (case.soft_cap, 0.0)
    )
    if not torch.allclose(capped.float(), uncapped.float(), rtol=1e-3, atol=1e-3):
        return False
    plain = dataclasses.replace(case, soft_cap=0.0)
    ref_capped, ref_plain = (references(c, inputs, ("exact",), device)[0].out.float() for c in (case, plain))
    noise = float((uncapped.float() - ref_plain).abs().max())
    return float((ref_capped - ref_plain).abs().max()) > 4 * noise


def paged_fp8_prefill(
    fi: ModuleType,
    case: Case,
    q: torch.Tensor,
    kv: torch.Tensor,
    cap: float,
    qo_lens: list[int],
    kv_lens: list[int],
    device: str,
) -> torch.Tensor:
    """FlashInfer's paged prefill ("auto") planned as vLLM's FlashInfer builder plans it over an FP8
    cache (FP8 queries, FP8 cache, the model dtype out; causal, the case's window and scale, soft cap
    `cap`), in pages of one key, run on q cast to the cache's dtype (scale 1, saturated, as vLLM's
    scaled_fp8_quant casts it) and on kv's codes under the case's scales."""
    fp8 = TORCH_KV_DTYPES[case.kv_dtype]
    k, v = (pool.quantize(x, fp8, s).unsqueeze(1) for x, s in zip(kv, (case.k_scale, case.v_scale)))
    total = sum(kv_lens)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(
        torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD"
    )
    wrapper.plan(
        qo_indptr=indptr(qo_lens),
        paged_kv_indptr=indptr(kv_lens),
        paged_kv_indices=torch.arange(total, dtype=torch.int32),
        paged_kv_last_page_len=torch.ones(len(kv_lens), dtype=torch.int32),
        num_qo_heads=case.num_q_heads,
        num_kv_heads=case.num_kv_heads,
        head_dim_qk=case.head_dim,
        page_size=1,
        causal=True,
        sm_scale=case.scale,
        window_left=case.window_left,
        logits_soft_cap=cap,
        q_data_type=fp8,
        kv_data_type=fp8,
        o_data_type=TORCH_DTYPES[case.dtype],
    )
    return wrapper.run(
        pool.quantize(q, fp8, 1.0), (k, v), q_scale=1.0, k_scale=case.k_scale, v_scale=case.v_scale
    )
