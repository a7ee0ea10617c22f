"""The batch-invariance check passes on a batch-invariant backend and fails on one that is not.
torch_split's own parts: the LSE merge, base-2 conversion, splits that depend on the batch unless
deterministic mode fixes their size (which is what makes its determinism mutants real), and the
grouping of requests into padded computations (never in deterministic mode)."""

import math

import pytest
import torch

from harness.backends import torch_split
from harness.backends.base import BackendOutput
from harness.backends.torch_native import TorchNative
from harness.backends.torch_split import DETERMINISTIC_SPLIT, Partial, TorchSplit, merge_base2, merge_states
from harness.checks.invariance import check_invariance, compositions, invariance_result, target_slice
from harness.checks.numeric import check_case
from harness.core.batch import build_batch, make_inputs
from tests.helpers import batch_of, case


class _BatchSizeLeaks(TorchNative):
    """Adds a rounding-level term that depends on the batch size (as a split-KV choice would)."""

    def run(self, batch):
        out = super().run(batch).out
        return BackendOutput(out=out + out.abs().mul(2**-5) * (batch.batch_size > 4))


DET = dict(deterministic=True, window_left=20)


@pytest.mark.parametrize(
    "mode,reqs",
    [
        ("EXTEND", ((30, 9), (3, 4))),
        ("DECODE", ((300, 1), (5, 1))),
        ("TARGET_VERIFY", ((40, 4, 0, (-1, 0, 0, 1)),)),
        ("DRAFT_EXTEND_V2", ((12, 3), (0, 3))),
    ],
)
def test_torch_native_is_batch_invariant(mode, reqs):
    res = check_invariance(TorchNative(), case(mode, reqs, **DET), long_kv=300)
    assert res.passed, res.reason
    assert res.compositions == len(compositions(case(mode, reqs, **DET), long_kv=300))


def test_cross_is_batch_invariant():
    res = check_invariance(TorchNative(), case("CROSS", ((0, 5, 9),), deterministic=True), long_kv=200)
    assert res.passed, res.reason


def test_a_batch_dependent_backend_is_caught():
    res = check_invariance(_BatchSizeLeaks(), case("EXTEND", ((30, 9),), **DET), long_kv=300)
    assert not res.passed
    assert res.failing == "between very different lengths" and res.max_diff > 0
    assert "request 0's output changed in 'between very different lengths' (batch of 5" in res.reason


def test_compositions_cover_alone_permuted_long_neighbours_and_1_to_64():
    comps = compositions(case("EXTEND", ((30, 9), (2, 2)), **DET), long_kv=5000)
    names = [n for n, _, _ in comps]
    assert names[0] == "alone" and "permuted" in names and "as given, again" in names
    long_batch = dict((n, r) for n, r, _ in comps)["between very different lengths"]
    assert len(long_batch) == 5
    sizes = {len(r) for n, r, _ in comps if n.startswith("batch of")}
    assert sizes == {1, 2, 3, 8, 16, 32, 64}
    assert max(r.prefix_len for _, reqs, _ in comps for r in reqs) > 4096
    for _, reqs, at in comps:
        assert reqs[at] == case("EXTEND", ((30, 9),)).requests[0]


def test_only_promised_in_deterministic_mode():
    with pytest.raises(ValueError, match="deterministic=true"):
        check_invariance(TorchNative(), case("EXTEND", ((3, 4),)))


def test_deterministic_keyword_selects_exactly_the_invariance_suite():
    from tests.test_catalogue import FAMILY_TEST, collect

    ids = collect("deterministic")
    assert ids and all("::test_deterministic[" in i for i in ids)
    assert set(ids) == {i for i in collect(None) if "::test_deterministic[" in i}
    assert any("[torch_split-cpu-swa]" in i for i in ids) and any("[torch_native-cpu-full]" in i for i in ids)
    for keyword in FAMILY_TEST:  # no family keyword hides in these ids
        assert not any(keyword in i for i in ids), keyword


def test_a_backend_that_raises_is_a_crash_result_not_an_exception():
    from harness.checks.invariance import invariance_result

    class Raises(TorchNative):
        def run(self, batch):
            if batch.batch_size > 1:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().run(batch)

    res = invariance_result(Raises(), case("EXTEND", ((30, 9), (2, 2)), **DET), long_kv=300)
    assert res.status == "crash" and "illegal memory access" in res.reason
    assert res.extra["failing"] == "as given" and "Traceback" in res.extra["traceback"]


