"""The mask probe: exact support for a correct backend; each injected mask bug named key by key.

On the GPU (skipped, with the reason, without CUDA) every registered CUDA backend attends exactly the
reference support, on shapes of the `gpu` profile (bf16, head_dim 128, 8 q heads, 2 kv heads) so
FlashInfer compiles no variant the suite does not already need."""

import pytest
import torch

from harness import backends
from harness.backends import load
from harness.backends.torch_native import TorchNative
from harness.checks.probe import CLEAN_LINE, attended, one_hot_values, probe
from harness.core.batch import make_inputs
from references.masks import case_masks
from tests.helpers import case

WINDOWED = case("EXTEND", ((30, 12),), window_left=7, head_dim=8, num_q_heads=4, num_kv_heads=2)

CORRECT = {
    "prefix-window": WINDOWED,
    "prefill-window-multi": case("EXTEND", ((0, 20), (5, 9)), window_left=4, head_dim=8),
    "decode-window": case("DECODE", ((40, 1), (3, 1)), window_left=9, head_dim=16, page_size=1),
    "draft_extend_v2": case("DRAFT_EXTEND_V2", ((20, 3), (5, 3)), head_dim=8, kv_layout="HND"),
    "verify-tree-hybrid": case(
        "TARGET_VERIFY", ((20, 5, 0, (-1, 0, 0, 1, 2)),), window_left=6, head_dim=8, hybrid_swa_pool=True
    ),
    "cross": case("CROSS", ((0, 4, 10), (3, 1, 7)), head_dim=8),
    "encoder-two-sided": case("ENCODER_ONLY", ((0, 20), (0, 6)), window_left=4, window_right=2, head_dim=8),
    "extreme-logits-cap-sinks": case(
        "EXTEND", ((10, 6),), head_dim=8, soft_cap=5.0, sinks=True, q_amplitude=1000.0, window_left=3
    ),
    "no-window-mqa": case("EXTEND", ((33, 7),), head_dim=8, num_q_heads=4, num_kv_heads=1, dtype="float16"),
    # one-hot V over an FP8 cache whose v_scale makes 1 / v_scale round (a lone key weighed 1.04)
    "fp8-cache": case(
        "DECODE", ((20, 1), (0, 1)), window_left=5, head_dim=8, kv_dtype="float8_e4m3fn", v_scale=3.7
    ),
}


