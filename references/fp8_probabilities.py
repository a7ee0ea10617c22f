"""The exact reference with the probabilities rounded as FlashAttention-3's FP8 forward rounds them.

FA3 with FP8 operands converts the softmax probabilities P to the FP8 element type before the P @ V
GEMM (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp: `convert_type_out(tOrP_acc, tOrP)` into a tensor of
`Element`), with P = exp(s - row max) * 2^8 (softmax.h, `Max_offset` 8 for FP8: P in [0, 256]) and
the row sum accumulated in fp32 from the unrounded P. Here that arithmetic runs with the row's final
max where FA3 has the running max of the key blocks seen so far; the rounding is relative (round to
nearest), so each P is off by at most 2^-4 of itself in e4m3 either way, and this reference's
distance from exact measures what the kernel's rounding does: the budget's noise term for a backend
that declares it (harness/checks/judged_inputs.py; tests/test_fp8_probabilities.py measures blocked
rows against it). Dense per request, over query chunks of bounded size.
"""

from __future__ import annotations

import torch

from references.masks import RequestMask, case_masks
from references.torch_ref import RefOutput, _finish, _normaliser, _out_scale

# FA3's Max_offset for FP8: P is exp2(x - max + 8), 2^8 times the probability relative to the max.
P_OFFSET = 2.0**8
# Scores per query chunk ([Hq, chunk, T]): bounds the memory of a long request.
CHUNK_ELEMENTS = 1 << 24


def round_probabilities(p: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """P (relative to its row's max, in [0, 1]) as FA3 hands it to the P @ V GEMM: times 2^8,
    rounded to `fp8`, divided back, in p's dtype."""
    return (p * P_OFFSET).to(fp8).to(p.dtype) / P_OFFSET


def _request(
    mask: RequestMask,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    case,  # noqa: ANN001 - a harness Case (duck-typed)
    acc: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
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
        ob = torch.matmul(round_probabilities(p, fp8), vh) * _out_scale(rescale, safe).unsqueeze(-1)
        out[:, q0:q1], lse[:, q0:q1] = _finish(ob, m, l_sum, has_keys)
    return out.permute(1, 0, 2), lse.permute(1, 0)


def reference(
    case,  # noqa: ANN001 - a harness Case with an FP8 cache (kv_dtype)
    inputs,  # noqa: ANN001 - harness.core.batch.Inputs
    device: torch.device | str = "cpu",
) -> RefOutput:
    """Every query's output with P rounded as FA3's FP8 forward rounds it (module doc): float64 on
    the CPU, float32 accumulation on a GPU, as the exact reference."""
    if case.kv_dtype is None:
        raise ValueError("the rounded-probabilities reference needs an FP8 cache: kv_dtype is None")
    device = torch.device(device)
    acc = torch.float64 if device.type == "cpu" else torch.float32
    pairs = [
        _request(mask, inputs.q[r], inputs.k[r], inputs.v[r], inputs.sinks, case, acc, device)
        for r, mask in enumerate(case_masks(case))
    ]
    return RefOutput(out=torch.cat([o for o, _ in pairs]), lse=torch.cat([lse for _, lse in pairs]))
