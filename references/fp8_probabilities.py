"""The exact reference with the probabilities rounded as an FP8 forward rounds them before P @ V.

FA3 with FP8 operands converts the softmax probabilities P to the FP8 element type before the P @ V
GEMM (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp: `convert_type_out(tOrP_acc, tOrP)` into a tensor of
`Element`), with P = exp(s - row max) * 2^8 (softmax.h, `Max_offset` 8 for FP8: P in [0, 256]) and
the row sum accumulated in fp32 from the unrounded P. FlashInfer's sm90 FP8 prefill does the same
with another factor: P times the FP8 dtype's largest value, 448 in e4m3 (hopper/variants.cuh,
StandardFP8Attention's p_scale; `convert_type<DTypeKV>` in hopper/quantization/mainloop_mma.cuh).
Here that arithmetic runs with the row's final max where the kernels have the running max of the
key blocks seen so far; the rounding is relative (round to nearest), so each P is off by at most
2^-4 of itself in e4m3 either way, and this reference's distance from exact measures what the
kernel's rounding does: the budget's noise term for a backend that declares it
(harness/checks/judged_inputs.py; tests/test_fp8_probabilities.py measures blocked rows against it).
The factor has to be the kernel's: over one key block a kernel rounds exactly the numbers this
reference rounds, under another factor different ones. Dense per request, over query chunks of
bounded size; a request not named in `requests` keeps its P unrounded (the exact reference's rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from references.masks import RequestMask, case_masks
from references.torch_ref import RefOutput, _finish, _normaliser, _out_scale

# FA3's Max_offset for FP8: P is exp2(x - max + 8), 2^8 times the probability relative to the max.
P_OFFSET = 2.0**8
# What a kernel multiplies P by before rounding it, by name (harness/backends/base.py's
# FP8_PROBABILITY_SCALES): FA3's 2^8, or FlashInfer's FP8 dtype's largest value (448, 57344).
P_SCALES = {
    "2^8": lambda fp8: P_OFFSET,
    "dtype max": lambda fp8: float(torch.finfo(fp8).max),
}
# Scores per query chunk ([Hq, chunk, T]): bounds the memory of a long request.
CHUNK_ELEMENTS = 1 << 24


def round_probabilities(p: torch.Tensor, fp8: torch.dtype, scale: float = P_OFFSET) -> torch.Tensor:
    """P (relative to its row's max, in [0, 1]) as a kernel hands it to the P @ V GEMM: times `scale`
    (FA3's 2^8 by default), rounded to `fp8`, divided back, in p's dtype."""
    return (p * scale).to(fp8).to(p.dtype) / scale


def p_scale(name: str, fp8: torch.dtype) -> float:
    """The factor P_SCALES names for `fp8`; a clear error for a name it does not know."""
    if name not in P_SCALES:
        raise ValueError(f"unknown probability scale {name!r}; known: {', '.join(P_SCALES)}")
    return P_SCALES[name](fp8)


def _request(
    mask: RequestMask,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    case,  # noqa: ANN001 - a harness Case (duck-typed)
    acc: torch.dtype,
    device: torch.device,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's output and LSE with P rounded to the cache's dtype under `scale` (None: not)."""
    e, hq, d = q.shape
    t, hkv = k.shape[:2]
    g = hq // hkv
    fp8 = getattr(torch, case.kv_dtype)
    qh = q.to(device, acc).permute(1, 0, 2)  # [Hq, E, D]
    kh, vh = (x.to(device, acc).repeat_interleave(g, dim=1).permute(1, 0, 2) for x in (k, v))  # [Hq, T, D]
    sink = None if sinks is None else sinks.to(device, acc)[:, None]
    cap = float(case.soft_cap)
    out = torch.zeros(hq, e, d, dtype=acc, device=device)
    lse = torch.full((hq, e), -torch.inf, dtype=acc, device=device)
    step = max(1, CHUNK_ELEMENTS // max(1, hq * t))
    for q0 in range(0, e, step):
        q1 = min(e, q0 + step)
        s = torch.matmul(qh[:, q0:q1], kh.transpose(-1, -2)).mul_(case.scale)
        if cap > 0:
            s = s.div_(cap).tanh_().mul_(cap)
        s.masked_fill_(~mask.block(q0, q1, 0, t).to(device), -torch.inf)
        m = s.amax(-1)
        base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = s.sub_(base.unsqueeze(-1)).exp_()
        l_sum = p.sum(-1)  # from the unrounded P, as FA3's row sum
        _, rescale, safe, has_keys = _normaliser(m, l_sum, sink)
        pv = p if scale is None else round_probabilities(p, fp8, scale)
        ob = torch.matmul(pv, vh) * _out_scale(rescale, safe).unsqueeze(-1)
        out[:, q0:q1], lse[:, q0:q1] = _finish(ob, m, l_sum, has_keys)
    return out.permute(1, 0, 2), lse.permute(1, 0)


def reference(
    case,  # noqa: ANN001 - a harness Case with an FP8 cache (kv_dtype)
    inputs,  # noqa: ANN001 - harness.core.batch.Inputs
    device: torch.device | str = "cpu",
    scale: str = "2^8",
    requests: Sequence[bool] | None = None,
) -> RefOutput:
    """Every query's output with P times the factor `scale` names (P_SCALES) rounded to the cache's
    dtype, in the requests `requests` marks (None: every one), the others' P unrounded (module doc):
    float64 on the CPU, float32 accumulation on a GPU, as the exact reference."""
    if case.kv_dtype is None:
        raise ValueError("the rounded-probabilities reference needs an FP8 cache: kv_dtype is None")
    factor = p_scale(scale, getattr(torch, case.kv_dtype))
    masks = case_masks(case)
    chosen = [True] * len(masks) if requests is None else list(requests)
    if len(chosen) != len(masks):
        raise ValueError(f"requests marks {len(chosen)} requests; the case has {len(masks)}")
    device = torch.device(device)
    acc = torch.float64 if device.type == "cpu" else torch.float32
    scales = [factor if c else None for c in chosen]
    pairs = [
        _request(mask, inputs.q[r], inputs.k[r], inputs.v[r], inputs.sinks, case, acc, device, scales[r])
        for r, mask in enumerate(masks)
    ]
    return RefOutput(out=torch.cat([o for o, _ in pairs]), lse=torch.cat([lse for _, lse in pairs]))
