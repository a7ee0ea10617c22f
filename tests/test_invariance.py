"""The batch-invariance check passes on a batch-invariant backend and fails on one that is not."""

import pytest

from harness.backends.base import BackendOutput
from harness.backends.torch_native import TorchNative
from harness.checks.invariance import check_invariance, compositions, invariance_result
from tests.helpers import case


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
