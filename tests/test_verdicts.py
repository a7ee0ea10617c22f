"""Honest verdicts at the edge of the dtype's range: a float16 case whose logits pass
float16's range is judged with a budget inside the output's range, both ways (the correct backends
pass, the window mutants fail); logits past float32 are refused with a message; NaN in an output is
blamed on unowned memory only when a re-run with finite unowned memory shows it."""

import math

import pytest

from harness.backends import load
from harness.backends.torch_native import TorchNative
from harness.checks.numeric import check_case
from harness.core.batch import make_inputs
from harness.core.case import Case, CaseError
from harness.mutants import by_name
from references.torch_ref import reference

# Logits reach about 2.4e6 (sm_scale 100) or 2.4e5 (sm_scale 10): past float16's 65504.
PINNED = {
    "mode": "EXTEND",
    "requests": [{"prefix_len": 40, "extend_len": 8}],
    "window_left": 4,
    "dtype": "float16",
    "q_amplitude": 1000,
    "sm_scale": 100,
}


def pinned(**changes) -> Case:
    return Case.from_dict({**PINNED, **changes})


def output_range(c: Case) -> float:
    out = reference(c, make_inputs(c)).out
    return float(out.max() - out.min())


@pytest.mark.parametrize("sm_scale", [100, 10])
@pytest.mark.parametrize("backend", ["torch_native", "torch_split"])
def test_the_correct_backends_pass_the_overflowing_case_with_a_budget_inside_the_output_range(
    backend, sm_scale
):
    """Before: sm_scale 100 gave a budget of 6.9 (range 6.47) and sm_scale 10 a NaN budget (a FAIL)."""
    c = pinned(sm_scale=sm_scale)
    res = check_case(load(backend), c)
    assert res.status == "pass", res.reason
    assert math.isfinite(res.verdict.budget) and res.verdict.budget < output_range(c) / 4


@pytest.mark.parametrize("sm_scale", [100, 10])
@pytest.mark.parametrize("mutant", ["torch_native~window_ignored", "torch_split~ragged_no_window"])
def test_the_window_mutants_fail_the_overflowing_case(mutant, sm_scale):
    """Before: both passed the sm_scale 100 case (errors 5.0 and 4.1 under a budget of 6.9), and
    failed the sm_scale 10 one only against a NaN budget, as the correct backends did."""
    c = pinned(sm_scale=sm_scale)
    res = check_case(by_name(mutant).make(), c)
    assert res.status == "fail" and "> budget" in res.reason, res.reason
    assert math.isfinite(res.verdict.budget) and res.verdict.budget < output_range(c) / 4


def test_logits_past_float32_are_refused_with_a_message():
    """Before: the case ran and its NaN output was blamed on poisoned pool memory."""
    with pytest.raises(CaseError) as e:
        pinned(sm_scale=1e300)
    assert str(e.value) == (
        "sm_scale=1e+300 with q_amplitude=1000 and head_dim=64: logits can reach 6.4e+306, past 1.7e+38 "
        "(half of float32's range, in which kernels and references compute logits)"
    )


def test_the_largest_sm_scale_within_the_bound_is_accepted():
    pinned(sm_scale=1.7e38 / (1000 * 64 * 100))  # reach 1.7e38: exactly at the limit


class _ScaledQueryInDtype(TorchNative):
    """Scales the queries in the case dtype before SDPA: float16 overflows to inf, whatever the pool."""

    def softmax_scale(self, batch):
        return 1.0

    def attend(self, q, k, v, mask, batch):
        return super().attend((q * batch.case.scale).to(q.dtype), k, v, mask, batch)


def test_nan_from_an_overflow_is_not_blamed_on_unowned_memory():
    res = check_case(_ScaledQueryInDtype(), pinned())
    assert res.status == "fail"
    assert "poisoned" not in res.reason
    assert "not unowned memory: NaN/Inf remain when unowned pool slots hold 0" in res.reason
    assert "past float16's largest value 65504 (an overflow where the backend holds logits in float16)" in (
        res.reason
    )


@pytest.mark.parametrize("kv_dtype", [None, "float8_e4m3fn"])
def test_nan_from_unowned_memory_is_blamed_on_it_after_a_rerun_shows_it(kv_dtype):
    """stale_page never writes the new tokens' K/V, so it reads their poisoned slots (an FP8 pool's
    NaN code too: the re-run zeroes it through the pool's bytes)."""
    c = pinned(sm_scale=None, q_amplitude=1, dtype="bfloat16", kv_dtype=kv_dtype)
    res = check_case(by_name("torch_native~stale_page").make(), c)
    assert res.status == "fail"
    assert res.reason.endswith(
        ": poisoned (unowned) pool memory was read: the output is finite when unowned slots hold 0"
    )
