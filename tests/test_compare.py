"""The tolerance rule (expected budgets derived by hand, not with the implementation's formula),
localisation, and the non-finite verdicts."""

import pytest
import torch

from harness.core.batch import make_inputs
from harness.core.compare import LSE_FLOOR, compare, locate, noise
from references.torch_ref import reference
from tests.helpers import case


def refs(c):
    inputs = make_inputs(c)
    return reference(c, inputs), reference(c, inputs, "native")


def test_the_reference_itself_passes_with_ratio_zero():
    c = case("EXTEND", ((4, 5), (0, 3)))
    ex, na = refs(c)
    v = compare(c, ex.out.to(torch.bfloat16), ex.out, na.out)
    assert v.passed and v.nonfinite == 0
    assert v.budget > 0 and v.ratio < 1


# Hand-derived roundings for the budget tests below (noise = 2 * max|(x + 0.3) - 0.3 - x| in the dtype):
# bfloat16 (spacing 2^-7 on [1, 2), 2^-8 on [0.5, 1)), x = 1: 1.3 -> 1.296875, - 0.3 -> 0.996875 ->
#   0.99609375, - 1 = -2^-8; x = -1: -0.7 -> -0.69921875, - 0.3 -> -0.99921875 -> -1.0, + 1 = 0.
# float16 (spacing 2^-11 on [0.5, 1), 2^-12 on [0.25, 0.5)), x = 0.5: 0.8 -> 0.7998046875, - 0.3 ->
#   0.4998046875 -> 0.499755859375, - 0.5 = -2^-12; x = -0.5: -0.2 -> -0.199951171875, - 0.3 -> -0.5, 0.
BF16_ROUNDING_AT_1 = 2**-8
F16_ROUNDING_AT_HALF = 2**-12
F32_ROUNDING_AT_1 = 2**-24  # derived in the LSE budget test below


def synthetic(dtype="bfloat16", amplitude=1.0, **kw):
    """A one-token, one-head case of head_dim 8 and a reference alternating +-amplitude (range
    2 * amplitude), in float64 as the CPU's exact reference is."""
    c = case("EXTEND", ((0, 1),), num_q_heads=1, num_kv_heads=1, head_dim=8, dtype=dtype, **kw)
    ref = torch.tensor([amplitude, -amplitude] * 4, dtype=torch.float64).view(1, 1, 8)
    return c, ref


def off_by(t, delta, at=3):
    """`t` with one element moved by `delta` (exact in binary: the deltas below are powers of two)."""
    moved = t.clone()
    moved.view(-1)[at] += delta
    return moved


def test_with_an_fp8_cache_the_budget_adds_what_dequantizing_into_the_case_dtype_does():
    from harness.core.compare import LSE_FLOOR
    from references.torch_ref import references

    c = case("EXTEND", ((30, 5),), kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)
    ex, na, rk = references(c, make_inputs(c), ("exact", "native", "rounded_kv"))

    def dist(a, b):
        return float((a.double() - b).abs().max())

    v = compare(c, ex.out, ex.out, na.out, ex.lse.float(), ex.lse, na.lse, rk.out, rk.lse)
    assert dist(rk.out, ex.out) > 0 and dist(rk.lse, ex.lse) > 0
    expected = 2 * (dist(na.out, ex.out) + dist(rk.out, ex.out)) + noise(ex.out, "bfloat16")
    assert v.passed and v.budget == pytest.approx(expected)
    lse_expected = 2 * (dist(na.lse, ex.lse) + dist(rk.lse, ex.lse)) + noise(ex.lse, "float32") + LSE_FLOOR
    assert v.lse_budget == pytest.approx(lse_expected)
    without = compare(c, ex.out, ex.out, na.out, ex.lse.float(), ex.lse, na.lse)  # the plain rule
    assert without.budget < v.budget and without.lse_budget < v.lse_budget


def test_noise_is_twice_one_rounding():
    x = torch.tensor([1.0, -1.0], dtype=torch.float64)
    assert noise(x, "bfloat16") == 2 * BF16_ROUNDING_AT_1
    assert noise(x / 2, "float16") == 2 * F16_ROUNDING_AT_HALF
    assert noise(x, "float32") == 2 * F32_ROUNDING_AT_1
    assert noise(torch.zeros(3, dtype=torch.float64), "float32") == 0.0  # (0 + 0.3) - 0.3 is exact


def test_budget_is_twice_the_native_error_plus_noise():
    c, ref = synthetic()
    v = compare(c, ref, ref, off_by(ref, 2**-6))
    assert v.budget == 2 * 2**-6 + 2 * BF16_ROUNDING_AT_1 == 0.0390625
    assert v.passed and v.err == 0.0


