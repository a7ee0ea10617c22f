"""Reference against reference: torch_ref and hf_ref must agree to float64 noise on every CPU case.

The two are written independently (references/masks.py + an online softmax, vs transformers' mask
functions + eager attention), so a mask or convention mistake in either shows up as a disagreement
far above the bound below, which is the forward-error bound of two float64 evaluations.
"""

from __future__ import annotations

import importlib.util
from functools import cache

import torch

U64 = 2.0**-53  # unit roundoff of float64


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term float64 sum."""
    return n * U64 / (1 - n * U64)


def float64_noise(case, inputs) -> float:  # noqa: ANN001 - a Case and its Inputs
    """How far two float64 evaluations of this case's attention may differ.

    The scores s = scale * q.k carry an error of at most gamma_D * scale * sum|q_d k_d| <= gamma_D * S,
    with S = scale * D * max|q| * max|k|; a score error ds moves the softmax weights by a relative
    2 ds, and the T-term normalisation and weighted sum add gamma_T each. So each result is within
    max|v| * (2 gamma_D S + 2 gamma_T) of the exact value, and the two within twice that.
    """
    d = case.head_dim
    t = max(k.shape[0] for k in inputs.k)
    qmax = max(float(q.double().abs().max()) for q in inputs.q)
    kmax = max(float(k.double().abs().max()) for k in inputs.k)
    vmax = max(float(v.double().abs().max()) for v in inputs.v)
    s = case.scale * d * qmax * kmax
    return vmax * (4 * gamma(d) * s + 4 * gamma(t))


@cache
def hf_available() -> bool:
    """The HF reference needs transformers (the `hf` extra); without it only torch_ref judges."""
    return importlib.util.find_spec("transformers") is not None


def disagreement(case, inputs, torch_exact: torch.Tensor) -> str | None:  # noqa: ANN001
    """None if hf_ref agrees with torch_ref's float64 output, else the reason (naming where)."""
    from references.hf_ref import reference as hf_reference

    hf = hf_reference(case, inputs, torch.float64)
    ours = torch_exact.to("cpu", torch.float64)
    if hf.shape != ours.shape:
        return f"references disagree: hf_ref shape {tuple(hf.shape)} != torch_ref {tuple(ours.shape)}"
    diff = (hf - ours).abs()
    bound = float64_noise(case, inputs)
    err = float(diff.max()) if diff.numel() else 0.0
    if err <= bound:
        return None
    token, rest = divmod(int(diff.argmax()), case.num_q_heads * case.head_dim)
    r = 0
    while token >= case.requests[r].extend_len:
        token -= case.requests[r].extend_len
        r += 1
    return (
        f"references disagree: max |hf_ref - torch_ref| = {err:.3g} > float64 noise {bound:.3g}, "
        f"at request {r}, token {token}, head {rest // case.head_dim}"
    )
