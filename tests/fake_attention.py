"""The dense attention both library fakes compute with (tests/flashinfer_fake.py,
tests/flash_attn_fakes.py): explicit visibility, soft cap, a sink, GQA. Each fake decides what it
loads and which keys are visible, as its library does; this only does the arithmetic."""

from __future__ import annotations

import math

import torch


def attend(q, k, v, visible, scale, softcap, sink):
    """q [E, Hq, D], loaded k/v [n, Hkv, D], visible [E, n] -> out [E, Hq, D], lse [Hq, E] (fp32)."""
    e, hq, d = q.shape
    g = hq // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1).transpose(0, 1)  # [Hq, n, D]
    vf = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    s = torch.matmul(q.float().transpose(0, 1), kf.transpose(1, 2)) * scale  # [Hq, E, n]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = torch.where(visible[None], s, torch.tensor(-math.inf))
    m = s.amax(-1, keepdim=True) if s.shape[-1] else torch.full((hq, e, 1), -math.inf)
    if sink is not None:
        m = torch.maximum(m, sink.float().view(hq, 1, 1))
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.where(visible[None], torch.exp(s - base), torch.zeros_like(s))
    denom = p.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink.float().view(hq, 1, 1) - base)
    out = torch.matmul(p, vf) / torch.where(denom > 0, denom, torch.ones_like(denom))
    lse = torch.where(denom > 0, base + torch.log(denom), torch.tensor(-math.inf)).squeeze(-1)
    return out.transpose(0, 1).to(q.dtype), lse
