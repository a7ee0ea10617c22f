"""The pure-PyTorch reference: explicit masks from references/masks.py, chunked over keys.

`reference(case, inputs, precision="exact")`: float64 on the CPU (float32 on a GPU), an online
softmax over key blocks that skips blocks no query can see, so memory is bounded and a windowed
request costs O(T * W); on a GPU a small batch is one padded computation (`_padded`).
`precision="native"` rounds like a low-precision kernel: its distance from exact is the tolerance's
noise floor. A logit (scaled query, score) past the dtype's largest finite value is kept in float32
instead of overflowing, as a kernel holding its scores in float32 does, so native never overflows
where exact does not. `references(case, inputs)` gives both, sharing the mask and padded inputs on a GPU.
`precision="rounded_kv"` is exact arithmetic over K/V rounded to the case dtype: for K/V wider than
it (an FP8 cache's values, float32) its distance from exact is what dequantizing into the case dtype
alone does, the tolerance's second noise term there; for K/V in the case dtype it is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from references.masks import RequestMask, case_masks, padded_positions, padded_visible_from, upload

# Its own copy of harness/core/vocab.py's TORCH_DTYPES: the references import nothing of harness/.
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PRECISIONS = ("exact", "native", "rounded_kv")


@dataclass
class RefOutput:
    out: torch.Tensor  # [sum E, Hq, D]
    lse: torch.Tensor  # [sum E, Hq], natural log over the visible keys (sinks excluded); -inf if none


# Native mode's second pass needs a query block's rounded scores again: kept up to this many bytes,
# recomputed beyond (a long request without a window), so memory stays bounded either way.
NATIVE_KEEP_BYTES = 512 << 20


def block_sizes(device: torch.device) -> tuple[int, int]:
    """(queries, keys) per block: small on the CPU (float64), larger on a GPU to cut launches."""
    return (1024, 4096) if device.type == "cuda" else (256, 1024)


class _Scratch:
    """Reusable storage for a key block's scores: a fresh multi-MiB tensor per block costs more in
    page faults than the arithmetic on it (measured on the CPU), so each block reuses one buffer."""

    def __init__(self, numel: int, acc: torch.dtype, low: torch.dtype | None, device: torch.device) -> None:
        self.acc = torch.empty(numel, dtype=acc, device=device)
        self.low = None if low is None else torch.empty(numel, dtype=low, device=device)

    def scores(self, shape: tuple[int, ...]) -> torch.Tensor:
        return self.acc[: math.prod(shape)].view(shape)

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """Round `t` to the low dtype in place (stored back in `t`'s dtype), as `.to(low).to(acc)`."""
        low = self.low[: t.numel()].view(t.shape)
        low.copy_(t)
        return t.copy_(low)

    def round_logits(self, t: torch.Tensor) -> torch.Tensor:
        """`round` for logits, which may pass the low dtype's range (`_round_held`)."""
        low = self.low[: t.numel()].view(t.shape)
        low.copy_(t)
        return _round_held(t, low)


def _round_held(t: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """`t` rounded in place to `low`'s values (`low` is `t` in the low dtype), except where the low
    dtype overflowed (inf where `t` is finite): there `t` is kept, as in a kernel's float32 scores.
    Within the dtype's range this is `t.copy_(low)`, so ordinary cases round exactly as before. The
    CPU takes that plain copy once one reduction shows nothing can overflow (the select costs ten
    copies there); a GPU always selects, which needs no readback."""
    if t.device.type == "cpu" and t.numel():
        lo, hi = torch.aminmax(t)
        if max(-float(lo), float(hi)) <= torch.finfo(low.dtype).max:  # False for NaN: the select
            return t.copy_(low)
    return torch.where(low.isinf(), t, low, out=t)


def _operand(x, acc, kv_round, device):  # noqa: ANN001, ANN202 - K or V as the arithmetic takes it
    """x in the accumulation dtype, rounded to `kv_round` first when given (rounded_kv precision)."""
    x = x.to(device)
    return (x if kv_round is None else x.to(kv_round)).to(acc)


def _query_block(q, scale, round_to):  # noqa: ANN001, ANN202 - hot inner helper
    """The query block as the score matmul takes it: native mode scales it and rounds it first."""
    if round_to is None:
        return q
    scaled = q * scale
    return _round_held(scaled, scaled.to(round_to))


def _scores(qb, k, scale, cap, scratch, s):  # noqa: ANN001, ANN202 - hot inner helper
    """[Hkv, G, nq, D] x [Hkv, nk, D] -> [Hkv, G, nq, nk] into `s`, capped; in native mode
    (scratch.low set) `qb` is already scaled and every step is rounded like the dtype."""
    torch.matmul(qb, k.unsqueeze(1).transpose(-1, -2), out=s)
    if scratch.low is None:
        s.mul_(scale)
        return s.div_(cap).tanh_().mul_(cap) if cap > 0 else s
    scratch.round_logits(s)
    if cap > 0:
        scratch.round_logits(s.div_(cap).tanh_().mul_(cap))
    return s


def _normaliser(m, l_sum, sink):  # noqa: ANN001, ANN202 - shared by the loop and the padded batch
    """(top, rescale or None, safe denominator, has_keys) from a softmax's running max and sum; a sink
    is one more virtual key whose logit counts in the denominator only (without one, the denominator
    is the sum and nothing is rescaled: None)."""
    has_keys = l_sum > 0
    if sink is None:
        return m, None, torch.where(has_keys, l_sum, 1.0), has_keys
    top = torch.maximum(m, sink)
    rescale = torch.exp(m - top)
    denom = l_sum * rescale + torch.exp(sink - top)
    return top, rescale, torch.where(denom > 0, denom, 1.0), has_keys


def _out_scale(rescale, safe):  # noqa: ANN001, ANN202
    """The factor that normalises an output accumulated against the running max: rescale / safe."""
    return safe.reciprocal() if rescale is None else rescale / safe


def _finish(ob, m, l_sum, has_keys):  # noqa: ANN001, ANN202
    """Output and natural-log LSE (m + log(sum)); a query with no visible key gets 0 and -inf. `ob`
    is the caller's fresh tensor and is zeroed in place."""
    none = ~has_keys
    out = ob.masked_fill_(none.unsqueeze(-1), 0.0)
    return out, torch.log(l_sum).add_(m).masked_fill_(none, -torch.inf)


def _heads_first(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    acc: torch.dtype,
    kv_round: torch.dtype | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q as [Hkv, G, E, D], k and v as [Hkv, T, D], sinks as [Hkv, G, 1], in the accumulation dtype."""
    e, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qh = q.to(device=device, dtype=acc).permute(1, 0, 2).reshape(hkv, g, e, d)
    kh = _operand(k, acc, kv_round, device).permute(1, 0, 2)
    vh = _operand(v, acc, kv_round, device).permute(1, 0, 2)
    sink = None if sinks is None else sinks.to(device=device, dtype=acc).reshape(hkv, g, 1)
    return qh, kh, vh, sink


def _rounded_output(
    o: torch.Tensor,
    top: torch.Tensor,
    safe: torch.Tensor,
    blocks: list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]],
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
    cap: float,
    scratch: _Scratch,
    round_to: torch.dtype,
) -> torch.Tensor:
    """Second pass: normalised probabilities rounded to the dtype, as a low-precision P @ V; the
    scores a block did not keep are computed again. `o` gives the block's shape and dtype."""
    qb, kh, vh = qkv
    ob = torch.zeros_like(o)
    base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    for k0, k1, hidden, s in blocks:
        if s is None:
            s = _scores(qb, kh[:, k0:k1], scale, cap, scratch, scratch.scores((*o.shape[:3], k1 - k0)))
            if hidden is not None:
                s.masked_fill_(hidden, -torch.inf)
        p = scratch.round(s.sub_(base.unsqueeze(-1)).exp_().div_(safe.unsqueeze(-1)))
        ob = ob + torch.matmul(p, vh[:, k0:k1].unsqueeze(1))
    return ob.to(round_to).to(o.dtype)


def _request(
    mask: RequestMask,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
    cap: float,
    acc: torch.dtype,
    round_to: torch.dtype | None,
    device: torch.device,
    kv_round: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    e, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qh, kh, vh, sink = _heads_first(q, k, v, sinks, acc, kv_round, device)
    bq, bk = block_sizes(device)
    item = torch.finfo(acc).bits // 8
    scratch = _Scratch(hq * min(e, bq) * min(k.shape[0], bk), acc, round_to, device)
    out = torch.zeros(hkv, g, e, d, dtype=acc, device=device)
    lse = torch.full((hkv, g, e), -torch.inf, dtype=acc, device=device)
    for q0 in range(0, e, bq):
        q1 = min(e, q0 + bq)
        lo, hi = mask.key_range(q0, q1)
        qb = _query_block(qh[:, :, q0:q1], scale, round_to)
        m = torch.full((hkv, g, q1 - q0), -torch.inf, dtype=acc, device=device)
        l_sum = torch.zeros_like(m)
        o = torch.zeros(hkv, g, q1 - q0, d, dtype=acc, device=device)
        # Native mode needs the scores twice; it keeps them when they fit in NATIVE_KEEP_BYTES.
        keep = round_to is not None and hq * (q1 - q0) * (hi - lo) * item <= NATIVE_KEEP_BYTES
        blocks = []  # (k0, k1, hidden keys or None, kept scores or None), for the second pass
        for k0 in range(lo, hi, bk):
            k1 = min(hi, k0 + bk)
            shape = (hkv, g, q1 - q0, k1 - k0)
            kept = torch.empty(shape, dtype=acc, device=device) if keep else None
            s = _scores(
                qb, kh[:, k0:k1], scale, cap, scratch, scratch.scores(shape) if kept is None else kept
            )
            hidden = None if mask.fully_visible(q0, q1, k0, k1) else ~mask.block(q0, q1, k0, k1).to(device)
            if hidden is not None:
                s.masked_fill_(hidden, -torch.inf)
            blocks.append((k0, k1, hidden, kept))
            m_new = torch.maximum(m, s.amax(-1))
            base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - base)
            b = base.unsqueeze(-1)
            p = (s.sub_(b) if kept is None else torch.sub(s, b, out=scratch.scores(shape))).exp_()
            l_sum = l_sum * alpha + p.sum(-1)
            if round_to is None:
                o = o * alpha.unsqueeze(-1) + torch.matmul(p, vh[:, k0:k1].unsqueeze(1))
            m = m_new
        top, rescale, safe, has_keys = _normaliser(m, l_sum, sink)
        if round_to is None:
            ob = o * _out_scale(rescale, safe).unsqueeze(-1)
        else:
            ob = _rounded_output(o, top, safe, blocks, (qb, kh, vh), scale, cap, scratch, round_to)
        out[:, :, q0:q1], lse[:, :, q0:q1] = _finish(ob, m, l_sum, has_keys)
    return out.reshape(hq, e, d).permute(1, 0, 2), lse.reshape(hq, e).permute(1, 0)


# A batch is computed as one padded computation (a few dozen launches instead of a few dozen per
# request) when its padded score tensor [B, Hq, max E, max T] has at most this many elements (512 MiB
# in float32; the computation's peak is about four such tensors): on a GPU the per-request loop is
# launch-bound, and a padded batch of this size takes about a millisecond.
PADDED_MAX_ELEMENTS = 1 << 27


def padded_elements(masks: list[RequestMask], num_q_heads: int) -> int:
    """Elements of the padded score tensor of a batch: [B, Hq, max queries, max keys]."""
    return len(masks) * num_q_heads * max(m.num_queries for m in masks) * max(m.num_keys for m in masks)


def _row_index(lengths: tuple[int, ...], width: int) -> np.ndarray:
    """[B, width] rows of packed inputs (each request's rows after the previous one's) that make a
    padded [B, width] batch: request r's rows, then its last row repeated as padding. Padding only has
    to be finite: padded keys are masked before the softmax (their probabilities are exactly 0) and
    padded queries are dropped, so one gather replaces zero-filling and a copy per request."""
    n = np.asarray(lengths, dtype=np.int64)
    start = np.cumsum(n) - n
    return start[:, None] + np.minimum(np.arange(width), n[:, None] - 1)


def _real_rows(lengths: list[int], width: int) -> np.ndarray:
    """Rows of a flattened [B * width] padded batch that hold real queries, in request order."""
    at = np.arange(width)
    return (np.arange(len(lengths))[:, None] * width + at)[at < np.asarray(lengths)[:, None]]


def _padded(
    masks: list[RequestMask],
    inputs,  # noqa: ANN001 - harness.core.batch.Inputs
    scale: float,
    cap: float,
    precisions: list[tuple[torch.dtype, torch.dtype | None, torch.dtype | None]],
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every request at once, padded to the longest, once per (accumulation dtype, rounding, K/V
    rounding) of `precisions`: the mask and the padded inputs are prepared once and shared. The same
    arithmetic as `_request` with a single key block, but the padded matmuls may sum in a different
    order (not bitwise equal to it). A GQA group's queries are stacked along the rows ([B, Hkv, G*E, D]), so
    both matmuls are plain batched products, with no key or value copied per query head. The
    positions for the mask, the gathers that pad the packed inputs and the one that unpads the
    results go to the device in one copy."""
    bsz = len(masks)
    hq, hkv, d = inputs.q_all.shape[1], inputs.kv_all.shape[2], inputs.q_all.shape[2]
    g = hq // hkv
    host = padded_positions(masks)
    e, t = host["query_pos"].shape[1], host["key_pos"].shape[1]
    lengths = [m.num_queries for m in masks]
    host |= {
        "q_rows": _row_index(inputs.q_lens, e),
        "kv_rows": _row_index(inputs.kv_lens, t),
        "out_rows": _real_rows(lengths, e),
    }
    dev = upload(host, device)
    hidden = ~padded_visible_from(dev, masks)[:, None, None]  # [B, 1, 1, E, T]
    q = inputs.q_all.to(device).index_select(0, dev["q_rows"].flatten())
    q = q.view(bsz, e, hkv, g, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, E, D]
    kv = inputs.kv_all.to(device).index_select(1, dev["kv_rows"].flatten()).view(2, bsz, t, hkv, d)
    k, v = kv[0].permute(0, 2, 1, 3), kv[1].permute(0, 2, 1, 3)  # [B, Hkv, T, D]
    converted: dict[tuple, tuple[torch.Tensor, ...]] = {}  # exact and native share float32 on a GPU
    out = []
    for acc, round_to, kv_round in precisions:
        if (acc, kv_round) not in converted:  # read only below: safe to share between precisions
            qh = q.to(acc, memory_format=torch.contiguous_format).view(bsz, hkv, g * e, d)
            kvh = (x if kv_round is None else x.to(kv_round) for x in (k, v))
            converted[acc, kv_round] = (qh, *(x.to(acc, memory_format=torch.contiguous_format) for x in kvh))
        qh, kh, vh = converted[acc, kv_round]
        sink = None if inputs.sinks is None else inputs.sinks.to(device, acc).reshape(1, hkv, g, 1)
        o, lse = _padded_softmax(qh, kh, vh, hidden, sink, scale, cap, round_to, g)
        out.append(
            (
                o.permute(0, 3, 1, 2, 4).reshape(bsz * e, hq, d).index_select(0, dev["out_rows"]),
                lse.permute(0, 3, 1, 2).reshape(bsz * e, hq).index_select(0, dev["out_rows"]),
            )
        )
    return out


def _padded_softmax(qh, kh, vh, hidden, sink, scale, cap, round_to, g):  # noqa: ANN001, ANN202 - hot inner helper
    """[B, Hkv, G*E, D] queries against [B, Hkv, T, D] keys and values with a [B, 1, 1, E, T] hidden
    mask -> out [B, Hkv, G, E, D], lse [B, Hkv, G, E]."""
    s = torch.matmul(_query_block(qh, scale, round_to), kh.transpose(-1, -2))  # [B, Hkv, G*E, T]
    if round_to is None:
        s.mul_(scale)
        if cap > 0:
            s.div_(cap).tanh_().mul_(cap)
    else:
        _round_held(s, s.to(round_to))
        if cap > 0:
            s.div_(cap).tanh_().mul_(cap)
            _round_held(s, s.to(round_to))
    bsz, hkv, _, t = s.shape
    s5 = s.view(bsz, hkv, g, -1, t).masked_fill_(hidden, -torch.inf)
    m = s5.amax(-1)
    base = m.nan_to_num(nan=torch.nan, neginf=0.0).unsqueeze(-1)  # a row with no visible key: 0
    p = (s5.sub_(base) if round_to is None else s5 - base).exp_()
    l_sum = p.sum(-1)
    top, rescale, safe, has_keys = _normaliser(m, l_sum, sink)
    if round_to is not None:  # probabilities normalised and rounded to the dtype, as a low-precision P @ V
        top_base = base if sink is None else top.nan_to_num(nan=torch.nan, neginf=0.0).unsqueeze(-1)
        p = s5.sub_(top_base).exp_().div_(safe.unsqueeze(-1))
        p.copy_(p.to(round_to))
    ob = torch.matmul(p.view(bsz, hkv, -1, t), vh).view(bsz, hkv, g, -1, vh.shape[-1])
    if round_to is None:
        ob.mul_(_out_scale(rescale, safe).unsqueeze(-1))
    else:
        ob = ob.to(round_to).to(p.dtype)
    return _finish(ob, m, l_sum, has_keys)


def references(
    case,  # noqa: ANN001 - a harness Case (duck-typed: references import nothing of harness)
    inputs,  # noqa: ANN001 - harness.core.batch.Inputs
    precisions: tuple[str, ...] = ("exact", "native"),
    device: torch.device | str = "cpu",
    padded: bool | None = None,
) -> list[RefOutput]:
    """Expected output of every query of the case, concatenated in request order, once per precision.

    exact: float64 on the CPU, float32 accumulation on a GPU. native: rounded like the case dtype.
    rounded_kv: exact arithmetic over K/V rounded to the case dtype.
    padded: compute the batch as one padded computation (None: on a GPU when its padded scores have
    at most PADDED_MAX_ELEMENTS elements; the CPU keeps the per-request loop, which skips masked
    blocks and is bound by arithmetic, not launches). The precisions of one call share the padded
    mask and inputs: a check asks for both in one call.
    """
    device = torch.device(device)
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise ValueError(f"precision={bad[0]!r} is not one of {', '.join(PRECISIONS)}")
    kinds = [
        (
            torch.float64 if device.type == "cpu" and p != "native" else torch.float32,
            _DTYPES[case.dtype] if p == "native" else None,
            _DTYPES[case.dtype] if p == "rounded_kv" else None,
        )
        for p in precisions
    ]
    masks = case_masks(case)
    if padded is None:
        padded = device.type != "cpu" and padded_elements(masks, case.num_q_heads) <= PADDED_MAX_ELEMENTS
    if padded:
        found = _padded(masks, inputs, case.scale, float(case.soft_cap), kinds, device)
        return [RefOutput(out=o, lse=lse) for o, lse in found]
    results = []
    for acc, round_to, kv_round in kinds:
        pairs = [
            _request(
                mask,
                inputs.q[r],
                inputs.k[r],
                inputs.v[r],
                inputs.sinks,
                case.scale,
                float(case.soft_cap),
                acc,
                round_to,
                device,
                kv_round,
            )
            for r, mask in enumerate(masks)
        ]
        results.append(
            RefOutput(out=torch.cat([o for o, _ in pairs]), lse=torch.cat([lse for _, lse in pairs]))
        )
    return results


def reference(
    case,  # noqa: ANN001 - a harness Case
    inputs,  # noqa: ANN001 - harness.core.batch.Inputs
    precision: str = "exact",
    device: torch.device | str = "cpu",
    padded: bool | None = None,
) -> RefOutput:
    """The reference of one precision (`references` documents the arguments)."""
    return references(case, inputs, (precision,), device, padded)[0]
