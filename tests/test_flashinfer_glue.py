"""The FlashInfer glue's arguments, checked on the CPU against a recording fake of flashinfer.

What each test pins: the page table addresses exactly a request's keys (in this layer's pool);
an empty key range is encoded so FlashInfer's two length formulas both read 0; the ragged path's
prefix pass reads from the first query's window and masks by global position; every option and,
in deterministic mode, the split parameters reach plan() on every path; the SWA pool is read
through translated page ids; LSE comes back in natural log. The fake (tests/flashinfer_fake.py)
records the calls; the GPU run checks the real library.

The FlashInfer adapters end to end on the CPU, with the computing fake standing in for the kernels.

Each adapter must pass the numeric check on the cases that stress its glue (windows binding in
prefix and extend, empty and page-aligned prefixes, the hybrid pool, HND pages, trees, sinks,
cross-attention in both phases), and each numeric mutant must be caught by the suite's search.
This shows the glue is right under FlashInfer's semantics as the fake models them; the GPU run
(tests/test_flashinfer_gpu.py, the suite) shows it against the kernels themselves.

The warm-up's probes: every JIT variant the gpu profile and the pinned cases need, one module each.

Phase 1 of `python -m harness.run.speed.warmup.flashinfer` learns which module a probe needs by stopping it
at its first module load, so each probe must need exactly one module and must be a case its
adapter runs. Checked here on the recording fake; the device run builds them."""

from __future__ import annotations

import dataclasses
import math
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from harness import backends
from harness.backends import flashinfer_glue as glue
from harness.backends.flashinfer_glue import paged_kv_table
from harness.checks.numeric import check_case
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request, case_traits
from harness.mutants import by_name, hunt
from harness.mutants.flashinfer import MUTANTS
from harness.run.speed.warmup import flashinfer as flashinfer_warmup
from harness.run.speed.warmup.flashinfer import GPU_VARIANT, coverage_cases, module_probes, pinned_cases
from harness.run.speed.warmup.ninja import Module
from harness.search import profiles
from tests import flashinfer_fake as fake

NAMES = ["flashinfer_ragged", "flashinfer_paged", "flashinfer_dec_cc", "flashinfer_dec_tc", "flashinfer_enc"]


@pytest.fixture
def fi(monkeypatch):
    fake.install(monkeypatch)
    return fake


def run(name_or_backend, case):
    b = fake.on_cpu(backends.load(name_or_backend) if isinstance(name_or_backend, str) else name_or_backend)
    assert b.supports(case) is None, b.supports(case)
    inputs = make_inputs(case)
    batch = build_batch(case, inputs, "cpu")
    return b, batch, inputs, b.run(batch)


def test_page_table_addresses_exactly_the_requests_keys(fi):
    case = Case(
        mode="EXTEND",
        requests=(Request(37, 5), Request(16, 9), Request(0, 3)),
        page_size=16,
        kv_layout="HND",
        seed=4,
    )
    b, batch, inputs, _ = run("flashinfer_paged", case)
    ranges = [(16, 42), (0, 25), (0, 3)]
    table = b.page_table(batch, ranges)
    assert table.indptr.tolist() == [0, 2, 4, 5]
    assert table.last_page_len.tolist() == [10, 9, 3] and table.kv_lens.tolist() == [26, 25, 3]
    for r, (lo, hi) in enumerate(ranges):
        pages = table.indices[table.indptr[r] : table.indptr[r + 1]].tolist()
        keys = fake._gather_pages(batch.pool.k, pages, hi - lo, "HND")  # as FlashInfer reads them
        assert torch.equal(keys, inputs.k[r][lo:hi])


def test_an_empty_range_reads_zero_keys_in_both_of_flashinfers_length_formulas():
    table = paged_kv_table(torch.tensor([3, 5, 6]), [1, 0, 2], [4, 0, 17], 16)
    assert table.indptr.tolist() == [0, 1, 1, 3] and table.last_page_len.tolist() == [4, 16, 1]
    pages = (table.indptr[1:] - table.indptr[:-1]).tolist()
    last = table.last_page_len.tolist()
    kernel = [0 if n == 0 else (n - 1) * 16 + last[i] for i, n in enumerate(pages)]  # page.cuh get_length
    mask_rows = [(n - 1) * 16 + last[i] for i, n in enumerate(pages)]  # _compute_page_mask_indptr
    assert kernel == mask_rows == table.kv_lens.tolist() == [4, 0, 17]
    with pytest.raises(ValueError, match="cannot hold"):
        paged_kv_table(torch.tensor([3]), [1], [17], 16)
    with pytest.raises(ValueError, match="2 page ids for 1 pages"):
        paged_kv_table(torch.tensor([3, 4]), [1], [16], 16)


