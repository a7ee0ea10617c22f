"""The error map of a failing case: per (token bin, head) the max error over head_dim, NaN/Inf as null."""

import math

import torch

from harness.checks.numeric import MAX_BINS, error_map
from harness.core.case import Case, Request


def _case(lengths: list[int], heads: int) -> Case:
    reqs = tuple(Request(0, n) for n in lengths)
    return Case(mode="EXTEND", requests=reqs, num_q_heads=heads, num_kv_heads=1, head_dim=8)


def _expected(diff: torch.Tensor, b: int) -> list[list[float | None]]:
    """Each bin of `b` tokens read one at a time, element by element."""
    n, h, _ = diff.shape
    out = []
    for t0 in range(0, n, b):
        row = []
        for head in range(h):
            cell = diff[t0 : t0 + b, head].flatten().tolist()
            row.append(None if any(not math.isfinite(x) for x in cell) else float(f"{max(cell):.4g}"))
        out.append(row)
    return out


def test_bins_cover_every_token_with_a_partial_last_bin_and_null_for_nan():
    n, heads = 2 * MAX_BINS + 8, 3  # bins of 3 tokens, the last one of 1
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(n, heads, 8, generator=gen, dtype=torch.float64)
    out = ref + 1e-3 * torch.randn(n, heads, 8, generator=gen, dtype=torch.float64)
    out[n - 1, 2, 5] = 0.75 + ref[n - 1, 2, 5]  # the worst error, alone in the partial bin
    out[4, 1, 0] = float("nan")
    out[n - 2, 0, 3] = float("inf")
    m = error_map(_case([n - 100, 100], heads), out, ref, budget=0.01)
    assert (m["tokens"], m["heads"], m["token_bin"], m["request_starts"]) == (n, heads, 3, [0, n - 100])
    assert m["values"] == _expected((out - ref).abs(), 3)
    assert len(m["values"]) == -(-n // 3) and m["values"][-1][2] == 0.75
    assert m["values"][1][1] is None and m["values"][-2][0] is None and m["values"][0][1] is not None


def test_a_short_output_has_a_bin_per_token():
    ref = torch.zeros(5, 2, 8)
    out = ref.clone()
    out[3, 1, 7] = -0.5
    m = error_map(_case([5], 2), out, ref, budget=0.1)
    assert m["token_bin"] == 1 and m["values"] == [[0.0, 0.0]] * 3 + [[0.0, 0.5], [0.0, 0.0]]
