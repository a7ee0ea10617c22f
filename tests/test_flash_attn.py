"""fa4, fa3 and fa2 adapters on the CPU, against recording fakes of the libraries.

The fakes (tests/flash_attn_fakes.py) have the real signatures, assert what the real code asserts,
and compute attention with flash-attn's semantics, so the harness's own numeric check runs on the
adapters here. FA3 and FA2 are tested only this way: neither installs on the device machine.
What the GPU shows for FA4 is in tests/test_flash_attn_gpu.py.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import sys
import types

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

from harness.backends import flash_attn_fa4
from harness.backends.flash_attn_fa2 import FA2
from harness.backends.flash_attn_fa3 import FA3
from harness.backends.flash_attn_fa4 import FA4
from harness.checks.numeric import check_case
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.mutants import hunt
from harness.mutants.flash_attn import MUTANTS
from harness.search import profiles
from harness.search.strategies import cases
from tests.flash_attn_fakes import Recorder, fa2_module, fa3_module, fa4_module

FAKE_TREE_MASK = "verify_tree_mask (stand-in for the CuTe DSL function)"


def module(name: str, **attrs) -> types.ModuleType:
    """A module with a spec (importlib.util.find_spec probes it) and no version or file."""
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    return m


@pytest.fixture
def libs(monkeypatch):
    """Install the three fakes as the real module names; yields their recorders by backend name."""
    recs = {"fa4": Recorder(), "fa3": Recorder(), "fa2": Recorder()}
    cute = module("flash_attn.cute", __version__="4.0.0b36", **vars(fa4_module(recs["fa4"])))
    pkg = module("flash_attn", cute=cute, **vars(fa2_module(recs["fa2"])))
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setitem(
        sys.modules, "flash_attn_interface", module("flash_attn_interface", **vars(fa3_module(recs["fa3"])))
    )
    monkeypatch.setattr(flash_attn_fa4, "tree_mask_mod", lambda: FAKE_TREE_MASK)
    return recs


def on_cpu(backend):
    """The adapter, declared runnable on the CPU (its library is a fake here)."""
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}))
    return backend


def run(backend, case, whole_page_loads=None):
    """Build the batch the way check_case does and run the adapter; returns (batch, output)."""
    wpl = backend.capabilities.whole_page_loads if whole_page_loads is None else whole_page_loads
    batch = build_batch(case, make_inputs(case), "cpu", wpl)
    return batch, backend.run(batch)


def case(mode="EXTEND", reqs=((3, 4),), **kw) -> Case:
    return Case(mode=mode, requests=tuple(Request(*r) for r in reqs), head_dim=32, **kw)


CHAIN4 = (-1, 0, 1, 2)
TREE5 = (-1, 0, 0, 1, 2)


# --- availability ---------------------------------------------------------------------------


def test_absent_libraries_are_skip_reasons(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, name, None)  # not installed (import raises ImportError)
    for b in (FA4(), FA3(), FA2()):
        why = on_cpu(b).available("cpu")
        assert why and f"{b.entry[0]} is not installed" in why, (b.name, why)
        if not torch.cuda.is_available():
            assert "no CUDA device" in b.__class__().available("cuda")


def test_fa4_only_install_does_not_pass_for_fa2(monkeypatch):
    """flash-attn-4 alone leaves `flash_attn` a namespace package with no FA2 entry point."""
    monkeypatch.setitem(sys.modules, "flash_attn", module("flash_attn"))
    why = on_cpu(FA2()).available("cpu")
    assert why and "has no flash_attn_varlen_func" in why


def test_with_the_library_present_the_adapters_are_available(libs):
    for b in (FA4(), FA3(), FA2()):
        assert on_cpu(b).available("cpu") is None


# --- the suite's own property search, on the fakes ----------------------------------------------

SUITE = [
    (b, fam, w)
    for b in ("fa4", "fa3", "fa2")
    for fam in FAMILIES
    for w in ((False,) if FAMILY_MODE[fam] == Mode.CROSS else (False, True))
]
FACTORY = {"fa4": FA4, "fa3": FA3, "fa2": FA2}


@pytest.mark.parametrize(
    "name,family,windowed", SUITE, ids=[f"{b}-{f}-{'w' if w else 'full'}" for b, f, w in SUITE]
)
def test_adapter_passes_the_suite_on_the_fake(libs, name, family, windowed):
    backend = on_cpu(FACTORY[name]())
    strategy = cases(family, windowed, backend.capabilities, profiles.SIZES["ci"])

    @settings(
        max_examples=5,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(strategy)
    def check(c):
        res = check_case(backend, c, "cpu")
        assume(res.status != "skip")
        assert res.status == "pass", res.failure_text()

    check()
    assert libs[name].calls, "the fake library was never called"


# --- the arguments, call by call ----------------------------------------------------------------


def test_fa4_extend_arguments(libs):
    c = case(reqs=((30, 1), (0, 20)), num_q_heads=8, num_kv_heads=2)
    batch, out = run(on_cpu(FA4()), c)
    a = libs["fa4"].last
    assert a["seqused_k"].tolist() == [31, 20]
    assert a["max_seqlen_k"] == 31  # max_i(P_i + E_i), not max(P) + max(E) = 50
    assert a["max_seqlen_q"] == 20 and a["cu_seqlens_q"].tolist() == [0, 1, 21]
    assert a["causal"] is True and a["window_size"] == (None, None)
    assert a["num_splits"] == 1 and a["return_lse"] is True and a["mask_mod"] is None
    assert a["page_table"].dtype == torch.int32
    assert a["k"] is batch.pool.k and a["v"] is batch.pool.v  # NHD pool passed as is
    assert out.lse.shape == (21, 8)  # [total_q, Hq], from FA4's [Hq, total_q]


def test_fa4_window_soft_cap_sinks_and_determinism(libs):
    c = case(reqs=((40, 6),), window_left=7, soft_cap=30.0, sinks=True, deterministic=True)
    batch, _ = run(on_cpu(FA4()), c)
    a = libs["fa4"].last
    assert a["window_size"] == (7, 0) and a["causal"] is True
    assert a["softcap"] == 30.0
    assert torch.equal(a["learnable_sink"], batch.sinks)
    assert a["deterministic"] is True and a["num_splits"] == 1


def test_fa4_draft_extend_v2_reads_the_bumped_extent(libs):
    c = case("DRAFT_EXTEND_V2", reqs=((33, 4), (16, 4)))
    run(on_cpu(FA4()), c)
    a = libs["fa4"].last
    assert a["seqused_k"].tolist() == [37, 20] and a["max_seqlen_k"] == 37


def test_fa4_cross_reads_the_encoder_without_mask(libs):
    c = case("CROSS", reqs=((0, 5, 9), (0, 2, 30)))
    batch, _ = run(on_cpu(FA4()), c)
    a = libs["fa4"].last
    assert a["causal"] is False and a["window_size"] == (None, None)
    assert a["seqused_k"].tolist() == [9, 30]
    ps = c.page_size
    assert a["page_table"][1, 0] == batch.req_to_token[1, 0] // ps  # encoder keys lead the row


@pytest.mark.parametrize(
    "left,right,fa4,minus_one",
    [(-1, -1, (None, None), (-1, -1)), (7, -1, (7, None), (7, -1)), (7, 3, (7, 3), (7, 3))],
)
def test_encoder_is_non_causal_with_each_window_edge(libs, left, right, fa4, minus_one):
    """ENCODER_ONLY: causal=False, window_size=(left, right) in each version's spelling of "none";
    the KV extent is the request's own length."""
    c = case("ENCODER_ONLY", reqs=((0, 20), (0, 5)), window_left=left, window_right=right)
    for backend, name, expect in ((FA4(), "fa4", fa4), (FA3(), "fa3", minus_one), (FA2(), "fa2", minus_one)):
        run(on_cpu(backend), c)
        a = libs[name].last
        assert a["causal"] is False and a["window_size"] == expect, (name, a["window_size"])
    assert libs["fa4"].last["seqused_k"].tolist() == [20, 5]
    assert libs["fa3"].last["cache_seqlens"].tolist() == [20, 5]
    assert libs["fa2"].last["cu_seqlens_k"].tolist() == [0, 20, 25]


