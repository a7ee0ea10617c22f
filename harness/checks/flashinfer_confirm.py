"""Whether FlashInfer itself, called directly on a case, is wrong: confirmation of its known issues.

A known issue's predicate says which cases can reach a library bug; only the library's own output
on the case says whether this one does. Each function here calls FlashInfer as the entry's script
in known_issues/ does, on the inputs the harness draws for the case (make_inputs, build_batch's
queries and new K/V), never through an adapter, and judges the output with the numeric check's
references and budget. True: the library is wrong on this case, so a backend's failure on it is the
library's. False: the library is right here (or is not installed), so a failure is the glue's.
"""

from __future__ import annotations

import itertools

import torch

from harness.checks.library_verdict import library, library_verdict
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES

WORKSPACE_BYTES = 128 << 20  # the scripts' float workspace


def indptr(lengths: list[int]) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as int32 on the host, where plan() reads it."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def noncausal_window(case: Case, device: str) -> bool:
    """Known issue flashinfer-noncausal-window on an ENCODER_ONLY case: the ragged fa2 prefill with
    causal=False and the case's window_left over its queries and new K/V (each request attends to its
    own tokens), as known_issues/flashinfer_noncausal_window.py calls it. Sinks are not part of the
    bug (FlashInfer's ragged wrapper has none): a sink case is confirmed on its sink-free twin."""
    fi = library("flashinfer")
    if fi is None:
        return False
    case = case.replace(sinks=False)
    inputs = make_inputs(case, device)
    batch = build_batch(case, inputs, device)
    dt = TORCH_DTYPES[case.dtype]
    lengths = indptr([r.extend_len for r in case.requests])
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
        torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD", backend="fa2"
    )
    wrapper.plan(
        lengths,
        lengths,
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        causal=False,
        window_left=case.window_left,
        logits_soft_cap=float(case.soft_cap),
        sm_scale=case.scale,
        q_data_type=dt,
        kv_data_type=dt,
    )
    out = wrapper.run(batch.q, batch.k_new, batch.v_new)
    return not library_verdict(case, inputs, out, device).passed


def far_negative_logits(case: Case, device: str) -> bool:
    """Known issue flashinfer-prefill-far-negative-logits: the ragged fa2 prefill over each request's
    whole keys (prefix and new, as the case's inputs hold them), causal unless the case is
    encoder-only, with the case's window, soft cap and scale, as
    known_issues/flashinfer_prefill_far_negative_logits.py calls it."""
    fi = library("flashinfer")
    if fi is None:
        return False
    inputs = make_inputs(case, device)
    dt = TORCH_DTYPES[case.dtype]
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
        torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD", backend="fa2"
    )
    wrapper.plan(
        indptr(list(inputs.q_lens)),
        indptr(list(inputs.kv_lens)),
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        causal=case.mode != Mode.ENCODER_ONLY,
        window_left=case.window_left,
        logits_soft_cap=float(case.soft_cap),
        sm_scale=case.scale,
        q_data_type=dt,
        kv_data_type=dt,
    )
    out = wrapper.run(inputs.q_all, inputs.kv_all[0], inputs.kv_all[1])
    return not library_verdict(case, inputs, out, device).passed
