"""The tolerance policy and error localisation: backend output vs reference -> Verdict.

Rule (flash-attn's own): err = max|out - ref| over the whole output must satisfy
    err <= k * err_same_precision + noise(dtype),   k = 2 (3 with a soft cap)
where ref is the exact reference, err_same_precision is the distance of the same reference
computed in the case dtype, and noise is twice the rounding of one add in that dtype at the
output's magnitude. With an FP8 KV cache err_same_precision also counts what dequantizing its values
into the case dtype alone does (the exact reference over them rounded to it: docs/design.md, "The
tolerance rule"); for a backend that casts its queries to that cache's dtype (`fp8_queries`) every
reference is computed over the queries rounded so (harness/checks/judged_inputs.py), and for one
that also rounds its softmax probabilities to that dtype (`fp8_probabilities`, FA3's FP8 forward)
err_same_precision counts the distance of the exact reference over P rounded so as well
(references/fp8_probabilities.py). The budget is capped at a quarter of the reference's range
(max - min): wider, it would pass outputs that carry no information (any constant output is off
by half the range).
NaN or Inf in the output fails outright; harness/checks/numeric.py finds out where it came from.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass

import torch

from harness.core import modes
from harness.core.case import Case
from harness.core.vocab import TORCH_DTYPES

# LSE is fp32 in every kernel; below this its differences are accumulation order, not bugs.
LSE_FLOOR = 1e-5
# The budget's cap, a fraction of the reference's range (max - min).
RANGE_CAP = 0.25


@dataclass(kw_only=True)
class Verdict:
    passed: bool
    err: float
    budget: float
    ratio: float
    worst: tuple[int, int, int] | None  # (request, token within request, q head)
    frac_over: float  # fraction of output elements over the budget
    nonfinite: int  # NaN/Inf elements in the output
    reason: str
    lse_err: float | None = None
    lse_budget: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _max_abs(x: torch.Tensor) -> torch.Tensor:
    """max|x| as a 0-d tensor on x's device, in one reduction (0 for no elements; NaN propagates)."""
    if not x.numel():
        return torch.zeros((), device=x.device)
    return torch.linalg.vector_norm(x, float("inf"))


def _rounding(ref: torch.Tensor, dtype: str) -> torch.Tensor:
    """max|(x+0.3)-0.3-x| with x = ref in dtype, as a 0-d tensor on ref's device (no readback)."""
    x = ref.to(TORCH_DTYPES[dtype])
    y = x + 0.3  # then in place, op by op: the same roundings without a fresh tensor per step
    return _max_abs(y.sub_(0.3).sub_(x))


def _range(x: torch.Tensor) -> torch.Tensor:
    """max(x) - min(x) as a 0-d tensor (0 for no elements)."""
    if not x.numel():
        return torch.zeros((), dtype=x.dtype, device=x.device)
    low, high = torch.aminmax(x)
    return high - low


def noise(ref: torch.Tensor, dtype: str) -> float:
    """Twice the rounding of one add in `dtype` at the values' magnitude."""
    return 2.0 * float(_rounding(ref, dtype))


def uninformative(ref_exact: torch.Tensor) -> str | None:
    """Why a check against this exact reference could not fail, or None. A reference that is not
    finite judges nothing (its budget is not a number), and one whose every element is the same value
    (all zero: an FP8 cache whose scale rounds every V to code 0) has a budget of 0, capped at its
    range, that an output ignoring the keys and values meets exactly. Such a case is refused, never
    passed."""
    if not ref_exact.numel():
        return None  # no query rows: nothing to judge
    low, high = (float(x) for x in torch.aminmax(ref_exact))
    if not (math.isfinite(low) and math.isfinite(high)):
        return "refused: the exact reference is not finite, so no output can be judged against it"
    if low == high:
        return (
            f"refused: every element of the exact reference is {low:g} (range 0, so the budget is 0), which "
            "an output that ignores the keys and values meets: a check that cannot fail is no check"
        )
    return None


def locate(flat_index: int, qo_indptr: list[int], heads: int, dim: int) -> tuple[int, int, int]:
    """Flat index into a [sum E, Hq, D] output -> (request, token within the request, head)."""
    token, rest = divmod(flat_index, heads * dim)
    r = bisect.bisect_right(qo_indptr, token) - 1
    return r, token - qo_indptr[r], rest // dim