def test_a_soft_cap_triples_the_native_error():
    c, ref = synthetic(soft_cap=5.0)
    v = compare(c, ref, ref, off_by(ref, 2**-6))
    assert v.budget == 3 * 2**-6 + 2 * BF16_ROUNDING_AT_1 == 0.0546875


def test_float16_budget_uses_float16_rounding():
    c, ref = synthetic("float16", amplitude=0.5)
    v = compare(c, ref, ref, off_by(ref, 2**-8))
    assert v.budget == 2 * 2**-8 + 2 * F16_ROUNDING_AT_HALF == 0.00830078125


def test_an_error_just_over_the_budget_fails_and_at_it_passes():
    c, ref = synthetic()
    native = off_by(ref, 2**-6)  # budget 0.0390625
    assert compare(c, off_by(ref, 0.0390625, at=5), ref, native).passed
    over = compare(c, off_by(ref, 0.0390625 + 2**-20, at=5), ref, native)
    assert not over.passed and over.worst == (0, 0, 0) and over.frac_over == 1 / 8


def test_the_budget_is_capped_at_a_quarter_of_the_output_range():
    """Range 2 (values +-1): a native error of 0.5 would give 1.0078125, which passes an output off by
    0.75; capped at 0.5 it fails, and the verdict says the budget was capped and what the rule gave."""
    c, ref = synthetic()
    native = off_by(ref, 0.5)
    v = compare(c, off_by(ref, 0.75, at=6), ref, native)
    assert v.budget == 0.5 and not v.passed
    assert "budget capped at 0.25 x the reference's range (the rule gave 1.01)" in v.reason
    assert compare(c, off_by(ref, 0.25, at=6), ref, native).passed


def test_a_non_finite_native_reference_gives_the_cap_not_a_nan_budget():
    c, ref = synthetic()
    native = torch.full_like(ref, float("nan"))
    v = compare(c, ref, ref, native)
    assert v.passed and v.budget == 0.5 and "the rule gave nan" in v.reason
    assert not compare(c, off_by(ref, 0.75), ref, native).passed


def test_lse_budget_is_twice_the_native_lse_error_plus_noise_and_the_floor():
    """LSE 1 everywhere; float32: 1 + 0.3f = 1.300000011920929 is a tie between 1.2999999523 and
    1.3000000715, rounded to even (the former); - 0.3f = 0.99999994 (exact), - 1 = -2^-24."""
    c, ref = synthetic()
    lse = torch.ones(1, 1, dtype=torch.float64)
    native = lse + 2**-10
    v = compare(c, ref, ref, ref, lse.float(), lse, native)
    assert v.lse_budget == 2 * 2**-10 + 2 * F32_ROUNDING_AT_1 + LSE_FLOOR and v.lse_err == 0.0
    assert compare(c, ref, ref, ref, (lse + 2**-9).float(), lse, native).passed
    late = compare(c, ref, ref, ref, (lse + 2**-9 + 2e-5).float(), lse, native)
    assert not late.passed and "LSE err" in late.reason


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_lse_budget_fails_rather_than_passing_everything(bad):
    c, ref = synthetic()
    lse = torch.zeros(1, 1, dtype=torch.float64)
    v = compare(c, ref, ref, ref, lse.float(), lse, torch.full_like(lse, bad))
    assert not v.passed and f"LSE budget {bad} (the same-precision LSE is not finite" in v.reason


def test_worst_location_and_fraction_over_budget():
    c = case("EXTEND", ((4, 5), (0, 3)), num_q_heads=4, num_kv_heads=2, head_dim=16)
    ex, na = refs(c)
    out = ex.out.clone()
    out[5 + 2, 3, 7] += 1.0  # request 1, token 2, head 3
    v = compare(c, out, ex.out, na.out)
    assert not v.passed
    assert v.worst == (1, 2, 3)
    assert v.frac_over == pytest.approx(1 / out.numel())
    assert "request 1, token 2 (position 2), head 3" in v.reason


def test_shape_mismatch_fails():
    c = case("EXTEND", ((4, 5),))
    ex, na = refs(c)
    v = compare(c, ex.out[:-1], ex.out, na.out)
    assert not v.passed and "shape" in v.reason


def test_base2_lse_fails_where_natural_log_passes():
    c = case("EXTEND", ((4, 5),))
    ex, na = refs(c)
    good = compare(c, ex.out, ex.out, na.out, ex.lse.float(), ex.lse, na.lse)
    assert good.passed and good.lse_err is not None
    base2 = ex.lse / torch.log(torch.tensor(2.0, dtype=torch.float64))
    bad = compare(c, ex.out, ex.out, na.out, base2.float(), ex.lse, na.lse)
    assert not bad.passed and "LSE err" in bad.reason