@pytest.mark.parametrize("name", list(CORRECT))
def test_a_correct_backend_attends_exactly_the_reference_support(name):
    c = CORRECT[name]
    r = probe(load("torch_native"), c)
    assert r.error is None and r.clean, r.lines
    longest = max(rp.keys for rp in r.requests)
    assert r.runs == -(-longest // c.head_dim)  # one run per chunk of head_dim keys
    for rp, mask in zip(r.requests, case_masks(c), strict=True):
        expected = ["".join("#" if v else "." for v in row) for row in mask.dense().tolist()]
        assert rp.grid == expected


def test_one_hot_values_cover_each_key_exactly_once_across_chunks():
    c = case("EXTEND", ((13, 6), (2, 3)), head_dim=8)
    chunks = [one_hot_values(c, k) for k in range(3)]
    for r, t in enumerate((19, 5)):
        total = sum(ch[r].float().sum(-1) for ch in chunks)  # [T, Hkv]
        assert torch.equal(total, torch.ones(t, c.num_kv_heads))
        key = 10 if t > 10 else 4
        chunk, col = divmod(key, 8)
        assert chunks[chunk][r][key, 0, col] == 1


def test_window_ignored_names_the_wrongly_attended_keys():
    r = probe(load("harness.mutants.torch_native:_WindowIgnored"), WINDOWED)
    assert not r.clean
    assert (
        "request 0, query 0 (position 30) attended keys 0..22, outside its window [23, 30] (all 4 heads)"
        in r.lines
    )
    assert r.requests[0].grid[0] == "+" * 23 + "#" * 8 + "." * 11


def test_window_short_names_the_missed_key():
    r = probe(load("harness.mutants.torch_native:_WindowShort"), WINDOWED)
    assert (
        "request 0, query 0 (position 30) did not attend key 23, inside its window [23, 30] (all 4 heads)"
        in r.lines
    )
    assert r.requests[0].grid[0] == "." * 23 + "-" + "#" * 7 + "." * 11


class _WindowLong(TorchNative):
    def in_window(self, batch, r, key_pos, query_pos):
        return key_pos >= query_pos - self.window_left(batch) - 1  # W + 2 keys


def test_window_one_too_long_names_the_single_extra_key():
    r = probe(_WindowLong(), WINDOWED)
    assert (
        "request 0, query 5 (position 35) attended key 27, outside its window [28, 35] (all 4 heads)"
        in r.lines
    )
    # One extra key per query and head, except query 0: its key 22 lies before the adapter's kv_start.
    assert r.requests[0].extra == 11 * 4


def test_encoder_bugs_are_named_against_the_two_sided_window():
    """An encoder query's window has a right edge: the probe names it, and no causal mask."""
    c = case("ENCODER_ONLY", ((0, 16),), window_left=3, window_right=2, head_dim=8)
    r = probe(load("harness.mutants.torch_native:_TwoSidedLeftOnly"), c)
    line = "request 0, query 5 (position 5) attended keys 8..15, outside its window [2, 7] (all 8 heads)"
    assert line in r.lines
    r = probe(load("harness.mutants.torch_native:_WindowWrongSide"), c.replace(window_right=-1))
    line = "request 0, query 5 (position 5) attended keys 0..1, outside its window [2, 15] (all 8 heads)"
    assert line in r.lines
    r = probe(load("harness.mutants.torch_native:_EncoderCausal"), c.replace(window_left=-1, window_right=-1))
    line = (
        "request 0, query 5 (position 5) did not attend keys 6..15, visible to it "
        "(encoder-only, no window: positions [0, 15]) (all 8 heads)"
    )
    assert line in r.lines


class _TreeIgnored(TorchNative):
    def build_mask(self, batch, r, lo, hi):
        mask = super().build_mask(batch, r, lo, hi)
        mask[:, hi - lo - batch.num_draft :] = True  # every draft sees every draft
        return mask


def test_tree_bug_names_drafts_that_are_not_ancestors():
    c = CORRECT["verify-tree-hybrid"]
    r = probe(_TreeIgnored(), c)
    # Draft 1 (depth 1, parent 0) wrongly sees drafts 2..4; drafts are named by index, not position.
    assert (
        "request 0, query 1 (position 21) attended drafts 2..4, not itself or an ancestor in its draft tree "
        "(all 8 heads)" in r.lines
    )


def test_draft_extent_bug_names_the_missed_drafts():
    c = CORRECT["draft_extend_v2"]
    r = probe(load("harness.mutants.torch_native:_DraftExtendPrefixOnly"), c)
    assert (
        "request 0, query 2 (position 22) did not attend keys 20..22, "
        "visible to it (causal, no window: positions [0, 22]) (all 8 heads)" in r.lines
    )


def test_untranslated_swa_pool_is_reported_as_poison_reads():
    c = CORRECT["verify-tree-hybrid"]
    r = probe(load("harness.mutants.torch_native:_SwaUntranslated"), c)
    assert r.requests[0].nonfinite_rows == 5 * 8
    assert (
        "request 0, query 0 (position 20): NaN/Inf on all 8 heads: poisoned (unowned) memory was read"
        in r.lines
    )
    assert set("".join(r.requests[0].grid)) == {"!"}


def test_threshold_is_relative_to_the_row_and_ignores_underflow_and_nan():
    third = torch.tensor(1 / 3).bfloat16().float()
    rows = torch.stack(
        [
            torch.tensor([third, third, third, 0.0, 0.0, 0.0]),  # uniform over 3, rounded to bf16
            torch.full((6,), 1 / 1000),  # many keys, small weights: all attended
            torch.tensor([0.4, 0.2, 0.2, 0.2, 0.0, 0.0]),  # one key counted twice is still attended
            torch.tensor([0.5, 0.5, 1e-30, 0.0, 0.0, 0.0]),  # a finitely masked key is not
            torch.zeros(6),  # a row with no visible key
            torch.tensor([float("nan"), 0.5, 0.5, 0.0, 0.0, 0.0]),  # NaN never counts as attended
        ]
    ).unsqueeze(1)
    got = attended(rows).squeeze(1).int().tolist()
    assert got == [
        [1, 1, 1, 0, 0, 0],
        [1] * 6,
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0] * 6,
        [0, 1, 1, 0, 0, 0],
    ]


