"""The Hugging Face reference: the window mapping, agreement with torch_ref, and that both can fail."""

import ast
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401 - the `hf` extra is part of every dev install; fail loudly without it
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import masking_utils as hf_masks
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gpt_oss import modeling_gpt_oss

from harness.backends import load
from harness.checks import crossref
from harness.checks.numeric import check_case
from harness.core.batch import make_inputs
from harness.core.vocab import KV_DTYPES
from harness.search.profiles import SIZES
from harness.search.strategies import ALL_CAPS, KV_SCALES, cases
from references import hf_ref
from references.masks import hf_bidirectional_window, hf_window_left, request_mask
from references.torch_ref import reference
from tests.helpers import case

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("sliding_window", [1, 2, 3, 7, 16])
def test_hf_sliding_window_s_admits_s_keys_which_is_window_left_s_minus_1(sliding_window):
    """transformers' own sliding-window mask function, over 40 positions: S keys, itself included."""
    s = sliding_window
    pos = torch.arange(40)
    fn = hf_masks.sliding_window_causal_mask_function(s)
    hf = fn(torch.tensor(0), torch.tensor(0), pos[:, None], pos[None, :])
    assert hf.sum(-1).tolist() == [min(s, p + 1) for p in range(40)]
    w = hf_window_left(s)
    assert w == s - 1 and hf_ref.hf_sliding_window(w) == s
    assert torch.equal(hf, request_mask("EXTEND", 0, 40, w).dense())
    assert not torch.equal(hf, request_mask("EXTEND", 0, 40, s).dense())  # W = S would admit S + 1


@pytest.mark.parametrize("sliding_window", [0, 1, 2, 5])
def test_hf_bidirectional_sliding_window_s_is_a_window_of_s_on_both_sides(sliding_window):
    """transformers' bidirectional sliding window (encoders: ModernBERT, bidirectional Gemma) admits
    |p - k| <= S: window_left = window_right = S, not the causal S - 1. Pinned against its mask
    function and against the mask a model builds from its config."""
    s = sliding_window
    pos = torch.arange(30)
    fn = hf_masks.sliding_window_bidirectional_mask_function(s)
    hf = fn(torch.tensor(0), torch.tensor(0), pos[:, None], pos[None, :])
    assert hf.sum(-1).tolist() == [min(p + s, 29) - max(p - s, 0) + 1 for p in range(30)]
    left, right = hf_bidirectional_window(s)
    assert (left, right) == (s, s) and hf_ref.hf_bidirectional_sliding_window(left, right) == s
    ours = request_mask("ENCODER_ONLY", 0, 30, left, window_right=right).dense()
    assert torch.equal(hf, ours)
    assert not torch.equal(hf, request_mask("ENCODER_ONLY", 0, 30, s + 1, window_right=s + 1).dense())
    config = transformers.PretrainedConfig(sliding_window=s)
    config._attn_implementation = "sdpa"
    built = hf_masks.create_bidirectional_sliding_window_mask(
        config=config, inputs_embeds=torch.zeros(1, 30, 8), attention_mask=None
    )
    assert torch.equal(built[0, 0], ours)


def test_hf_bidirectional_mask_is_every_key():
    config = transformers.PretrainedConfig()
    config._attn_implementation = "sdpa"
    embeds = torch.zeros(1, 9, 8)
    built = hf_masks.create_bidirectional_mask(
        config=config, inputs_embeds=embeds, attention_mask=None, allow_is_bidirectional_skip=False
    )
    assert torch.equal(built[0, 0], request_mask("ENCODER_ONLY", 0, 9, -1).dense())


@pytest.mark.parametrize("left,right", [(3, -1), (1, 4), (4, 1), (0, 0), (2, 2)])
def test_hf_encoder_mask_function_matches_the_rule(left, right):
    """Left-only and asymmetric windows (no HF function of their own) from HF's overlays."""
    c = case("ENCODER_ONLY", ((0, 25),), window_left=left, window_right=right)
    fn, e, t = hf_ref.request_mask_function(c, 0)
    assert (e, t) == (25, 25)
    ours = request_mask("ENCODER_ONLY", 0, 25, left, window_right=right).dense()
    assert torch.equal(hf_ref.evaluate(fn, torch.arange(25), 25), ours)


def test_no_window_is_none_both_ways():
    assert hf_window_left(None) == -1 and hf_ref.hf_sliding_window(-1) is None