def test_fa4_fake_leaves_a_left_window_unbounded_on_the_right(libs):
    """FA4's local window has only its own edges: (W, None) with causal=False keeps every key after
    the query (the fake once applied the causal edge to every local window)."""
    c = case("ENCODER_ONLY", reqs=((0, 30),), window_left=4)
    assert check_case(on_cpu(FA4()), c, "cpu").status == "pass"
    assert check_case(on_cpu(FA4()), c.replace(window_left=40), "cpu").status == "pass"


def test_fa4_page_table_is_translated_on_the_hybrid_pool(libs):
    c = case(reqs=((70, 5), (20, 3)), window_left=9, hybrid_swa_pool=True, page_size=16)
    batch, _ = run(on_cpu(FA4()), c)
    pt = libs["fa4"].last["page_table"]
    ps = c.page_size
    expect = batch.full_to_swa[batch.req_to_token[:, ::ps].long()] // ps
    assert torch.equal(pt[:, : expect.shape[1]], expect.int())
    assert int(pt.max()) * ps < batch.pool.num_slots and (pt > 0).any()
    assert not torch.equal(pt[:, : expect.shape[1]], (batch.req_to_token[:, ::ps] // ps).int())


def test_fa4_tree_uses_the_mask_mod_with_window_by_depth(libs):
    c = case("TARGET_VERIFY", reqs=((10, 5, 0, TREE5),), window_left=1, hybrid_swa_pool=True)
    batch, _ = run(on_cpu(FA4()), c)
    a = libs["fa4"].last
    assert a["mask_mod"] == FAKE_TREE_MASK and a["causal"] is False and a["window_size"] == (None, None)
    first, see = (t.tolist() for t in a["aux_tensors"])
    # depths 0,1,1,2,2 -> positions 10,11,11,12,12; window 1 keeps keys p - 1 .. p
    assert first == [9, 10, 10, 11, 11]
    assert see == [
        1, 0, 0, 0, 0,  # draft 0: itself
        1, 1, 0, 0, 0,  # draft 1 (parent 0)
        1, 0, 1, 0, 0,  # draft 2 (parent 0)
        0, 1, 0, 1, 0,  # draft 3 (parent 1; draft 0 at depth 0 is out of the window at depth 2)
        0, 0, 1, 0, 1,  # draft 4 (parent 2; likewise)
    ]  # fmt: skip
    expect = batch.full_to_swa[batch.req_to_token[:, :: c.page_size].long()] // c.page_size
    assert torch.equal(a["page_table"][:, : expect.shape[1]], expect.int())


def test_fa4_chain_verify_stays_causal(libs):
    run(on_cpu(FA4()), case("TARGET_VERIFY", reqs=((10, 4, 0, CHAIN4),)))
    a = libs["fa4"].last
    assert a["mask_mod"] is None and a["causal"] is True and a["seqused_k"].tolist() == [14]


def test_fa4_whole_page_loads_need_the_canary(libs):
    """With pages of 128 keys FA4 loads whole pages: NaN in the tail rows would spread (0 * NaN)."""
    c = case(reqs=((100, 9),), page_size=128)
    fa4 = on_cpu(FA4())
    _, out = run(fa4, c, whole_page_loads=False)
    assert torch.isnan(out.out).any()
    assert check_case(fa4, c, "cpu").status == "pass"


def test_fa3_arguments(libs):
    c = case(reqs=((30, 1), (0, 20)), window_left=5, soft_cap=5.0)
    run(on_cpu(FA3()), c)
    a = libs["fa3"].last
    assert a["cache_seqlens"].tolist() == [31, 20] and a["max_seqlen_q"] == 20
    assert a["window_size"] == (5, 0) and a["causal"] is True and a["softcap"] == 5.0
    assert a["num_splits"] == 0 and a["return_softmax_lse"] is True
    run(on_cpu(FA3()), case(reqs=((3, 2),), deterministic=True))
    assert libs["fa3"].last["window_size"] == (-1, -1) and libs["fa3"].last["num_splits"] == 1


def test_fa3_and_fa2_refuse_trees_and_sinks():
    for b in (FA3(), FA2()):
        assert "topk > 1" in b.supports(case("TARGET_VERIFY", reqs=((10, 5, 0, TREE5),)))
        assert "sink" in b.supports(case(sinks=True))
        assert b.supports(case("TARGET_VERIFY", reqs=((10, 4, 0, CHAIN4),))) is None


def test_every_flash_attn_version_skips_an_fp8_cache_with_the_reason():
    fp8 = case(kv_dtype="float8_e4m3fn", k_scale=0.5)
    reasons = ((FA4(), "q, k and v all in one FP8 dtype"), (FA3(), "q and k must share"), (FA2(), "no FP8"))
    for b, words in reasons:
        why = b.supports(fp8)
        assert why and words in why, why
        assert b.supports(case()) is None


def test_fa2_gathers_from_the_window_start(libs):
    c = case(reqs=((40, 6), (3, 2)), window_left=7, hybrid_swa_pool=True)
    run(on_cpu(FA2()), c)
    a = libs["fa2"].last
    # request 0: first query at 40 sees keys from 33 on: 46 - 33 = 13 keys; request 1: all 5
    assert a["cu_seqlens_k"].tolist() == [0, 13, 18] and a["max_seqlen_k"] == 13
    assert a["block_table"] is None and a["window_size"] == (7, 0) and a["return_attn_probs"] is True


# --- the FA4 mutants, on the fake (the GPU test file hunts them on the real kernel) -------------


def cpu_mutant(m):
    return dataclasses.replace(m, make=lambda: on_cpu(m.make()), device="cpu")


CPU_HUNTS = [(m, f) for m in MUTANTS for f in m.families]


@pytest.mark.parametrize("mutant,family", CPU_HUNTS, ids=[f"{m.name}@{f}" for m, f in CPU_HUNTS])
def test_fa4_mutant_is_caught_on_the_fake(libs, mutant, family):
    profiles.load("ci")
    d = hunt(cpu_mutant(mutant), family)
    assert d.caught, f"{mutant.name} survived {d.examples} examples of {family} on the fake"
    print(f"{mutant.name}@{family} on the fake: caught after {d.examples} examples; {d.reason}")


def _args_of(libs, backend, c):
    batch, _ = run(on_cpu(backend), c)
    return libs["fa4"].last, batch


def _untranslated(a, batch):
    ps = batch.case.page_size
    full = (batch.req_to_token[:, ::ps] // ps).int()
    return torch.equal(a["page_table"][:, : full.shape[1]], full)


MUTANT_ARGS = {
    "fa4~de_v2_prefix_only": (
        case("DRAFT_EXTEND_V2", reqs=((33, 4),)),
        lambda a, b: a["seqused_k"].tolist() == [33],
    ),
    "fa4~de_v2_drafts_twice": (
        case("DRAFT_EXTEND_V2", reqs=((33, 4),)),
        lambda a, b: a["seqused_k"].tolist() == [41] and a["max_seqlen_k"] == 41,
    ),
    "fa4~swa_tree_untranslated": (
        case("TARGET_VERIFY", reqs=((50, 5, 0, TREE5),), window_left=9, hybrid_swa_pool=True),
        _untranslated,
    ),
    "fa4~no_window_as_minus_one": (case(reqs=((30, 4),)), lambda a, b: a["window_size"] == (-1, 0)),
    "fa4~encoder_causal": (case("ENCODER_ONLY", reqs=((0, 9),)), lambda a, b: a["causal"] is True),
    "fa4~encoder_window_as_decoder": (
        case("ENCODER_ONLY", reqs=((0, 9),), window_left=3),
        lambda a, b: a["window_size"] == (3, 0),
    ),
    "fa4~window_sides_swapped": (
        case("ENCODER_ONLY", reqs=((0, 9),), window_left=3),
        lambda a, b: a["window_size"] == (None, 3),
    ),
    "fa4~two_sided_left_only": (
        case("ENCODER_ONLY", reqs=((0, 9),), window_left=3, window_right=1),
        lambda a, b: a["window_size"] == (3, None),
    ),
}


EAGER_MUTANTS = [m for m in MUTANTS if m.check != "graph"]  # the replay ones: tests/test_graph_flash_attn.py


@pytest.mark.parametrize("mutant", EAGER_MUTANTS, ids=[m.name for m in EAGER_MUTANTS])
def test_fa4_mutant_passes_the_wrong_arguments(libs, mutant):
    c, wrong = MUTANT_ARGS[mutant.name]
    assert not wrong(*_args_of(libs, FA4(), c))
    assert wrong(*_args_of(libs, mutant.make(), c)), mutant.name
