"""Pools: layouts, poisoning, the hybrid SWA pool and its translation, canaries."""

import pytest
import torch

from harness.core import pool
from harness.core.batch import make_inputs
from harness.core.pool import CANARY, translate_slots
from tests.helpers import batch_of, case


def owned_slots(b):
    slots = set()
    for r, req in enumerate(b.case.requests):
        slots |= set(b.req_to_token[r, : req.prefix_len].tolist())
    return slots


@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "interleaved", "nonmonotonic"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_every_unowned_slot_is_nan_and_owned_slots_hold_the_prefix(layout, page_size):
    b = batch_of(case("EXTEND", ((20, 5), (33, 2), (0, 4)), page_size=page_size, page_layout=layout))
    owned = owned_slots(b)
    k = b.pool.k.reshape(-1, b.case.num_kv_heads, b.case.head_dim)
    for s in range(b.pool.num_slots):
        assert torch.isnan(k[s].float()).all() == (s not in owned), s
    assert 0 not in owned and 0 not in set(b.req_to_token[b.req_to_token > 0].tolist())
    inputs = make_inputs(b.case)
    for r, req in enumerate(b.case.requests):
        kk, vv = b.pool.read(b.req_to_token[r, : req.prefix_len])
        assert torch.equal(kk, inputs.k[r][: req.prefix_len])
        assert torch.equal(vv, inputs.v[r][: req.prefix_len])


def test_layouts_place_pages_as_named():
    gen = torch.Generator().manual_seed(0)
    assert pool.allocate_pages([2, 3], [0, 0], "contiguous", 1, 10, gen) == [[1, 2], [3, 4, 5]]
    assert pool.allocate_pages([2, 3], [0, 0], "interleaved", 1, 10, gen) == [[1, 3], [2, 4, 5]]
    # nonmonotonic: prefix pages ascend, the pages receiving new tokens descend from the top
    assert pool.allocate_pages([3, 2], [1, 1], "nonmonotonic", 1, 10, gen) == [[1, 9, 8], [2, 7]]
    shuffled = pool.allocate_pages([6, 6], [0, 0], "shuffled", 1, 20, gen)
    flat = shuffled[0] + shuffled[1]
    assert len(set(flat)) == 12 and flat != sorted(flat) and min(flat) >= 1


def test_nonmonotonic_extend_slots_go_backwards():
    b = batch_of(case("EXTEND", ((3, 6),), page_size=1, page_layout="nonmonotonic"))
    loc = b.out_cache_loc.tolist()
    assert loc == sorted(loc, reverse=True)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_hybrid_pool_translation(page_size, kv_layout):
    c = case(
        "EXTEND",
        ((70, 5), (40, 30)),
        window_left=9,
        hybrid_swa_pool=True,
        page_size=page_size,
        kv_layout=kv_layout,
    )
    b = batch_of(c)
    f2s = b.full_to_swa
    used_full = b.req_to_token[b.req_to_token > 0]
    # full-pool indices exceed every slot the SWA pool owns, and the map is not the identity
    swa_owned = f2s[f2s > 0]
    assert int(used_full.min()) > int(swa_owned.max())
    assert not torch.equal(f2s[used_full.long()], used_full)
    for r, req in enumerate(c.requests):
        lo = max(0, req.prefix_len - c.window_left)
        keep = b.req_to_token[r, lo : req.prefix_len]
        k, v = b.pool.read(translate_slots(keep, f2s))
        assert torch.equal(k, make_inputs(c).k[r][lo : req.prefix_len])
        # pages wholly before the window are freed: they map to the reserved slot 0
        first_kept_page_start = lo // page_size * page_size
        freed = b.req_to_token[r, :first_kept_page_start]
        assert (f2s[freed.long()] == 0).all()
        # untranslated, the same slots hit only poison
        k_bad, _ = b.pool.read(keep)
        assert torch.isnan(k_bad.float()).all()


def test_exact_size_swa_pool_makes_untranslated_reads_out_of_bounds():
    c = case("DECODE", ((70, 1), (40, 1)), window_left=5, hybrid_swa_pool=True, swa_pool_exact=True)
    b = batch_of(c)
    assert b.pool.num_pages == int(b.full_to_swa.max()) // c.page_size + 1
    with pytest.raises(IndexError):
        b.pool.read(b.req_to_token[0, 60:70])