class _RefusesLongKV(TorchNative):
    """Takes no request with more than 64 cached tokens: the long-neighbour compositions are refused."""

    def supports(self, c):
        long_kv = any(r.prefix_len > 64 for r in c.requests)
        return "no prefix over 64 <sim>" if long_kv else super().supports(c)


class _CapsTheBatchAt8(TorchNative):
    def supports(self, c):
        return "at most 8 requests <sim>" if len(c.requests) > 8 else super().supports(c)


def test_a_refused_composition_the_check_needs_fails_it_and_says_which_and_why():
    c = case("EXTEND", ((30, 9),), **DET)
    res = check_invariance(_RefusesLongKV(), c, long_kv=300)
    assert not res.passed
    assert "the check needs 'between very different lengths'" in res.reason
    assert "refused: 'between very different lengths': no prefix over 64 <sim>" in res.reason
    assert res.refused["between very different lengths"] == "no prefix over 64 <sim>"


def test_refused_batches_over_8_are_listed_but_allowed():
    c = case("DECODE", ((40, 1), (5, 1)), **DET)
    res = invariance_result(_CapsTheBatchAt8(), c, "cpu", long_kv=300)
    assert res.status == "pass", res.reason
    assert "refused 3 larger batches: 'batch of 16': at most 8 requests <sim>" in res.reason
    assert sorted(res.extra["refused_compositions"]) == ["batch of 16", "batch of 32", "batch of 64"]


@pytest.mark.parametrize("prefix", [0, 5])
def test_a_one_query_cross_target_is_checked_among_decoder_steps_only(prefix):
    """A CROSS request with one query is a decoder step: prefill neighbours would move it onto the
    prefill path (a backend without deterministic prefill refuses those batches: H100, FlashInfer)."""
    c = case("CROSS", [(prefix, 1, 3)], deterministic=True)
    for name, reqs, _ in compositions(c):
        assert all(r.extend_len == 1 for r in reqs), name


def test_a_cross_prefill_target_keeps_prefill_neighbours():
    c = case("CROSS", [(0, 6, 3)], deterministic=True)
    assert any(r.extend_len > 1 for _, reqs, at in compositions(c) for i, r in enumerate(reqs) if i != at)


def _softmax_attention(s, v):
    p = torch.softmax(s, -1)
    return p @ v, torch.logsumexp(s, -1)


def test_merging_two_halves_gives_the_whole():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 10, generator=g, dtype=torch.float64)
    v = torch.randn(10, 4, generator=g, dtype=torch.float64)
    whole, lse = _softmax_attention(s, v)
    a, la = _softmax_attention(s[:, :4], v[:4])
    b, lb = _softmax_attention(s[:, 4:], v[4:])
    out, merged = merge_states([(a, la), (b, lb)])
    assert torch.allclose(out, whole) and torch.allclose(merged, lse)
    p = merge_base2(Partial(torch.stack([a, b]), torch.stack([la, lb]) / math.log(2)))
    assert torch.allclose(p.out, whole) and torch.allclose(p.lse2 * math.log(2), lse)


def test_a_part_without_keys_drops_out_of_the_merge():
    out = torch.ones(2, 3)
    lse = torch.tensor([0.5, -1.0])
    empty = (torch.zeros(2, 3), torch.full((2,), -math.inf))
    merged, m = merge_states([(out, lse), empty])
    assert torch.equal(merged, out) and torch.equal(m, lse)
    none, m2 = merge_states([empty, empty])
    assert torch.equal(none, torch.zeros(2, 3)) and torch.isinf(m2).all()


def test_natural_lse_converts_base_2():
    assert torch.allclose(
        TorchSplit().natural_lse(torch.tensor([1.0, 3.0])), torch.tensor([1.0, 3.0]) * math.log(2)
    )


def _target(backend, c, alone):
    """Request 0's output in the batch of case c, request 0 carrying the inputs of case `alone`."""
    inputs = make_inputs(c).with_request(0, make_inputs(alone))
    return target_slice(backend.run(build_batch(c, inputs)).out, c, 0)


def test_split_size_follows_the_batch_unless_deterministic():
    b = TorchSplit()
    one = batch_of(case("DECODE", ((100, 1),)))
    many = batch_of(case("DECODE", ((100, 1),) * 16))
    assert b.split_size(one, 101) != b.split_size(many, 101)
    det_one = batch_of(case("DECODE", ((100, 1),), deterministic=True))
    det_many = batch_of(case("DECODE", ((100, 1),) * 16, deterministic=True))
    assert b.split_size(det_one, 101) == b.split_size(det_many, 101) == DETERMINISTIC_SPLIT


