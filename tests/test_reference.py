"""The reference against a naive float64 loop, its chunking, and its memory bound."""

import dataclasses
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings

from harness.backends import load
from harness.core.batch import Inputs, make_inputs
from harness.core.modes import FAMILIES
from harness.search.profiles import SIZES
from harness.search.strategies import cases
from harness.tools.bench.cases import mix
from references import torch_ref
from references.masks import RequestMask, case_masks
from references.torch_ref import reference
from tests.helpers import batch_of, case


def naive(c, inputs):
    """One query, one head, one key at a time, straight from docs/design.md's conventions."""
    outs, lses = [], []
    g = c.num_q_heads // c.num_kv_heads
    for r, req in enumerate(c.requests):
        q, k, v = (t.double() for t in (inputs.q[r], inputs.k[r], inputs.v[r]))
        p = req.prefix_len
        if c.mode == "TARGET_VERIFY":
            depth = []
            for par in req.tree:
                depth.append(0 if par < 0 else depth[par] + 1)
            qpos = [p + d for d in depth]
            kpos = list(range(p)) + qpos
        elif c.mode == "CROSS":
            qpos, kpos = list(range(p, p + req.extend_len)), list(range(req.encoder_len))
        elif c.mode == "ENCODER_ONLY":  # its own tokens, both ways
            qpos = kpos = list(range(req.extend_len))
        else:
            qpos, kpos = list(range(p, p + req.extend_len)), list(range(p + req.extend_len))
        o = torch.zeros(req.extend_len, c.num_q_heads, c.head_dim, dtype=torch.float64)
        lse = torch.full((req.extend_len, c.num_q_heads), -math.inf, dtype=torch.float64)
        for j in range(req.extend_len):
            for h in range(c.num_q_heads):
                scores, vals = [], []
                for i in range(len(kpos)):
                    if c.mode != "CROSS":
                        if kpos[i] > qpos[j] and c.mode != "ENCODER_ONLY":
                            continue
                        if c.window_left >= 0 and kpos[i] < qpos[j] - c.window_left:
                            continue
                        if c.window_right >= 0 and kpos[i] > qpos[j] + c.window_right:
                            continue
                        if c.mode == "TARGET_VERIFY" and i >= p:
                            a, d = j, i - p
                            while a != d and a >= 0:
                                a = req.tree[a]
                            if a != d:
                                continue
                    s = float(q[j, h] @ k[i, h // g]) * c.scale
                    if c.soft_cap > 0:
                        s = c.soft_cap * math.tanh(s / c.soft_cap)
                    scores.append(s)
                    vals.append(v[i, h // g])
                if not scores:
                    continue
                top = max(scores)
                if inputs.sinks is not None:
                    top = max(top, float(inputs.sinks[h]))
                w = [math.exp(s - top) for s in scores]
                denom = sum(w) + (math.exp(float(inputs.sinks[h]) - top) if inputs.sinks is not None else 0)
                o[j, h] = sum(wi * vi for wi, vi in zip(w, vals)) / denom
                lse[j, h] = top + math.log(sum(w))
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


CAPS = load("torch_native").capabilities


def fixed(examples: int) -> settings:
    """Same draws every run."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None)


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_matches_the_naive_loop(family):
    small = dict(max_prefix=24, max_extend=8, max_encoder=10, max_batch=2, max_window=6)
    tiny = dataclasses.replace(SIZES["ci"], **small)

    @fixed(8)
    @given(cases(family, family != "cross", CAPS, tiny))
    def check(drawn):
        variants = [drawn]
        if family == "encoder":  # with and without a window
            off = dict(window_left=-1, window_right=-1, hybrid_swa_pool=False, swa_pool_exact=False)
            variants.append(drawn.replace(**off))
        for c in variants:
            inputs = make_inputs(c)
            out, lse = naive(c, inputs)
            for padded in (False, True):  # the per-request loop, and the padded batch a GPU uses
                ref = reference(c, inputs, padded=padded)
                assert torch.allclose(ref.out, out, atol=1e-10, rtol=0)
                assert torch.allclose(ref.lse, lse, atol=1e-10, rtol=0)

    check()


def test_the_bench_mix_matches_the_naive_loop():
    """The cases the bench times (every mode, windows, verify trees, 8 q / 2 kv heads x 128, bfloat16),
    shortened, with windows narrowed to bind: the padded batch a GPU runs and the CPU's per-request
    loop give the naive loop's output and LSE, and agree with each other in native precision."""
    for drawn in mix(0, 12, CAPS, max_tokens=40):
        c = drawn.replace(window_left=drawn.window_left % 8) if drawn.window_left >= 0 else drawn
        inputs = make_inputs(c)
        out, lse = naive(c, inputs)
        loop = torch_ref.references(c, inputs, ("exact", "native"), padded=False)
        pad = torch_ref.references(c, inputs, ("exact", "native"), padded=True)
        for exact in (loop[0], pad[0]):
            assert torch.allclose(exact.out, out, atol=1e-10, rtol=0), c
            assert torch.allclose(exact.lse, lse, atol=1e-10, rtol=0), c
        eps = torch.finfo(torch.bfloat16).eps  # native: one rounding flip at most (the test below)
        assert (loop[1].out - pad[1].out).abs().max() <= eps * max(1.0, float(loop[1].out.abs().max())), c


@pytest.mark.parametrize("family", FAMILIES)
def test_the_padded_batch_agrees_with_the_loop_in_both_precisions(family):
    """Same arithmetic, other summation order: exact agrees to float64 rounding; native may flip a
    rounding to the case dtype (a score, a probability or an output element), which moves the
    output by a fraction of the dtype's eps at its scale (at most 0.28 eps over 300 ci and dev cases)."""

    @fixed(10)
    @given(cases(family, family != "cross", CAPS, SIZES["ci"]))
    def check(c):
        inputs = make_inputs(c)
        for precision in ("exact", "native"):
            loop = reference(c, inputs, precision, padded=False)
            pad = reference(c, inputs, precision, padded=True)
            assert torch.equal(torch.isfinite(loop.lse), torch.isfinite(pad.lse))
            fin = torch.isfinite(loop.lse)
            if precision == "exact":
                assert torch.allclose(loop.out, pad.out, atol=1e-12, rtol=0)
                assert torch.allclose(loop.lse[fin], pad.lse[fin], atol=1e-12, rtol=0)
            else:
                eps = torch.finfo(getattr(torch, c.dtype)).eps
                assert (loop.out - pad.out).abs().max() <= eps * max(1.0, float(loop.out.abs().max()))
                assert ((loop.lse - pad.lse)[fin].abs() <= eps * (loop.lse[fin].abs() + 1)).all()

    check()


@pytest.mark.parametrize("padded", [False, True])
def test_both_precisions_in_one_call_equal_two_calls(padded):
    """A check asks for exact and native in one call, which shares the padded mask and inputs: the
    sharing must not change either result (bit for bit)."""

    @fixed(6)
    @given(cases("verify" if padded else "prefix", True, CAPS, SIZES["ci"]))
    def check(c):
        inputs = make_inputs(c)
        both = torch_ref.references(c, inputs, ("exact", "native"), padded=padded)
        for got, precision in zip(both, ("exact", "native"), strict=True):
            alone = reference(c, inputs, precision, padded=padded)
            assert torch.equal(got.out, alone.out) and torch.equal(got.lse, alone.lse)

    check()


def test_precisions_sharing_one_accumulation_dtype_share_inputs_without_changing_results():
    """On a GPU exact and native both accumulate in float32 and share the converted inputs; neither
    may write into them (native scales its own copy of q): together == apart, bit for bit."""
    @fixed(6)
    @given(cases("prefix", True, CAPS, SIZES["ci"]))
    def check(c):
        inputs = make_inputs(c)
        kinds = [(torch.float32, None, None), (torch.float32, getattr(torch, c.dtype), None)]
        args = (case_masks(c), inputs, c.scale, float(c.soft_cap))
        together = torch_ref._padded(*args, kinds, torch.device("cpu"))
        for (o, lse), kind in zip(together, kinds, strict=True):
            ((o1, lse1),) = torch_ref._padded(*args, [kind], torch.device("cpu"))
            assert torch.equal(o, o1) and torch.equal(lse, lse1)

    check()


def test_padded_elements_counts_the_padded_score_tensor():
    c = case("EXTEND", ((10, 3), (0, 7)), num_q_heads=4, num_kv_heads=2)
    assert torch_ref.padded_elements(case_masks(c), 4) == 2 * 4 * 7 * 13


def test_soft_cap_and_sinks_match_the_naive_loop():
    c = case("EXTEND", ((5, 6), (0, 3)), window_left=3, soft_cap=4.0, sinks=True, q_amplitude=8.0)
    inputs = make_inputs(c)
    ref = reference(c, inputs)
    out, lse = naive(c, inputs)
    assert torch.allclose(ref.out, out, atol=1e-10, rtol=0)
    assert torch.allclose(ref.lse, lse, atol=1e-10, rtol=0)


def test_chunking_gives_the_same_answer(monkeypatch):
    c = case("EXTEND", ((70, 45),), window_left=20, sinks=True)
    inputs = make_inputs(c)
    whole = reference(c, inputs)
    monkeypatch.setattr(torch_ref, "block_sizes", lambda device: (7, 11))
    chunked = reference(c, inputs)
    assert torch.allclose(whole.out, chunked.out, atol=1e-12, rtol=0)
    assert torch.allclose(whole.lse, chunked.lse, atol=1e-12, rtol=0)


def test_blocks_stay_bounded_and_windowed_blocks_are_skipped(monkeypatch):
    """No score block is larger than the block size, and a window limits the keys visited."""
    seen = []
    orig = RequestMask.block

    def spy(self, q0, q1, k0, k1):
        seen.append((q1 - q0, k1 - k0, k0))
        return orig(self, q0, q1, k0, k1)

    monkeypatch.setattr(RequestMask, "block", spy)
    monkeypatch.setattr(torch_ref, "block_sizes", lambda device: (64, 128))
    c = case("EXTEND", ((0, 2048),), window_left=100, num_q_heads=2, num_kv_heads=1)
    reference(c, make_inputs(c))
    assert max(q for q, _, _ in seen) <= 64 and max(k for _, k, _ in seen) <= 128
    visited = sum(k for _, k, _ in seen)
    assert visited < 2048 / 64 * (164 + 128)  # O(T * W), not O(T^2) = 32 * 2048


def test_native_precision_is_close_but_not_exact():
    c = case("EXTEND", ((30, 20),), dtype="bfloat16")
    inputs = make_inputs(c)
    exact, native = reference(c, inputs), reference(c, inputs, "native")
    d = (exact.out - native.out.double()).abs().max()
    assert 0 < d < 0.05


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("soft_cap", [0.0, 1e6])
def test_native_keeps_logits_past_the_dtype_range_and_stays_close_to_exact(padded, soft_cap):
    """float16 logits up to about 2.4e5: rounded to float16 they would be inf and native NaN (as
    before: a NaN budget); kept in float32 past 65504, native stays finite and close to exact."""
    c = case(
        "EXTEND", ((40, 8),), dtype="float16", window_left=4, q_amplitude=1000, sm_scale=10, soft_cap=soft_cap
    )
    inputs = make_inputs(c)
    exact, native = (reference(c, inputs, p, padded=padded) for p in ("exact", "native"))
    assert torch.isfinite(native.out).all() and torch.isfinite(native.lse).all()
    assert (exact.out - native.out.double()).abs().max() < 0.01


def test_rounding_held_past_the_range_rounds_within_it_as_a_cast_does():
    t = torch.tensor([1.0001, -3.14159, 65519.0, 65520.0, -1e5, 3e38, math.inf, -math.inf, math.nan])
    held = torch_ref._round_held(t.clone(), t.to(torch.float16))
    cast = t.to(torch.float16).float()
    assert torch.equal(held[:3], cast[:3])  # in range (65519 rounds down to 65504): the cast
    assert torch.equal(held[3:8], t[3:8])  # past it: kept, and infinities stay what they were
    assert held[8].isnan()
    inside = t[:3].clone()  # nothing past the range: the CPU's plain copy, the same values
    assert torch.equal(torch_ref._round_held(inside, inside.to(torch.float16)), cast[:3])


def test_a_row_with_no_visible_key_is_zero_with_lse_minus_inf():
    m = RequestMask(
        query_pos=torch.tensor([0]), key_pos=torch.tensor([1, 2]), window_left=-1, causal=True, num_prefix=2,
        draft_visible=None,
    )
    q = torch.randn(1, 2, 8)
    kv = torch.randn(2, 1, 8)
    out, lse = torch_ref._request(m, q, kv, kv, None, 0.3, 0.0, torch.float64, None, torch.device("cpu"))
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()


def test_unknown_precision_is_rejected():
    c = case()
    with pytest.raises(ValueError, match="precision='half'"):
        reference(c, make_inputs(c), "half")


MEMORY_PROBE = """
import resource, sys, time, torch
from harness.core.batch import make_inputs
from tests.helpers import case
from references.torch_ref import reference
c = case("EXTEND", ((0, 32768),), window_left=1023, num_q_heads=4, num_kv_heads=1, head_dim=64)
inputs = make_inputs(c)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
reference(c, inputs)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) / 1024, time.perf_counter() - t)
"""


def test_a_32k_request_never_materialises_its_score_matrix():
    """32k queries x 32k keys in float64 would be 32 GiB for 4 heads; the reference stays small."""
    res = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, check=True)
    extra_mib, seconds = map(float, res.stdout.split())
    assert extra_mib < 512, f"peak grew by {extra_mib:.0f} MiB"


FP8 = dict(kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)


@pytest.mark.parametrize("mode,reqs", [("EXTEND", ((30, 20), (3, 7))), ("CROSS", ((0, 4, 25),))])
def test_with_an_fp8_cache_the_references_attend_over_exactly_what_the_pool_holds(mode, reqs):
    c = case(mode, reqs, window_left=5 if mode == "EXTEND" else -1, **FP8)
    b = batch_of(c)
    if mode != "CROSS":  # the engine's write of this forward's K/V (CROSS has none)
        b.pool.write(b.out_cache_loc, b.k_new, b.v_new)
    k, v = [], []
    for r in range(c.batch_size):
        n = reqs[r][2] if mode == "CROSS" else sum(reqs[r][:2])
        codes_k, codes_v = b.pool.read(b.req_to_token[r, :n])
        k.append(codes_k.float() * c.k_scale)  # what each code stands for, in float32 (as kernels take
        v.append(codes_v.float() * c.v_scale)  # the scale)
    inputs = make_inputs(c)
    held = Inputs.from_requests(inputs.q, k, v, inputs.sinks)
    want, _ = naive(c, held)
    got = reference(c, inputs)
    assert torch.allclose(got.out, want, atol=1e-12, rtol=0)
    unquantized = c.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0)
    plain = reference(unquantized, make_inputs(unquantized))
    assert (got.out - plain.out).abs().max() > 1e-3  # quantization moved the expected output


@pytest.mark.parametrize("padded", [False, True])
def test_rounded_kv_is_exact_attention_over_kv_rounded_into_the_case_dtype(padded):
    """The FP8 budget's second term: an FP8 cache's values rounded into the case dtype (what a fallback
    that dequantizes into it holds), attended exactly; native and exact attend over them unrounded."""
    c = case("EXTEND", ((40, 12), (5, 9)), window_left=7, dtype="float16", **FP8)
    inputs = make_inputs(c)
    rounded = Inputs(
        q_all=inputs.q_all, kv_all=inputs.kv_all.to(torch.float16), q_lens=inputs.q_lens,
        kv_lens=inputs.kv_lens, sinks=None,
    )
    plain = c.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0)
    exact, native, ours = torch_ref.references(c, inputs, ("exact", "native", "rounded_kv"), padded=padded)
    theirs, their_native = torch_ref.references(plain, rounded, ("exact", "native"), padded=padded)
    assert torch.equal(ours.out, theirs.out) and torch.equal(ours.lse, theirs.lse)
    assert not torch.equal(exact.out, ours.out)  # exact attends over the values unrounded
    assert not torch.equal(native.out, their_native.out)  # and so does native
    (plain_exact,) = torch_ref.references(plain, rounded, ("exact",), padded=padded)
    assert torch.equal(torch_ref.reference(plain, rounded, "rounded_kv", padded=padded).out, plain_exact.out)