def where(case: Case, worst: tuple[int, int, int]) -> str:
    r, j, h = worst
    req = case.requests[r]
    pos = modes.query_positions(case.mode, req.prefix_len, req.extend_len, req.tree)[j]
    return f"request {r}, token {j} (position {pos}), head {h}"


def compare(
    case: Case,
    out: torch.Tensor,
    ref_exact: torch.Tensor,
    ref_native: torch.Tensor,
    lse: torch.Tensor | None = None,
    lse_exact: torch.Tensor | None = None,
    lse_native: torch.Tensor | None = None,
    ref_rounded_kv: torch.Tensor | None = None,
    lse_rounded_kv: torch.Tensor | None = None,
    ref_rounded_p: torch.Tensor | None = None,
) -> Verdict:
    """Judge one backend output against the exact reference with the case's budget. `ref_rounded_kv`,
    `lse_rounded_kv` (an FP8 KV cache): the exact reference over K/V rounded to the case dtype, whose
    distance from exact joins the native one in the budget; `ref_rounded_p` (a backend rounding its
    probabilities to the cache's dtype) likewise, over P rounded so (the LSE's sum is unrounded)."""
    if tuple(out.shape) != tuple(ref_exact.shape):
        return _failed(
            err=float("inf"),
            budget=0.0,
            reason=f"output shape {tuple(out.shape)} != expected {tuple(ref_exact.shape)}",
        )
    ref = ref_exact.to(out.device)
    mult = 3.0 if case.soft_cap > 0 else 2.0
    # In the reference's dtype: a narrower output is promoted in the arithmetic below, not copied.
    outd = out if torch.promote_types(out.dtype, ref.dtype) == ref.dtype else out.to(ref.dtype)
    diff = (outd - ref).abs_().flatten()
    with_lse = lse is not None and lse_exact is not None and lse_native is not None and not case.sinks
    lse_rows = (lse, lse_exact, lse_native, lse_rounded_kv) if with_lse else None
    values = _read_back(case, diff, ref, ref_native, (ref_rounded_kv, ref_rounded_p), lse_rows)
    flat_at, err, native_err, rounding, spread = values[:5]
    rule = mult * native_err + 2.0 * rounding
    budget = rule if rule <= RANGE_CAP * spread else RANGE_CAP * spread  # a NaN rule is capped too
    if not math.isfinite(err):
        return _nonfinite(case, outd, err, budget)
    ratio = err / budget if budget > 0 else (0.0 if err == 0 else float("inf"))
    passed = err <= budget
    # Counted for a failure only: within budget, no element is over it.
    frac = float((diff > budget).float().mean()) if diff.numel() and not passed else 0.0
    worst = _locate(case, int(flat_at)) if diff.numel() else None
    reason = _err_reason(case, err, budget, rule, worst, frac)
    lse_err = lse_budget = None
    if with_lse:
        lse_err, lse_native_err, lse_rounding = values[5:]
        lse_budget = mult * lse_native_err + 2.0 * lse_rounding + LSE_FLOOR
        why = _lse_failure(lse_err, lse_budget)
        passed, reason = passed and not why, reason + why
    return Verdict(
        passed=passed,
        err=err,
        budget=budget,
        ratio=ratio,
        worst=worst,
        frac_over=frac,
        nonfinite=0,
        reason=reason,
        lse_err=lse_err,
        lse_budget=lse_budget,
    )


def _err_reason(
    case: Case, err: float, budget: float, rule: float, worst: tuple[int, int, int] | None, frac: float
) -> str:
    """The verdict's reason on the output."""
    ratio = err / budget if budget > 0 else (0.0 if err == 0 else float("inf"))
    passed = err <= budget
    reason = (
        f"err {err:.3g} {'<=' if passed else '>'} budget {budget:.3g} (ratio {ratio:.2f}); "
        f"worst at {where(case, worst) if worst else '-'}"
    )
    if not passed:
        reason += f"; {frac:.1%} of elements over budget"
    if budget != rule:
        reason += f"; budget capped at {RANGE_CAP:g} x the reference's range (the rule gave {rule:.3g})"
    return reason