def test_zero_q_is_why_extreme_logits_do_not_hide_visible_keys():
    """With the case's own q (amplitude 30), softmax puts most visible keys below the threshold, so a
    probe using it would report them as missed; with q = 0 the same case probes clean."""
    c = case("EXTEND", ((0, 24),), head_dim=8, q_amplitude=30.0)
    x = make_inputs(c)
    q, k = x.q[0].float(), x.k[0].float().repeat_interleave(c.num_q_heads // c.num_kv_heads, 1)
    s = torch.einsum("ehd,thd->eht", q, k) * c.scale
    vis = case_masks(c)[0].dense().unsqueeze(1)
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), -1)
    lost = int((vis & ~attended(p)).sum())
    assert lost > vis.sum() // 2, lost
    assert probe(load("torch_native"), c).clean


def test_a_probe_that_cannot_run_says_why():
    r = probe(load("torch_native"), WINDOWED, "tpu")
    assert r.error == "torch_native does not run on tpu" and not r.clean and r.runs == 0


class _ScaleDoubled(TorchNative):
    def attend(self, q, k, v, mask, batch):
        return super().attend(q * 2, k, v, mask, batch)  # logits twice too large


def test_a_value_bug_probes_clean_and_says_where_else_to_look():
    """The probe sees the mask only: a wrong scale leaves the support right, and the line says so."""
    r = probe(_ScaleDoubled(), WINDOWED)
    assert r.clean and r.lines == [CLEAN_LINE]


def test_a_backend_that_crashes_under_the_probe_is_reported_not_raised():
    c = CORRECT["verify-tree-hybrid"].replace(swa_pool_exact=True)  # untranslated: out of bounds
    r = probe(load("harness.mutants.torch_native:_SwaUntranslated"), c)
    assert r.error.startswith("backend raised IndexError") and not r.clean


GPU_SHAPE = dict(head_dim=128, num_q_heads=8, num_kv_heads=2, dtype="bfloat16")
CASES = {
    "prefix-swa": case("EXTEND", ((300, 70), (5, 40)), window_left=63, **GPU_SHAPE),
    "prefix-full": case("EXTEND", ((140, 30),), **GPU_SHAPE),
    "prefill-swa": case("EXTEND", ((0, 200),), window_left=31, **GPU_SHAPE),
    "prefix-swa-hybrid": case("EXTEND", ((260, 20),), window_left=47, hybrid_swa_pool=True, **GPU_SHAPE),
    "decode-swa": case("DECODE", ((500, 1), (20, 1)), window_left=127, page_size=32, **GPU_SHAPE),
    "draft_extend_v2": case("DRAFT_EXTEND_V2", ((100, 4), (33, 4)), **GPU_SHAPE),
    "verify-tree-swa": case("TARGET_VERIFY", ((90, 5, 0, (-1, 0, 0, 1, 2)),), window_left=40, **GPU_SHAPE),
    "cross": case("CROSS", ((0, 20, 50), (0, 7, 33)), **GPU_SHAPE),
    "prefix-swa-cap-sinks": case(
        "EXTEND", ((64, 16),), window_left=15, soft_cap=30.0, sinks=True, **GPU_SHAPE
    ),
}
CUDA_BACKENDS = [n for n in backends.names() if "cuda" in backends.load(n).capabilities.devices]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
)
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_cuda_backend_attends_exactly_the_reference_support(name, case_name):
    backend = backends.load(name)
    c = CASES[case_name]
    why = backend.available("cuda") or backend.supports(c)
    if why:
        pytest.skip(why)
    r = probe(backend, c, "cuda")
    assert r.error is None and r.clean, "\n".join(r.lines[:8])
