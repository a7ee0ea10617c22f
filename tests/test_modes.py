"""Each mode's engine metadata, exactly as docs/design.md defines it."""

import numpy as np
import pytest
import torch

from harness.core import modes
from harness.core.batch import Inputs, build_batch, make_inputs
from harness.core.modes import Mode
from tests.helpers import batch_of, case


def test_extend_metadata():
    b = batch_of(case("EXTEND", ((5, 3), (0, 2))))
    assert b.seq_lens.tolist() == [8, 2]
    assert b.prefix_lens.tolist() == [5, 0]
    assert b.extend_lens.tolist() == [3, 2]
    assert b.qo_indptr.tolist() == [0, 3, 5]
    assert b.positions.tolist() == [5, 6, 7, 0, 1]
    assert b.out_cache_loc.tolist() == b.req_to_token[0, 5:8].tolist() + b.req_to_token[1, 0:2].tolist()


def test_decode_seq_lens_include_the_new_token():
    b = batch_of(case("DECODE", ((9, 1), (0, 1))))
    assert b.seq_lens.tolist() == [10, 1]
    assert b.positions.tolist() == [9, 0]


def test_draft_extend_v2_seq_lens_are_bumped_to_prefix_plus_num_draft():
    """Pinned: a test fixture once used seq_lens = P here, and a 'fix' based on it was reverted."""
    b = batch_of(case("DRAFT_EXTEND_V2", ((7, 4), (2, 4))))
    assert b.num_draft == 4
    assert b.seq_lens_before_bump.tolist() == [7, 2]
    assert b.seq_lens.tolist() == [11, 6]
    extents = [modes.kv_extent(Mode.DRAFT_EXTEND_V2, s, 4, 0) for s in b.seq_lens.tolist()]
    assert extents == [11, 6]
    assert b.positions.tolist() == [7, 8, 9, 10, 2, 3, 4, 5]


def test_target_verify_seq_lens_exclude_drafts_and_positions_follow_depth():
    b = batch_of(case("TARGET_VERIFY", ((6, 4, 0, (-1, 0, 0, 1)),)))
    assert b.seq_lens.tolist() == [6]
    assert modes.kv_extent(Mode.TARGET_VERIFY, 6, 4, 0) == 10
    assert b.positions.tolist() == [6, 7, 7, 8]
    assert b.tree_mask[0].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]


def test_cross_reads_encoder_keys_that_lead_the_row():
    b = batch_of(case("CROSS", ((3, 1, 5), (0, 2, 4))))
    assert b.encoder_lens.tolist() == [5, 4]
    assert b.seq_lens.tolist() == [4, 2]
    assert modes.kv_extent(Mode.CROSS, 4, 0, 5) == 5
    # encoder K sits in the first encoder_len slots of the row, decoder slots follow
    k, _ = b.pool.read(b.req_to_token[0, :5])
    assert torch.equal(k, make_inputs(b.case).k[0])
    k_dec, _ = b.pool.read(b.req_to_token[0, 5:9])
    assert torch.isnan(k_dec.float()).all()


def test_encoder_only_is_an_extend_over_no_cache_whose_keys_are_its_own_tokens():
    """ENCODER_ONLY: seq_lens = E, no prefix, positions 0 .. E-1, KV extent E; its K/V arrive as new
    tokens for the adapter to write to the pool (as engines do) before or after attending."""
    b = batch_of(case("ENCODER_ONLY", ((0, 4), (0, 2)), window_left=1, window_right=1))
    assert b.seq_lens.tolist() == [4, 2] and b.prefix_lens.tolist() == [0, 0]
    assert b.extend_lens.tolist() == [4, 2] and b.encoder_lens.tolist() == [0, 0]
    assert b.positions.tolist() == [0, 1, 2, 3, 0, 1]
    assert [modes.kv_extent(Mode.ENCODER_ONLY, s, b.num_draft, 0) for s in b.seq_lens.tolist()] == [4, 2]
    assert b.num_draft == 0 and b.tree_mask is None
    assert b.out_cache_loc.tolist() == b.req_to_token[0, :4].tolist() + b.req_to_token[1, :2].tolist()
    assert torch.isnan(b.pool.read(b.out_cache_loc)[0].float()).all()  # nothing cached
    assert torch.equal(b.k_new, make_inputs(b.case).kv_all[0])
    assert modes.family_of(Mode.ENCODER_ONLY, [0, 0]) == "encoder"


def test_new_tokens_are_not_in_the_pool_until_the_adapter_writes_them():
    b = batch_of(case("EXTEND", ((5, 3),)))
    k_new, _ = b.pool.read(b.out_cache_loc)
    assert torch.isnan(k_new.float()).all()
    k_pre, _ = b.pool.read(b.req_to_token[0, :5])
    inputs = make_inputs(b.case)
    assert torch.equal(k_pre, inputs.k[0][:5])
    assert torch.equal(b.k_new, inputs.k[0][5:])


def test_family_of():
    assert modes.family_of(Mode.EXTEND, [0, 0]) == "prefill"
    assert modes.family_of(Mode.EXTEND, [0, 3]) == "prefix"
    assert modes.family_of(Mode.TARGET_VERIFY, [3]) == "verify"
    assert modes.family_of(Mode.CROSS, [0]) == "cross"


def test_tree_depths_and_ancestry():
    assert modes.tree_depths((-1, 0, 1, 1, -1)) == [0, 1, 2, 2, 0]
    anc = modes.tree_ancestry((-1, 0, 1, 1))
    assert anc[3] == [True, True, False, True]