def test_the_split_shows_in_the_output_bits():
    """Without a fixed split size, request 0's bits change with the batch: invariance is a real
    property of this backend, not one it has for free."""
    b = TorchSplit()
    alone = case("DECODE", ((300, 1),), seed=3)
    crowd = alone.replace(requests=alone.requests * 16)
    assert not torch.equal(_target(b, alone, alone), _target(b, crowd, alone))
    det = alone.replace(deterministic=True)
    assert torch.equal(_target(b, det, det), _target(b, det.replace(requests=det.requests * 16), det))


def _groups(c):
    b = TorchSplit()
    batch = batch_of(c)
    _, queries, keys = b.request_sizes(batch)
    return b.groups(batch, queries, keys)


def test_deterministic_mode_computes_each_request_alone():
    reqs = ((40, 3), (40, 3), (41, 2))
    assert _groups(case("EXTEND", reqs)) == [[2, 0, 1]]  # alike: one group, ordered by size
    assert _groups(case("EXTEND", reqs, deterministic=True)) == [[0], [1], [2]]


def test_padding_may_cost_what_the_real_work_costs_and_no_more(monkeypatch):
    monkeypatch.setitem(torch_split.PAD_FREE, "cpu", 0)
    # one long request next to short ones: padding them to its size would waste 30x the work
    assert _groups(case("EXTEND", ((0, 300), (2, 3), (1, 4), (0, 5)))) == [[1, 2, 3], [0]]
    # the three small ones padded: 3 requests x 5 queries x 5 keys x 8 heads; two of them: 2 x 4 x 5 x 8
    monkeypatch.setattr(torch_split, "GROUP_LIMIT", 3 * 5 * 5 * 8 - 1)
    assert _groups(case("EXTEND", ((0, 300), (2, 3), (1, 4), (0, 5)))) == [[1, 2], [3], [0]]


GROUPED_CASES = [
    case("EXTEND", ((37, 5), (0, 1), (130, 17), (3, 40)), window_left=20, dtype="float32", page_size=1),
    case(
        "DECODE", ((0, 1), (70, 1), (200, 1), (9, 1)), window_left=33, dtype="float32", hybrid_swa_pool=True
    ),
    case("TARGET_VERIFY", ((5, 4, 0, (-1, 0, 0, 1)), (90, 4, 0, (-1, 0, 1, 2))), dtype="float32", sinks=True),
    case("CROSS", ((0, 7, 30), (0, 2, 130), (0, 1, 3)), dtype="float32", soft_cap=5.0),
]


@pytest.mark.parametrize("c", GROUPED_CASES, ids=lambda c: str(c.mode))
def test_a_groups_padding_is_never_seen(c, monkeypatch):
    """Each request computed alone, then the whole batch in one padded group (same split sizes: the
    same batch): float32 outputs agree to rounding, so no padded key or query leaks in."""
    monkeypatch.setattr(
        TorchSplit, "groups", lambda self, batch, q, k: [[r] for r in range(batch.batch_size)]
    )
    alone = TorchSplit().run(batch_of(c))
    monkeypatch.setattr(TorchSplit, "groups", lambda self, batch, q, k: [list(range(batch.batch_size))[::-1]])
    grouped = TorchSplit().run(batch_of(c))
    assert torch.allclose(grouped.out, alone.out, atol=1e-5, rtol=1e-5)
    assert torch.allclose(grouped.lse, alone.lse, atol=1e-5, rtol=1e-5)


def test_requests_in_several_groups_come_back_in_batch_order(monkeypatch):
    monkeypatch.setitem(torch_split.PAD_FREE, "cpu", 0)
    c = GROUPED_CASES[0].replace(dtype="bfloat16")
    assert len(_groups(c)) > 1
    result = check_case(TorchSplit(), c)
    assert result.status == "pass", result.failure_text()


def test_a_request_that_reads_no_key_gets_zeros_and_no_lse():
    class NoKeys(TorchSplit):
        def paged_range(self, batch, r):
            return 0, 0

    got = NoKeys().run(batch_of(case("DECODE", ((5, 1), (9, 1)))))
    assert torch.equal(got.out.float(), torch.zeros_like(got.out.float()))
    assert torch.isinf(got.lse).all() and (got.lse < 0).all()