def test_prefix_pass_reads_from_the_first_querys_window_and_masks_by_global_position(fi):
    w = 7
    case = Case(
        mode="EXTEND", requests=(Request(40, 30), Request(3, 20), Request(0, 4)), window_left=w, page_size=16
    )
    run("flashinfer_ragged", case)
    (ragged,) = fi.calls("ragged.plan")
    (paged,) = fi.calls("paged.plan")
    assert ragged["causal"] and ragged["window_left"] == w
    assert not paged["causal"] and paged["window_left"] == -1
    # request 0: first query at 40 sees keys from 33, whose page starts at 32; request 1 from 0.
    assert paged["paged_kv_indptr"].tolist() == [0, 1, 2, 2]
    assert paged["seq_lens"].tolist() == [8, 3, 0]
    expected = []
    for (p, e), lo in zip(((40, 30), (3, 20), (0, 4)), (32, 0, 0)):
        for j in range(e):
            expected += [k >= p + j - w for k in range(lo, p)]
    assert paged["custom_mask"].tolist() == expected
    assert len(fi.calls("merge_state")) == 1


def test_prefix_pass_without_a_window_reads_the_whole_prefix_unmasked(fi):
    run("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(40, 3), Request(0, 2)), page_size=16))
    (paged,) = fi.calls("paged.plan")
    assert (
        paged["custom_mask"] is None and paged["window_left"] == -1 and paged["seq_lens"].tolist() == [40, 0]
    )


def test_no_prefix_means_no_paged_pass_and_no_merge(fi):
    run("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(0, 30), Request(0, 3)), window_left=4))
    assert not fi.calls("paged.plan") and not fi.calls("merge_state")


def test_lse_is_converted_from_base_2_to_natural_log(fi):
    b = glue.FlashInferGlue()
    lse = b.natural_lse(torch.tensor([1.0, 3.0, -math.inf]))
    assert torch.allclose(lse[:2], torch.tensor([math.log(2.0), 3 * math.log(2.0)])) and lse[2] == -math.inf
    case = Case(mode="EXTEND", requests=(Request(20, 6),), window_left=5)
    _, _, _, out = run("flashinfer_ragged", case)
    from references.torch_ref import reference

    ref = reference(case, make_inputs(case)).lse
    assert (out.lse.double() - ref).abs().max() < 1e-3


SPLIT_CASES = [
    (
        "flashinfer_ragged",
        Case(mode="EXTEND", requests=(Request(40, 30), Request(3, 20)), window_left=7, deterministic=True),
    ),
    ("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(40, 3),), deterministic=True)),
    (
        "flashinfer_paged",
        Case(
            mode="EXTEND", requests=(Request(40, 3),), window_left=7, hybrid_swa_pool=True, deterministic=True
        ),
    ),
    (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY",
            requests=(Request(9, 3, tree=(-1, 0, 0)),),
            window_left=2,
            deterministic=True,
        ),
    ),
    (
        "flashinfer_paged",
        Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3),), sinks=True, deterministic=True),
    ),
    ("flashinfer_dec_tc", Case(mode="DECODE", requests=(Request(40, 1),), window_left=7, deterministic=True)),
    ("flashinfer_dec_tc", Case(mode="DRAFT_EXTEND_V2", requests=(Request(40, 3),), deterministic=True)),
    ("flashinfer_enc", Case(mode="CROSS", requests=(Request(0, 5, 30),), deterministic=True)),
    ("flashinfer_enc", Case(mode="CROSS", requests=(Request(3, 1, 30),), deterministic=True)),
]


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
@pytest.mark.parametrize(
    "name,case", SPLIT_CASES, ids=[f"{n}-{c.mode}-{i}" for i, (n, c) in enumerate(SPLIT_CASES)]
)
def test_split_parameters_reach_plan_on_every_path_in_deterministic_mode(fi, name, case, deterministic):
    case = case.replace(deterministic=deterministic)
    b = backends.load(name)
    if deterministic and {"EXTEND", "cross_prefill"} & case_traits(case):
        # Refused (fa2's query tile follows the batch), yet the plan still gets the split
        # parameters, as an engine's deterministic mode passes them: run past the refusal.
        assert b.supports(case) == glue.PREFILL_NOT_INVARIANT
        b.supports = lambda c: None
    run(b, case)
    plans = [(w, a) for w, a in fake.CALLS if w.endswith(".plan")]
    assert plans
    for what, args in plans:
        pages = 1 if what == "ragged.plan" else case.page_size
        split = (4096 if name in ("flashinfer_ragged", "flashinfer_paged") else 2048) // pages
        assert args["fixed_split_size"] == (split if deterministic else None), what
        assert args["disable_split_kv"] is False