def _read_back(
    case: Case,
    diff: torch.Tensor,
    ref: torch.Tensor,
    ref_native: torch.Tensor,
    rounded: tuple[torch.Tensor | None, ...],
    lse_rows: tuple[torch.Tensor | None, ...] | None,
) -> list[float]:
    """[worst element's flat index, err, native err (plus the distance of each `rounded` reference
    given), rounding, the reference's range] and, with the LSE rows (lse, exact, native, rounded KV
    or None), [LSE err, native LSE err, LSE rounding].

    Every number the verdict needs is computed where the tensors are and read back at once: on a GPU
    each separate read waits for the device (one wait instead of about ten). The stack promotes every
    scalar to float64 (the worst element's index is made float64 first: exact up to 2^53). The
    reference is finite, so a NaN or Inf in the output shows in `err`."""
    err_t, at_t = torch.max(diff, 0) if diff.numel() else [_max_abs(diff)] * 2  # no rows: 0, at 0
    native_err = _max_abs(ref_native.to(ref) - ref)
    for other in rounded:
        if other is not None:
            native_err = native_err + _max_abs(other.to(ref) - ref)
    scalars = [at_t.double(), err_t, native_err, _rounding(ref, case.dtype), _range(ref)]
    if lse_rows is not None:
        lse, lse_exact, lse_native, lse_rounded_kv = lse_rows
        le = lse_exact.to(lse.device, torch.float64)
        finite = torch.isfinite(le)  # a row with no visible key (-inf) is judged by nothing below
        rows = [lse, lse_native] + ([lse_rounded_kv] if lse_rounded_kv is not None else [])
        both = torch.stack([x.to(lse.device) for x in rows]).double()  # the backend's, native's(, rounded)
        over = torch.where(finite, both - le, 0.0)
        no_rows = le.new_zeros(len(rows))
        norms = torch.linalg.vector_norm(over, float("inf"), dim=(1, 2)) if le.numel() else no_rows
        scalars += [norms[0], norms[1:].sum(), _rounding(torch.where(finite, le, 0.0), "float32")]
    return torch.stack(scalars).tolist()


def _locate(case: Case, flat_index: int) -> tuple[int, int, int]:
    qo = modes.offsets([r.extend_len for r in case.requests])
    return locate(flat_index, qo, case.num_q_heads, case.head_dim)


def _failed(
    *,
    err: float,
    budget: float,
    reason: str,
    worst: tuple[int, int, int] | None = None,
    frac_over: float = 1.0,
    nonfinite: int = 0,
) -> Verdict:
    return Verdict(
        passed=False,
        err=err,
        budget=budget,
        ratio=float("inf"),
        worst=worst,
        frac_over=frac_over,
        nonfinite=nonfinite,
        reason=reason,
    )


def _nonfinite(case: Case, outd: torch.Tensor, err: float, budget: float) -> Verdict:
    """The verdict on an output with NaN or Inf (if none, on a reference without a finite err)."""
    bad = ~torch.isfinite(outd)
    nonfinite = int(bad.sum())
    if not nonfinite:
        return _failed(err=err, budget=budget, reason=f"the reference is not finite (err {err})")
    first = _locate(case, int(bad.flatten().nonzero()[0]))
    return _failed(
        err=float("nan"),
        budget=budget,
        worst=first,
        frac_over=nonfinite / outd.numel(),
        nonfinite=nonfinite,
        reason=f"output has {nonfinite} NaN/Inf values, first at {where(case, first)}",
    )


def _lse_failure(lse_err: float, lse_budget: float) -> str:
    """Why the LSE fails ("; ..."), or "" when it is within its budget."""
    if not math.isfinite(lse_err):
        return "; LSE has NaN/Inf where keys are visible"
    if not math.isfinite(lse_budget):  # it would pass any LSE: judged by nothing is not a pass
        return f"; LSE budget {lse_budget} (the same-precision LSE is not finite where keys are seen)"
    if lse_err > lse_budget:
        return f"; LSE err {lse_err:.3g} > budget {lse_budget:.3g} (natural log expected)"
    return ""