def test_locate():
    assert locate(0, [0, 3, 5], 2, 4) == (0, 0, 0)
    assert locate(3 * 8 + 5, [0, 3, 5], 2, 4) == (1, 0, 1)


def test_an_lse_error_is_caught_when_another_row_has_no_visible_key():
    """A row with no visible key has LSE -inf; its noise must not turn the LSE budget into NaN
    (every comparison with NaN is false, so no LSE error could fail the check)."""
    c = case("EXTEND", ((4, 5),))
    ex, na = refs(c)
    lse_exact, lse_native = ex.lse.clone(), na.lse.clone()
    lse_exact[0, 0] = lse_native[0, 0] = -torch.inf
    good = ex.lse.float().clone()
    good[0, 0] = -torch.inf
    assert compare(c, ex.out, ex.out, na.out, good, lse_exact, lse_native).passed
    shifted = good.clone()
    shifted[2, 1] += 0.5
    v = compare(c, ex.out, ex.out, na.out, shifted, lse_exact, lse_native)
    assert not v.passed and v.lse_budget == v.lse_budget and "LSE err" in v.reason


def test_a_multiple_of_the_worst_error_is_found_at_its_first_place():
    """Ties: the reported worst element is the first of the equal maxima (as argmax), so a report
    points at the same place on every device."""
    c = case("EXTEND", ((4, 5),), num_q_heads=2, num_kv_heads=1, head_dim=8)
    ex, na = refs(c)
    out = ex.out.clone()
    out[3, 1, 2] += 1.0
    out[4, 0, 0] += 1.0
    v = compare(c, out, ex.out, na.out)
    assert not v.passed and v.worst == (0, 3, 1)


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_any_non_finite_output_fails_counted_with_its_place(bad):
    """Non-finite outputs are found through the error itself (the reference is finite): +Inf, -Inf
    and NaN alike, counted and located. Their cause is the numeric check's to find (test_verdicts)."""
    c = case("EXTEND", ((4, 5), (2, 3)))
    ex, na = refs(c)
    out = ex.out.clone()
    out[6, 2, 7] = bad
    out[7, 0, 0] = bad
    v = compare(c, out, ex.out, na.out)
    assert not v.passed and v.nonfinite == 2 and v.worst == (1, 1, 2)
    assert v.reason == "output has 2 NaN/Inf values, first at request 1, token 1 (position 3), head 2"


def test_a_non_finite_reference_fails_and_blames_the_reference():
    c = case("EXTEND", ((4, 5),))
    ex, na = refs(c)
    ref = ex.out.clone()
    ref[1, 0, 0] = float("nan")
    v = compare(c, ex.out, ref, na.out)
    assert not v.passed and v.nonfinite == 0 and "reference is not finite" in v.reason


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_lse_where_keys_are_visible_fails(bad):
    c = case("EXTEND", ((4, 5),))
    ex, na = refs(c)
    lse = ex.lse.float().clone()
    lse[3, 1] = bad
    v = compare(c, ex.out, ex.out, na.out, lse, ex.lse, na.lse)
    assert not v.passed and "LSE has NaN/Inf where keys are visible" in v.reason


def test_a_fallback_dequantizing_into_the_case_dtype_passes_where_a_native_over_those_values_fails():
    """Why the FP8 budget adds rounded_kv instead of rounding the native reference's K/V: with peaked
    logits a native over the rounded K/V can land close to exact (its score rounding undoing the
    operand rounding) while the fallback, rounding only the operands, does not. Measured on the CPU
    (python -m harness.tools.fp8_noise): this case's torch_native error is 3.2x that budget, 0.17x the
    harness's."""
    from harness.backends import load
    from harness.checks.numeric import check_case
    from harness.core.batch import Inputs, build_batch
    from references.torch_ref import references

    c = case(
        "DECODE",
        ((75, 1),),
        num_q_heads=4,
        num_kv_heads=4,
        head_dim=32,
        sm_scale=0.3,
        q_amplitude=30.0,
        page_size=1,
        kv_dtype="float8_e4m3fn",
        k_scale=0.0173,
        v_scale=0.0173,
        seed=14,
    )
    backend = load("torch_native")
    assert check_case(backend, c).status == "pass"
    inputs = make_inputs(c)
    (ex,) = references(c, inputs, ("exact",))
    rounded = Inputs(
        q_all=inputs.q_all,
        kv_all=inputs.kv_all.to(torch.bfloat16),
        q_lens=inputs.q_lens,
        kv_lens=inputs.kv_lens,
        sinks=None,
    )
    (native_rounded,) = references(c.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0), rounded, ("native",))
    out = backend.run(build_batch(c, inputs)).out
    assert not compare(c, out, ex.out, native_rounded.out).passed