def test_whole_page_loaders_get_a_canary_in_tail_rows_and_the_reserved_page():
    c = case("EXTEND", ((5, 4),), page_size=16)
    b = batch_of(c, whole_page_loads=True)
    page = b.req_to_token[0, 0] // 16
    tail = torch.arange(page * 16 + 9, page * 16 + 16)
    k, v = b.pool.read(tail)
    assert (k.float() == CANARY).all() and (v.float() == CANARY).all()
    k0, _ = b.pool.read(torch.arange(16))
    assert (k0.float() == CANARY).all()
    plain = batch_of(c)
    assert torch.isnan(plain.pool.read(tail)[0].float()).all()


def test_hnd_and_nhd_pools_read_the_same_values():
    a = batch_of(case("EXTEND", ((40, 3),), kv_layout="NHD"))
    h = batch_of(case("EXTEND", ((40, 3),), kv_layout="HND"))
    assert h.pool.k.shape[1] == h.case.num_kv_heads
    ka, _ = a.pool.read(a.req_to_token[0, :40])
    kh, _ = h.pool.read(h.req_to_token[0, :40])
    assert torch.equal(ka, kh)


FP8 = [("float8_e4m3fn", 0.0173, 3.7), ("float8_e5m2", 1.0, 0.5)]


@pytest.mark.parametrize("kv_dtype,k_scale,v_scale", FP8)
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_an_fp8_pool_holds_the_codes_of_the_logical_values_and_nan_elsewhere(
    kv_dtype, k_scale, v_scale, kv_layout
):
    fp8 = dict(kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale)
    c = case("EXTEND", ((40, 5), (17, 3)), kv_layout=kv_layout, **fp8)
    b = batch_of(c)
    assert b.pool.k.dtype == getattr(torch, kv_dtype) and b.pool.v.dtype == b.pool.k.dtype
    inputs = make_inputs(c)
    assert inputs.kv_all.dtype == torch.float32  # the values the codes stand for
    for r, req in enumerate(c.requests):
        kk, vv = b.pool.read(b.req_to_token[r, : req.prefix_len])
        assert torch.equal(kk.float() * k_scale, inputs.k[r][: req.prefix_len])
        assert torch.equal(vv.float() * v_scale, inputs.v[r][: req.prefix_len])
    owned = owned_slots(b)
    k = b.pool.k if kv_layout == "NHD" else b.pool.k.transpose(1, 2)
    codes = k.reshape(-1, c.num_kv_heads, c.head_dim).float()
    unowned = torch.tensor([s not in owned for s in range(b.pool.num_slots)])
    assert torch.isnan(codes[unowned]).all() and not torch.isnan(codes[~unowned]).any()
    assert torch.isnan(codes[unowned] * k_scale).all()  # poison survives dequantization


@pytest.mark.parametrize("kv_dtype,k_scale,v_scale", FP8)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_new_tokens_in_the_model_dtype_quantize_back_to_the_codes_the_references_read(
    kv_dtype, k_scale, v_scale, dtype
):
    c = case("EXTEND", ((9, 40),), kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale, dtype=dtype)
    b = batch_of(c)
    assert b.k_new.dtype == getattr(torch, dtype)  # the model's K/V, as the engine writes them
    b.pool.write(b.out_cache_loc, b.k_new, b.v_new)
    kk, vv = b.pool.read(b.out_cache_loc)
    inputs = make_inputs(c)
    assert torch.equal(kk.float() * k_scale, inputs.k[0][9:])
    assert torch.equal(vv.float() * v_scale, inputs.v[0][9:])


def test_quantize_saturates_keeps_nan_and_dequantize_multiplies_back():
    x = torch.tensor([1000.0, -1000.0, float("nan"), 3.3, 0.0])
    codes = pool.quantize(x, torch.float8_e4m3fn, 2.0)
    assert codes.dtype == torch.float8_e4m3fn
    out = pool.dequantize(codes, 2.0)
    assert out[:2].tolist() == [896.0, -896.0] and torch.isnan(out[2])
    assert out[3:].tolist() == [3.25, 0.0]  # 1.65 rounds to e4m3's 1.625