@pytest.mark.parametrize(
    "name,on_path,off_path",
    [
        (
            "flashinfer_dec_tc~split_dropped_swa",
            Case(mode="DECODE", requests=(Request(40, 1),), window_left=7, deterministic=True),
            Case(mode="DECODE", requests=(Request(40, 1),), deterministic=True),
        ),
        (
            "flashinfer_enc~split_dropped_cross",
            Case(mode="CROSS", requests=(Request(3, 1, 30),), deterministic=True),
            None,
        ),
    ],
)
def test_split_mutants_drop_the_parameters_on_their_path_only(fi, name, on_path, off_path):
    run(by_name(name).make(), on_path)
    assert fi.calls("decode.plan")[-1]["fixed_split_size"] is None
    if off_path is not None:
        run(by_name(name).make(), off_path)
        assert fi.calls("decode.plan")[-1]["fixed_split_size"] == 2048 // 16


def test_every_option_goes_to_plan_and_nothing_to_run(fi):
    case = Case(
        mode="EXTEND", requests=(Request(40, 30),), window_left=7, soft_cap=5.0, sm_scale=0.3, dtype="float16"
    )
    for name in ("flashinfer_ragged", "flashinfer_paged"):
        run(name, case)
    run(
        "flashinfer_dec_cc",
        Case(mode="DECODE", requests=(Request(40, 1),), window_left=7, soft_cap=5.0, sm_scale=0.3),
    )
    wrappers = ("ragged", "paged", "decode")
    assert {w for w, _ in fake.CALLS} >= {f"{x}.{step}" for x in wrappers for step in ("init", "plan", "run")}
    for what, args in fake.CALLS:
        if what.endswith(".plan"):
            assert args["sm_scale"] == 0.3 and args["logits_soft_cap"] == 5.0, what
            assert args["window_left"] in (7, -1), what
            assert args["q_data_type"] == args["kv_data_type"], what
        if what.endswith(".run"):
            assert args.get("window_left") is None and "logits_soft_cap" not in args, what
        if what.endswith(".init"):
            assert args["backend"] == glue.KERNEL_BACKEND, what


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_an_fp8_cache_is_planned_as_fp8_and_run_with_its_scales_on_every_paged_path(fi, kv_dtype):
    fp8 = dict(kv_dtype=kv_dtype, k_scale=0.0173, v_scale=3.7)
    run("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(40, 30),), window_left=7, **fp8))
    run(
        "flashinfer_paged", Case(mode="EXTEND", requests=(Request(9, 6),), sinks=True, **fp8)
    )  # the sink variant
    run("flashinfer_dec_cc", Case(mode="DECODE", requests=(Request(40, 1),), **fp8))
    run("flashinfer_dec_tc", Case(mode="DRAFT_EXTEND_V2", requests=(Request(33, 4),), **fp8))
    run("flashinfer_enc", Case(mode="CROSS", requests=(Request(0, 3, 20),), **fp8))
    cache, model = getattr(torch, kv_dtype), torch.bfloat16
    seen = set()
    for what, args in fake.CALLS:
        seen.add(what)
        if what == "ragged.plan":  # the in-flight K/V are the model's
            assert (args["q_data_type"], args["kv_data_type"]) == (model, model)
        elif what.endswith(".plan"):
            assert (args["q_data_type"], args["kv_data_type"]) == (model, cache), what
        if what.endswith(".run") and what != "ragged.run":  # the fake rejects scales on the ragged run
            assert (args["k_scale"], args["v_scale"]) == (0.0173, 3.7), what
        if what == "paged.init" and "kv_data_type" in args:  # the sink variant's JIT module
            assert args["kv_data_type"] == cache
    assert {"ragged.run", "paged.run", "decode.run", "merge_state"} <= seen


def test_a_cache_in_the_model_dtype_is_run_without_scales(fi):
    run("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(40, 30),), window_left=7))
    run("flashinfer_dec_tc", Case(mode="DECODE", requests=(Request(40, 1),)))
    runs = [args for what, args in fake.CALLS if what in ("paged.run", "decode.run")]
    assert runs and all(a["k_scale"] is None and a["v_scale"] is None for a in runs)


def test_the_options_at_run_mutant_plans_without_them(fi):
    case = Case(mode="EXTEND", requests=(Request(4, 6),), window_left=2, soft_cap=5.0)
    run(by_name("flashinfer_paged~options_at_run").make(), case)
    (plan,) = fi.calls("paged.plan")
    assert plan["window_left"] == -1 and plan["logits_soft_cap"] == 0.0


def test_hybrid_pool_is_read_through_translated_page_ids(fi):
    case = Case(
        mode="TARGET_VERIFY",
        requests=(Request(50, 5, tree=(-1, 0, 0, 1, 2)),),
        window_left=9,
        hybrid_swa_pool=True,
    )
    _, batch, _, _ = run("flashinfer_paged", case)
    (plan,) = fi.calls("paged.plan")
    swa_pages = batch.pool.num_pages  # default storage: as large as the full pool; owned pages first
    owned = {int(s) // 16 for s in batch.full_to_swa.unique().tolist() if s}
    ids = set(plan["paged_kv_indices"].tolist())
    assert ids and ids <= owned and 0 not in ids and max(ids) < swa_pages
    fake.reset()
    run(by_name("flashinfer_paged~swa_untranslated").make(), case)
    (plan,) = fi.calls("paged.plan")
    assert not set(plan["paged_kv_indices"].tolist()) & owned


def test_verify_mask_is_the_tree_with_the_window_by_depth(fi):
    tree = (-1, 0, 0, 1, 3)  # depths 0 1 1 2 3
    case = Case(mode="TARGET_VERIFY", requests=(Request(20, 5, tree=tree),), window_left=2, page_size=16)
    run("flashinfer_paged", case)
    (plan,) = fi.calls("paged.plan")
    assert plan["window_left"] == -1 and plan["causal"]
    mask = plan["custom_mask"].view(5, -1)  # keys 16..24: prefix 16..19, drafts 20..24
    depth = [0, 1, 1, 2, 3]
    anc = [{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 3, 4}]
    for j in range(5):
        want = [k >= 20 + depth[j] - 2 for k in range(16, 20)]
        want += [i in anc[j] and depth[i] >= depth[j] - 2 for i in range(5)]
        assert mask[j].tolist() == want, j


def test_sinks_go_through_the_sink_variant_as_its_extra_tensor(fi):
    case = Case(mode="EXTEND", requests=(Request(9, 6),), window_left=3, sinks=True)
    _, batch, _, _ = run("flashinfer_paged", case)
    (init,) = fi.calls("paged.init")
    assert init["window_left"] == 3 and init["head_dim_qk"] == case.head_dim
    (call,) = fi.calls("paged.run")
    assert call["args"][0] is batch.sinks and call["sinks"] is None


@pytest.mark.parametrize(
    "name,case,words",
    [
        (
            "flashinfer_paged",
            Case(mode="EXTEND", requests=(Request(3, 4),), sinks=True, soft_cap=5.0),
            "no soft cap",
        ),
        (
            "flashinfer_paged",
            Case(mode="TARGET_VERIFY", requests=(Request(3, 2, tree=(-1, 0)),), sinks=True),
            "custom masks",
        ),
        ("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(3, 4),), sinks=True), "no sink variant"),
        ("flashinfer_dec_tc", Case(mode="DECODE", requests=(Request(3, 1),), sinks=True), "drop them"),
        (
            "flashinfer_dec_tc",
            Case(mode="TARGET_VERIFY", requests=(Request(3, 3, tree=(-1, 0, 0)),)),
            "custom mask",
        ),
        (
            "flashinfer_dec_cc",
            Case(mode="DECODE", requests=(Request(3, 1),), deterministic=True),
            "fixed_split_size",
        ),
        (
            "flashinfer_dec_cc",
            Case(mode="DECODE", requests=(Request(3, 1),), num_q_heads=10, num_kv_heads=2),
            "group size 5",
        ),
        (
            "flashinfer_dec_cc",
            Case(mode="DRAFT_EXTEND_V2", requests=(Request(3, 2),)),
            "one query per request",
        ),
        ("flashinfer_enc", Case(mode="CROSS", requests=(Request(0, 2, 3),), sinks=True), "not wired"),
        ("flashinfer_paged", Case(mode="EXTEND", requests=(Request(3, 4),), head_dim=32), "head_dim 32"),
    ],
)
def test_unsupported_cases_are_skips_with_the_reason(name, case, words):
    why = backends.load(name).supports(case)
    assert why and words in why, why


def test_without_flashinfer_the_reason_says_so_and_a_release_outside_the_range_is_broken(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    assert glue.why_unavailable() == "flashinfer is not installed here"
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    assert glue.why_unavailable() is None
    monkeypatch.setattr(fake, "__version__", "0.6.0")
    with pytest.raises(backends.BackendBroken, match=r"0.6.0 is installed; this glue supports flashinfer"):
        glue.why_unavailable()
    for name in NAMES:
        assert backends.load(name).available("cpu") == f"{name} does not run on cpu"
        with pytest.raises(backends.BackendBroken, match="flashinfer 0.6.0 is installed"):
            fake.on_cpu(backends.load(name)).available("cpu")


def test_the_ln_merge_mutant_is_a_correct_merge_fed_the_wrong_base(fi):
    g = torch.Generator().manual_seed(0)
    o_a, o_b = (torch.randn(5, 4, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    s_a, s_b = torch.randn(5, 4, generator=g) * 3, torch.randn(5, 4, generator=g) * 3
    right, s2 = fake.merge_state(o_a, s_a, o_b, s_b)
    mutant = by_name("flashinfer_ragged~lse_merged_as_ln").make()
    ln2 = math.log(2.0)
    as_ln, s_ln = mutant.merge(o_a, s_a * ln2, o_b, s_b * ln2)
    assert torch.allclose(as_ln.float(), right.float(), atol=1e-2) and torch.allclose(
        s_ln, s2 * ln2, atol=1e-5
    )
    wrong, _ = mutant.merge(o_a, s_a, o_b, s_b)
    assert (wrong.float() - right.float()).abs().max() > 0.1


H = dict(head_dim=64)
E4M3 = dict(kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)
E5M2 = dict(kv_dtype="float8_e5m2", k_scale=0.5, v_scale=0.0173)


CASES = [
    (
        "flashinfer_ragged",
        Case(mode="EXTEND", requests=(Request(40, 30), Request(3, 20), Request(0, 5)), window_left=7, **H),
    ),
    ("flashinfer_ragged", Case(mode="EXTEND", requests=(Request(64, 3),), window_left=0, **H)),
    (
        "flashinfer_ragged",
        Case(mode="EXTEND", requests=(Request(0, 30),), window_left=3, soft_cap=5.0, q_amplitude=8.0, **H),
    ),
    (
        "flashinfer_ragged",
        Case(
            mode="EXTEND",
            requests=(Request(70, 30), Request(33, 20)),
            window_left=9,
            hybrid_swa_pool=True,
            kv_layout="HND",
            **H,
        ),
    ),
    (
        "flashinfer_paged",
        Case(mode="EXTEND", requests=(Request(40, 30), Request(3, 20)), window_left=7, sinks=True, **H),
    ),
    (
        "flashinfer_paged",
        Case(mode="DRAFT_EXTEND_V2", requests=(Request(33, 4), Request(16, 4)), page_size=1, **H),
    ),
    (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY",
            requests=(Request(50, 5, tree=(-1, 0, 0, 1, 2)),),
            window_left=9,
            hybrid_swa_pool=True,
            **H,
        ),
    ),
    (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY",
            requests=(Request(50, 5, tree=(-1, 0, 0, 1, 2)), Request(7, 5, tree=(-1, 0, 1, 1, 0))),
            window_left=2,
            kv_layout="HND",
            **H,
        ),
    ),
    (
        "flashinfer_dec_cc",
        Case(mode="DECODE", requests=(Request(50, 1), Request(3, 1)), window_left=9, soft_cap=30.0, **H),
    ),
    (
        "flashinfer_dec_tc",
        Case(
            mode="DECODE",
            requests=(Request(50, 1), Request(3, 1)),
            window_left=9,
            hybrid_swa_pool=True,
            deterministic=True,
            **H,
        ),
    ),
    (
        "flashinfer_dec_tc",
        Case(mode="TARGET_VERIFY", requests=(Request(50, 4, tree=(-1, 0, 1, 2)),), window_left=2, **H),
    ),
    (
        "flashinfer_dec_tc",
        Case(
            mode="DRAFT_EXTEND_V2",
            requests=(Request(33, 4), Request(16, 4)),
            window_left=5,
            page_size=32,
            **H,
        ),
    ),
    (
        "flashinfer_enc",
        Case(mode="CROSS", requests=(Request(0, 5, 30), Request(0, 3, 17)), soft_cap=5.0, **H),
    ),
    (
        "flashinfer_enc",
        Case(mode="CROSS", requests=(Request(9, 1, 30), Request(4, 1, 17)), deterministic=True, **H),
    ),
    (
        "flashinfer_ragged",
        Case(mode="ENCODER_ONLY", requests=(Request(0, 30), Request(0, 7), Request(0, 1)), **H),
    ),
    (
        "flashinfer_ragged",
        Case(
            mode="ENCODER_ONLY",
            requests=(Request(0, 40), Request(0, 9)),
            window_left=5,
            hybrid_swa_pool=True,
            kv_layout="HND",
            **H,
        ),
    ),
    (
        "flashinfer_paged",
        Case(
            mode="ENCODER_ONLY", requests=(Request(0, 33), Request(0, 16)), window_left=4, soft_cap=5.0, **H
        ),
    ),
    (
        "flashinfer_paged",
        Case(mode="ENCODER_ONLY", requests=(Request(0, 20), Request(0, 3)), sinks=True, page_size=1, **H),
    ),
    (
        "flashinfer_ragged",
        Case(
            mode="EXTEND",
            requests=(Request(70, 30), Request(33, 20)),
            window_left=9,
            hybrid_swa_pool=True,
            **H,
            **E4M3,
        ),
    ),
    (
        "flashinfer_paged",
        Case(mode="EXTEND", requests=(Request(40, 30), Request(3, 20)), sinks=True, **H, **E5M2),
    ),
    (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY",
            requests=(Request(50, 5, tree=(-1, 0, 0, 1, 2)),),
            window_left=9,
            **H,
            **E4M3,
        ),
    ),
    (
        "flashinfer_dec_cc",
        Case(mode="DECODE", requests=(Request(50, 1), Request(3, 1)), soft_cap=30.0, **H, **E5M2),
    ),
    (
        "flashinfer_dec_tc",
        Case(mode="DRAFT_EXTEND_V2", requests=(Request(33, 4), Request(16, 4)), kv_layout="HND", **H, **E4M3),
    ),
    ("flashinfer_enc", Case(mode="CROSS", requests=(Request(0, 5, 30), Request(9, 3, 17)), **H, **E5M2)),
]


@pytest.mark.parametrize("release", ["0.7.2.post1", "0.6.18.post1"])
@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{c.mode}-{i}" for i, (n, c) in enumerate(CASES)])
def test_adapter_passes_under_the_fake(fi, monkeypatch, name, case, release):
    """On both tested releases: the fake posing as 0.6.18.post1 refuses the keywords 0.6 lacks."""
    fake.install(monkeypatch, release)
    res = check_case(fake.on_cpu(backends.load(name)), case, "cpu")
    assert res.status == "pass", res.failure_text()
    assert res.verdict.lse_err is not None or case.sinks  # LSE checked wherever there are no sinks


def test_encoder_prefill_is_planned_non_causal_with_the_left_window(fi):
    """ENCODER_ONLY as an engine plans it: causal=False, window_left on a windowed layer; the ragged
    path has no cached prefix to read or merge; the paged path writes the K/V to the pool first."""
    c = Case(mode="ENCODER_ONLY", requests=(Request(0, 30), Request(0, 7)), window_left=5, **H)
    assert check_case(fake.on_cpu(backends.load("flashinfer_ragged")), c, "cpu").status == "pass"
    (plan,) = fake.calls("ragged.plan")
    assert plan["causal"] is False and plan["window_left"] == 5
    assert not fake.calls("paged.plan") and not fake.calls("merge_state")
    fake.reset()
    paged = fake.on_cpu(backends.load("flashinfer_paged"))
    assert check_case(paged, c.replace(window_left=-1), "cpu").status == "pass"
    (plan,) = fake.calls("paged.plan")
    assert plan["causal"] is False and plan["window_left"] == -1
    assert plan["seq_lens"].tolist() == [30, 7]


def test_a_two_sided_window_is_a_skip_with_the_reason(fi):
    c = Case(mode="ENCODER_ONLY", requests=(Request(0, 30),), window_left=5, window_right=2, **H)
    for name in ("flashinfer_ragged", "flashinfer_paged"):
        why = backends.load(name).supports(c)
        assert why and "window_left only" in why, (name, why)
        assert backends.load(name).supports(c.replace(window_right=-1)) is None


NUMERIC = [m for m in MUTANTS if m.check == "numeric"]


def _cpu(make):
    return lambda: fake.on_cpu(make())


@pytest.mark.parametrize("mutant", NUMERIC, ids=[m.name.split("~")[1] for m in NUMERIC])
def test_numeric_mutant_is_caught_under_the_fake(fi, mutant):
    profiles.load("ci")
    d = hunt(dataclasses.replace(mutant, device="cpu", make=_cpu(mutant.make)), mutant.families[0])
    assert d.caught, f"{mutant.name} survived {d.examples} examples: {mutant.bug}"
    print(f"{mutant.name}: {d.examples} examples, {d.seconds:.1f}s, shrunk to {d.shrunk.to_json()}")


def test_sink_variants_sharing_flashinfers_module_name_each_run_their_own_kernel(fi):
    """FlashInfer names the AttentionSink module without the KV dtype or head dims (known issue
    flashinfer-sink-module-name; the fake, as the library, runs the first-loaded variant for another
    of the same name). The adapter's wrapper adds them to the name, so a bf16 then an FP8 sink case,
    and a head_dim 64 then 128 one, all pass in one process."""
    from harness.backends.flashinfer_glue import sink_wrapper_class

    first = fake.BatchAttentionWithAttentionSinkWrapper(None, kv_data_type=fake.torch.bfloat16)
    second = fake.BatchAttentionWithAttentionSinkWrapper(None, kv_data_type=fake.torch.float8_e4m3fn)
    assert not first._wrong_module and second._wrong_module  # the library's collision, modelled
    fake.reset()
    backend = fake.on_cpu(backends.load("flashinfer_paged"))
    bf16 = Case(mode="EXTEND", requests=(Request(3, 1), Request(0, 2)), sinks=True, **H)
    for case in (bf16, bf16.replace(**E4M3), bf16.replace(**E5M2), bf16.replace(head_dim=128)):
        res = check_case(backend, case, "cpu")
        assert res.status == "pass", (case.kv_dtype, case.head_dim, res.reason)
    assert len(fake.MODULES) == 4 and all("_kv_" in name for name in fake.MODULES)
    assert issubclass(sink_wrapper_class(fake), fake.BatchAttentionWithAttentionSinkWrapper)


PROBES = [p for p in module_probes() if p.backend]


def test_the_gpu_profile_variants_are_all_probed():
    labels = {p.label for p in module_probes()}
    tag = ",".join(map(str, GPU_VARIANT))
    for swa in (False, True):
        assert f"sink[{tag},swa={swa}]" in labels
        for cap in (False, True):
            assert {f"prefill[{tag},swa={swa},cap={cap}]", f"decode_cc[{tag},swa={swa},cap={cap}]"} <= labels
    assert {"cascade", "packbits"} <= labels
    for kv in ("float8_e4m3fn", "float8_e5m2"):  # an FP8 cache: the same variants over FP8 K/V
        fp8 = f"{tag},kv={kv}"
        assert {f"sink[{fp8},swa=True]", f"prefill[{fp8},swa=True,cap=True]"} <= labels
        assert f"decode_cc[{fp8},swa=False,cap=True]" in labels


def test_pinned_cases_get_probes_for_their_own_dtype_and_head_dim():
    pins = pinned_cases()
    assert pins, "harness/search/pinned.py pins cases that the FlashInfer adapters run"
    for _, case in pins:
        assert any(p.case.head_dim == case.head_dim and p.case.dtype == case.dtype for p in PROBES), case


@pytest.mark.parametrize("probe", PROBES, ids=[p.label for p in PROBES])
def test_each_probe_runs_and_needs_one_module(monkeypatch, probe):
    fake.install(monkeypatch)
    backend = fake.on_cpu(backends.load(probe.backend))
    assert backend.supports(probe.case) is None
    backend.run(build_batch(probe.case, make_inputs(probe.case), "cpu"))
    inits = [(w, a) for w, a in fake.CALLS if w.endswith(".init")]
    plans = [(w, a) for w, a in fake.CALLS if w.endswith(".plan")]
    assert len(inits) == len(plans) == 1 and not fake.calls("merge_state"), fake.CALLS
    (what, args), (_, plan) = inits[0], plans[0]
    assert plan.get("custom_mask") is None  # no mask: the mask packer is a module of its own
    if probe.label.startswith("decode_cc"):
        assert what == "decode.init" and not args["use_tensor_cores"]
    elif probe.label.startswith("sink"):
        assert "head_dim_qk" in args  # the AttentionSink wrapper
    else:
        assert what == "paged.init" and "head_dim_qk" not in args
    assert plan["kv_data_type"] == getattr(torch, probe.case.kv_dtype or probe.case.dtype)


def test_coverage_runs_only_supported_cases_and_every_mode():
    cases = coverage_cases()
    assert all(backends.load(n).supports(c) is None for n, c in cases)
    assert {(n, str(c.mode)) for n, c in cases} >= {
        ("flashinfer_ragged", "EXTEND"),
        ("flashinfer_paged", "TARGET_VERIFY"),
        ("flashinfer_dec_cc", "DECODE"),
        ("flashinfer_dec_tc", "DRAFT_EXTEND_V2"),
        ("flashinfer_enc", "CROSS"),
    }


def test_the_plan_writes_each_modules_build_file_and_leaves_prebuilt_ones(monkeypatch, tmp_path):
    """ninja_plan (run in the warm-up's worker): each module found gets its build.ninja written and
    its paths resolved (its outputs are resolved paths); a prebuilt one is left to FlashInfer; a
    module that ninja does not build is an error naming it."""
    written: list[str] = []
    jit = tmp_path / "jit"
    (tmp_path / "link").symlink_to(tmp_path)

    def spec(name, is_aot=False):  # FlashInfer's JitSpecNvcc, as far as the plan reads it
        build_dir = tmp_path / "link" / "jit" / name
        return SimpleNamespace(
            name=name,
            is_aot=is_aot,
            write_ninja=lambda: written.append(name),
            ninja_path=build_dir / "build.ninja",
            build_dir=build_dir,
            jit_library_path=build_dir / f"{name}.so",
        )

    specs = {"b": spec("b"), "a": spec("a"), "pre": spec("pre", is_aot=True)}
    monkeypatch.setattr(flashinfer_warmup, "discover_specs", lambda probes: specs)
    monkeypatch.setitem(sys.modules, "flashinfer", ModuleType("flashinfer"))
    jit_env = SimpleNamespace(FLASHINFER_JIT_DIR=tmp_path / "link" / "jit")
    monkeypatch.setitem(sys.modules, "flashinfer.jit", SimpleNamespace(env=jit_env))
    plan = flashinfer_warmup.ninja_plan([])
    assert written == ["a", "b"] and plan.prebuilt == ("pre",)
    a = jit.resolve() / "a"
    assert plan.root == str(jit.resolve())
    assert plan.modules[0] == Module("a", str(a / "build.ninja"), str(a), str(a / "a.so"))
    specs["cute"] = SimpleNamespace(name="cute")
    with pytest.raises(TypeError, match="module cute is a SimpleNamespace, not built by ninja"):
        flashinfer_warmup.ninja_plan([])