def test_hf_ref_imports_neither_the_other_reference_nor_the_backends():
    tree = ast.parse((ROOT / "references" / "hf_ref.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and (m.startswith("harness") or m.startswith("references"))}


TINY = SIZES["ci"].__class__(
    **{**SIZES["ci"].__dict__, "max_prefix": 40, "max_extend": 12, "max_encoder": 12, "max_batch": 3}
)


def assert_references_agree(c):
    """The suite's cross-check finds no disagreement, and hf_ref is within float64 noise of torch_ref."""
    inputs = make_inputs(c)
    exact = reference(c, inputs).out
    assert crossref.disagreement(c, inputs, exact) is None
    assert float((hf_ref.reference(c, inputs) - exact).abs().max()) < 1e-12


@pytest.mark.parametrize("family", ["decode", "prefill", "prefix", "draft_extend_v2", "verify", "cross"])
def test_hf_ref_agrees_with_torch_ref_to_float64_noise(family):
    @settings(max_examples=10, derandomize=True, database=None, deadline=None)
    @given(cases(family, family != "cross", ALL_CAPS, TINY))
    def check(c):
        assert_references_agree(c)

    check()


@pytest.mark.parametrize("windowed", [False, True])
def test_hf_ref_agrees_with_torch_ref_on_encoder_cases(windowed):
    """Encoder cases with no window, a left window, a symmetric (HF's own function) and an
    asymmetric two-sided one, over requests of mixed lengths."""

    @settings(max_examples=10, derandomize=True, database=None, deadline=None)
    @given(cases("encoder", windowed, ALL_CAPS, TINY))
    def check(c):
        assert_references_agree(c)

    check()


@pytest.mark.parametrize("family", ["decode", "prefix", "verify", "cross"])
def test_with_an_fp8_cache_both_references_agree_over_the_dequantized_values(family):
    """Every case drawn with an FP8 cache: hf_ref reads the same logical (dequantized) K/V."""
    fp8 = st.tuples(st.sampled_from(KV_DTYPES), st.sampled_from(KV_SCALES), st.sampled_from(KV_SCALES))

    @settings(max_examples=6, derandomize=True, database=None, deadline=None)
    @given(cases(family, family != "cross", ALL_CAPS, TINY), fp8)
    def check(c, cache):
        # a logit pattern needs the key component an FP8 cache cannot hold: those cases stay plain
        c = c.replace(kv_dtype=cache[0], k_scale=cache[1], v_scale=cache[2], logits="plain", logit_offset=0.0)
        assert_references_agree(c)

    check()


def test_the_causal_convention_on_a_bidirectional_window_fails_the_suite_check(monkeypatch):
    """HF's causal S = W + 1 applied to its bidirectional window (|p - k| <= W + 1): caught."""
    def causal_convention(left, right):
        return left + 1 if left == right >= 0 else None

    monkeypatch.setattr(hf_ref, "hf_bidirectional_sliding_window", causal_convention)
    c = case("ENCODER_ONLY", ((0, 24),), window_left=4, window_right=4, dtype="float32")
    res = check_case(load("torch_native"), c, "cpu")
    assert res.status == "fail" and res.reason.startswith("references disagree")


def test_float32_arithmetic_is_not_float64_noise():
    """The bound tells a float32 evaluation from a float64 one, so it cannot hide a real error."""
    c = case("EXTEND", ((30, 20),), window_left=9, soft_cap=5.0, sinks=True, dtype="float32")
    inputs = make_inputs(c)
    exact = reference(c, inputs).out
    f32 = hf_ref.reference(c, inputs, torch.float32).double()
    assert float((f32 - exact).abs().max()) > 10 * crossref.float64_noise(c, inputs)


def test_a_window_off_by_one_in_hf_ref_fails_the_suite_check_and_names_the_case(monkeypatch):
    monkeypatch.setattr(hf_ref, "hf_sliding_window", lambda w: None if w < 0 else w)  # W keys, not W + 1
    c = case("EXTEND", ((20, 12),), window_left=5, dtype="float32")
    res = check_case(load("torch_native"), c, "cpu")
    assert res.status == "fail"
    assert res.reason.startswith("references disagree") and "request 0, token" in res.reason
    assert '"window_left": 5' in res.failure_text()


def test_uncapped_attention_is_gpt_oss_eager_itself(monkeypatch):
    calls = []
    real = modeling_gpt_oss.eager_attention_forward
    monkeypatch.setattr(
        modeling_gpt_oss, "eager_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    c = case("EXTEND", ((4, 5),), sinks=True)
    hf_ref.reference(c, make_inputs(c))
    assert calls


def _gemma2_module(hq, hkv):
    return type("M", (), {"num_key_value_groups": hq // hkv, "training": False, "head_dim": 64})()


def test_the_capped_path_is_gemma2s_soft_cap_with_gpt_oss_softmax():
    """Without sinks it matches Gemma2's eager function (whose softmax is float32, hence 1e-6)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 9, 64, generator=gen) * 3 for h in (4, 2, 2))
    visible = torch.ones(9, 9, dtype=torch.bool).tril()
    bias = hf_ref.eager_bias(visible, torch.float32)
    module = _gemma2_module(4, 2)
    ours_mod = type("S", (), {"num_key_value_groups": 2, "sinks": torch.full((4,), -torch.inf)})()
    ours = hf_ref._capped_eager(ours_mod, q, k, v, bias, 0.125, 2.0)
    gemma, _ = modeling_gemma2.eager_attention_forward(module, q, k, v, bias, scaling=0.125, softcap=2.0)
    assert torch.allclose(ours, gemma, atol=1e-5, rtol=0)
    uncapped, _ = modeling_gemma2.eager_attention_forward(module, q, k, v, bias, scaling=0.125)
    assert float((ours - uncapped).abs().max()) > 0.1


def test_a_row_with_no_visible_key_is_zero():
    c = case("EXTEND", ((0, 3),))
    inputs = make_inputs(c)
    none = torch.zeros(3, 3, dtype=torch.bool)
    out = hf_ref._attend(c, inputs.q[0], inputs.k[0], inputs.v[0], none, None, torch.float64)
    assert out.abs().max() == 0
