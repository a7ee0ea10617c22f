"""torch_split's own parts: the LSE merge, base-2 conversion, and splits that depend on the batch
unless deterministic mode fixes their size (which is what makes its determinism mutants real)."""

import math

import torch

from harness.backends.torch_split import DETERMINISTIC_SPLIT, Partial, TorchSplit, merge_base2, merge_states
from harness.batch import build_batch, make_inputs
from harness.checks.invariance import target_slice
from tests.helpers import batch_of, case


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
