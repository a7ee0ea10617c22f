"""Where a failing output is wrong: the max error over head_dim per (token, head), kept compactly.

A failing case's record carries this map so that its report can draw the error heatmap without
rerunning anything. Tokens are binned (max over the bin) to at most MAX_BINS columns; values keep
4 significant digits; a NaN/Inf anywhere in a bin is null.
"""

from __future__ import annotations

import torch

from harness.core.case import Case

MAX_BINS = 256
QUANTITY = "max over head_dim of |out - ref|"


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def error_map(case: Case, out: torch.Tensor, ref: torch.Tensor, budget: float) -> dict:
    """{budget, tokens, heads, token_bin, request_starts, values[bin][head] (null: NaN/Inf)}."""
    ref = ref.to(out.device)
    diff = (out.to(ref.dtype) - ref).abs()
    bad = ~torch.isfinite(diff).all(-1)  # [N, H]
    per = torch.nan_to_num(diff, nan=0.0, posinf=0.0).amax(-1).double().cpu()
    bad = bad.cpu()
    n, h = per.shape
    b = max(1, -(-n // MAX_BINS))
    values = []
    for t0 in range(0, n, b):
        worst = per[t0 : t0 + b].amax(0).tolist()
        nan = bad[t0 : t0 + b].any(0).tolist()
        values.append([None if nan[i] else _sig(worst[i]) for i in range(h)])
    starts = [0]
    for r in case.requests[:-1]:
        starts.append(starts[-1] + r.extend_len)
    return {
        "quantity": QUANTITY,
        "budget": _sig(budget),
        "tokens": n,
        "heads": h,
        "token_bin": b,
        "request_starts": starts,
        "values": values,
    }