def test_host_copies_match_the_device_metadata_in_every_mode():
    """Adapters plan from the host copies (reading a GPU tensor back would wait for the device)."""
    shapes = {
        "EXTEND": ((5, 3), (0, 2)),
        "DECODE": ((9, 1), (0, 1)),
        "DRAFT_EXTEND_V2": ((7, 3), (2, 3)),
        "TARGET_VERIFY": ((4, 3, 0, (-1, 0, 0)), (0, 3, 0, (-1, 0, 1))),
        "CROSS": ((0, 2, 5), (3, 1, 4)),
        "ENCODER_ONLY": ((0, 7), (0, 2)),
    }
    assert set(shapes) == {str(m) for m in Mode}
    for mode, reqs in shapes.items():
        b = batch_of(case(mode, reqs, window_left=-1 if mode == "CROSS" else 2))
        for name in ("seq_lens", "prefix_lens", "extend_lens", "encoder_lens", "qo_indptr", "positions"):
            assert b.cpu_list(name) == getattr(b, name).tolist(), (mode, name)
        for r in range(b.batch_size):
            q0, q1 = b.query_span(r)
            assert (q0, q1) == tuple(b.qo_indptr[r : r + 2].tolist())
            assert b.first_position(r) == int(b.positions[q0:q1].min())
        if mode == "DRAFT_EXTEND_V2":
            assert b.cpu_list("seq_lens_before_bump") == b.seq_lens_before_bump.tolist() == [7, 2]


def test_one_upload_keeps_each_tensor_and_aligns_it():
    from harness.core.metadata import UPLOAD_ALIGN, upload_int32

    parts = [
        [4, 5, 6],
        torch.arange(5, dtype=torch.int32),
        [],
        list(range(17)),
        torch.zeros(0, dtype=torch.int32),
        torch.ones(3, 7, dtype=torch.int64),
        [9],
        np.arange(6, dtype=np.int64).reshape(2, 3) - 2,
    ]
    out = upload_int32(torch.device("cpu"), parts)
    expect = [
        p if isinstance(p, torch.Tensor) else torch.as_tensor(np.asarray(p), dtype=torch.int32) for p in parts
    ]
    assert [o.shape for o in out] == [e.shape for e in expect]
    assert all(torch.equal(o, e.to(torch.int32)) and o.dtype == torch.int32 for o, e in zip(out, expect))
    assert all(o.is_contiguous() and o.storage_offset() % UPLOAD_ALIGN == 0 for o in out)


def test_packed_inputs_give_each_request_its_own_rows():
    c = case("EXTEND", ((3, 2), (0, 4), (5, 1)), seed=7)
    inputs = make_inputs(c)
    assert inputs.q_lens == (2, 4, 1) and inputs.kv_lens == (5, 4, 6)
    assert [len(q) for q in inputs.q] == [2, 4, 1] and [len(k) for k in inputs.k] == [5, 4, 6]
    assert torch.equal(torch.cat(inputs.q), inputs.q_all)
    assert torch.equal(torch.cat(inputs.k), inputs.kv_all[0])
    assert torch.equal(torch.cat(inputs.v), inputs.kv_all[1])
    again = Inputs.from_requests(inputs.q, inputs.k, inputs.v, inputs.sinks)
    assert torch.equal(again.q_all, inputs.q_all) and torch.equal(again.kv_all, inputs.kv_all)
    assert torch.equal(make_inputs(c).kv_all, inputs.kv_all)  # a case replays


def test_a_request_placed_in_another_batch_carries_exactly_its_inputs():
    alone = case("EXTEND", ((3, 2),), seed=1, sinks=True)
    crowd = case("EXTEND", ((4, 4), (1, 3), (3, 2)), seed=2)
    placed = make_inputs(crowd).with_request(2, make_inputs(alone))
    base, drawn = make_inputs(alone), make_inputs(crowd)
    for name in ("q", "k", "v"):
        xs, src, other = (getattr(x, name) for x in (placed, base, drawn))
        assert torch.equal(xs[2], src[0]) and all(torch.equal(xs[r], other[r]) for r in (0, 1))
    assert torch.equal(placed.sinks, base.sinks)


def test_the_adapters_tensors_are_not_the_references_inputs():
    """An adapter that writes into q, k_new or v_new in place must not change what the references
    read (the batch's tensors are copies; the inputs are packed and could otherwise be shared)."""
    c = case("EXTEND", ((3, 2), (1, 3)), sinks=True)
    inputs = make_inputs(c)
    b = build_batch(c, inputs)
    before = (inputs.q_all.clone(), inputs.kv_all.clone(), inputs.sinks.clone())
    for t in (b.q, b.k_new, b.v_new, b.sinks):
        t.mul_(2.0)
    after = (inputs.q_all, inputs.kv_all, inputs.sinks)
    assert all(torch.equal(x, y) for x, y in zip(before, after))


@pytest.mark.parametrize("mode", ["EXTEND", "CROSS"])
def test_a_batch_does_not_expose_the_references_inputs(mode):
    """An adapter cannot reach what the references read: no part of the Batch is the Inputs or one of
    their tensors, nor shares a tensor's memory (only copies, and the pool, hold their values)."""
    c = case(mode, ((3, 2, 4), (1, 3, 2)) if mode == "CROSS" else ((3, 2), (1, 3)), sinks=True)
    inputs = make_inputs(c)
    theirs = {t.untyped_storage().data_ptr() for t in (inputs.q_all, inputs.kv_all, inputs.sinks)}
    b = build_batch(c, inputs)
    parts = dict(vars(b), pool_k=b.pool.k, pool_v=b.pool.v)
    for name, part in parts.items():
        assert not isinstance(part, Inputs), name
        if isinstance(part, torch.Tensor):
            assert part.untyped_storage().data_ptr() not in theirs, name
