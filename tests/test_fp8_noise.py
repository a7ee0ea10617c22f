"""The FP8 noise tool (harness/tools/fp8_noise.py): its `rule` column is the harness's own verdict."""

import pytest

from harness.backends import load
from harness.checks.numeric import check_case
from harness.tools import fp8_noise
from tests.helpers import case


def test_the_rule_column_is_the_checks_err_over_budget_and_the_cases_carry_an_fp8_cache():
    c = case("EXTEND", ((30, 9),), window_left=6, kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)
    row = fp8_noise.measure(c, ("torch_native",))
    got = row["backends"]["torch_native"]
    verdict = check_case(load("torch_native"), c).verdict
    assert got["err"] == verdict.err and got["rule"] == pytest.approx(verdict.ratio)
    assert row["rounded_kv"] > 0 and row["quantization"] > 10 * row["native"]
    drawn = fp8_noise.fp8_cases(4, "ci")
    assert drawn and all(d.kv_dtype is not None for d in drawn)
