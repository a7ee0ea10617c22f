"""Honest verdicts at extreme logits. At the edge of the dtype's range: a float16 case whose logits
pass float16's range is judged with a budget inside the output's range, both ways (the correct backends
pass, the window mutants fail); logits past float32 are refused with a message; NaN in an output is
blamed on unowned memory only when a re-run with finite unowned memory shows it. Logit patterns
(harness/core/logits.py): each draws the extreme it names, a Case carries it through JSON and refuses
what the tolerance cannot judge in one line, and the references agree on it. The error map of a
failing case: per (token bin, head) the max error over head_dim, NaN/Inf as null."""

import math

import pytest
import torch

from harness.backends import load
from harness.backends.torch_native import TorchNative
from harness.checks import crossref
from harness.checks.numeric import MAX_BINS, check_case, error_map
from harness.core import logits
from harness.core.batch import make_inputs
from harness.core.case import Case, CaseError, Request
from harness.mutants import by_name
from references.masks import case_masks
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


EXTEND = {"mode": "EXTEND", "requests": [{"prefix_len": 9, "extend_len": 6}]}


def case(pattern: str, offset: float, **fields) -> Case:
    return Case(
        mode="EXTEND", requests=(Request(9, 6), Request(0, 4)), logits=pattern, logit_offset=offset, **fields
    )


def rows(c: Case) -> list[torch.Tensor]:
    """Every visible logit row of the case (float64, from its drawn inputs): [heads, keys] per query."""
    inputs = make_inputs(c)
    group = c.num_q_heads // c.num_kv_heads
    out = []
    for r, mask in enumerate(case_masks(c)):
        k = inputs.k[r].double().repeat_interleave(group, dim=1)  # [T, Hq, D]
        s = torch.einsum("ehd,thd->eht", inputs.q[r].double(), k) * c.scale
        visible = mask.dense()
        out += [s[j][:, visible[j]] for j in range(s.shape[0]) if visible[j].any()]
    return out


@pytest.mark.parametrize("offset", [-120.0, 120.0])
def test_offset_moves_every_logit_of_every_row(offset):
    c = case("offset", offset)
    spread = 10 * logits.spread(c.scale, c.q_amplitude, c.head_dim)
    for s in rows(c):
        assert ((s - offset).abs() < spread).all(), s


@pytest.mark.parametrize("offset", [0.0, -3e4])
def test_dominant_key_carries_its_rows(offset):
    c = case("dominant", offset)
    gap = logits.gap(offset, c.scale, c.q_amplitude, c.head_dim)
    carried = 0
    for s in rows(c):
        top = s.sort(-1, descending=True).values
        carried += int((top[:, 0] > offset + gap / 2).sum())
        if top.shape[-1] > 1:  # the dominant key is one key: the second is ordinary
            assert (top[:, 1] < offset + gap / 2).all()
    assert carried > 0


def test_tied_keys_share_the_top_logit_exactly():
    c = case("ties", 120.0, num_q_heads=4, num_kv_heads=4)
    tied = 0
    for s in rows(c):
        top = s.sort(-1, descending=True).values
        if top.shape[-1] > logits.TIED_KEYS:  # the four tied at the top, the next key far below them
            at_top = (top[:, : logits.TIED_KEYS] == top[:, :1]).all(-1)
            tied += int((at_top & (top[:, logits.TIED_KEYS] < top[:, 0] - 20)).sum())
    assert tied > 0


def test_plain_logits_leave_the_json_as_it_was():
    plain = Case.from_dict(EXTEND)
    assert "logits" not in plain.to_dict() and "logit_offset" not in plain.to_dict()
    deep = Case.from_dict({**EXTEND, "logits": "dominant", "logit_offset": -3e4})
    assert Case.from_json(deep.to_json()) == deep
    assert deep.to_dict()["logits"] == "dominant" and deep.to_dict()["logit_offset"] == -3e4


def test_a_plain_case_draws_what_it_drew_before():
    """The pattern's draws come after every other draw: a plain case's inputs are unchanged."""
    c = case("plain", 0.0)
    lifted = make_inputs(c.replace(logits="offset", logit_offset=120.0))
    plain = make_inputs(c)
    assert torch.equal(plain.q_all[..., 1:], lifted.q_all[..., 1:])
    assert torch.equal(plain.kv_all[:, :, :, 1:], lifted.kv_all[:, :, :, 1:])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"logits": "spiky"}, "logits='spiky' is not one of plain, offset, dominant, ties"),
        ({"logit_offset": 5.0}, "logit_offset=5.0 needs a logits pattern (logits is plain)"),
        ({"logits": "offset"}, "logits='offset' needs a nonzero logit_offset"),
        ({"logits": "ties", "logit_offset": "1"}, "logit_offset='1' must be a number"),
        ({"logits": "ties", "logit_offset": float("nan")}, "logit_offset=nan must be in [-100000, 100000]"),
        ({"logits": "offset", "logit_offset": 200.0}, "within +-128 in bfloat16"),
        ({"logits": "dominant", "logit_offset": -200.0, "sinks": True}, "with sinks=true"),
        ({"logits": "ties", "kv_dtype": "float8_e4m3fn"}, "needs kv_dtype null"),
        (
            {"logits": "dominant", "dtype": "float16", "sm_scale": 1e-9},
            "past a quarter of float16's range",
        ),
    ],
)
def test_a_pattern_the_tolerance_cannot_judge_is_refused_in_one_line(fields, message):
    with pytest.raises(CaseError, match=None) as e:
        Case.from_dict({**EXTEND, **fields})
    assert message in str(e.value) and "\n" not in str(e.value)


PATTERNS = [
    case("offset", -120.0),
    case("offset", 1000.0, dtype="float16", soft_cap=30.0),
    case("dominant", -3e4, window_left=3),
    case("ties", 120.0, sm_scale=2.0, q_amplitude=8.0),
    case("ties", -3e4, num_q_heads=4, num_kv_heads=1, dtype="float16"),
]


@pytest.mark.parametrize("c", PATTERNS, ids=lambda c: f"{c.logits}{c.logit_offset:+g}")
def test_the_references_agree_on_every_pattern(c):
    if not crossref.hf_available():
        pytest.skip("transformers is not installed (the hf extra)")
    inputs = make_inputs(c)
    from references.torch_ref import reference

    assert crossref.disagreement(c, inputs, reference(c, inputs, "exact").out) is None


@pytest.mark.parametrize("backend", ["torch_native", "torch_split", "flex_eager"])
@pytest.mark.parametrize("c", PATTERNS, ids=lambda c: f"{c.logits}{c.logit_offset:+g}")
def test_the_cpu_backends_pass_every_pattern(backend, c):
    res = check_case(load(backend), c)
    assert res.status == "pass", res.reason


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
