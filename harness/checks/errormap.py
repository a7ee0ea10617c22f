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
    per = torch.nan_to_num(diff, nan=0.0, posinf=0.0).amax(-1)
    n, h = per.shape
    b = max(1, -(-n // MAX_BINS))
    bins = -(-n // b)
    # The bins in one reduction each (a tail bin padded with 0 and False, which change no max): on a
    # GPU a loop over up to MAX_BINS slices cost milliseconds per known-issue case.
    worst = torch.cat([per, per.new_zeros(bins * b - n, h)]).view(bins, b, h).amax(1)
    nan = torch.cat([bad, bad.new_zeros(bins * b - n, h)]).view(bins, b, h).any(1)
    values = [
        [None if dead else _sig(w) for w, dead in zip(row, dead_row)]
        for row, dead_row in zip(worst.double().tolist(), nan.tolist())
    ]
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
