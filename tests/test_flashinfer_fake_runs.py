"""The FlashInfer adapters end to end on the CPU, with the computing fake standing in for the kernels.

Each adapter must pass the numeric check on the cases that stress its glue (windows binding in
prefix and extend, empty and page-aligned prefixes, the hybrid pool, HND pages, trees, sinks,
cross-attention in both phases), and each numeric mutant must be caught by the suite's search.
This shows the glue is right under FlashInfer's semantics as the fake models them; the GPU run
(tests/test_flashinfer_gpu.py, the suite) shows it against the kernels themselves.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness import backends
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.mutants import hunt
from harness.mutants.flashinfer import MUTANTS
from harness.search import profiles
from tests import flashinfer_fake as fake

H = dict(head_dim=64)
E4M3 = dict(kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)
E5M2 = dict(kv_dtype="float8_e5m2", k_scale=0.5, v_scale=0.0173)


@pytest.fixture(autouse=True)
def fi(monkeypatch):
    fake.install(monkeypatch)


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
def test_adapter_passes_under_the_fake(monkeypatch, name, case, release):
    """On both tested releases: the fake posing as 0.6.18.post1 refuses the keywords 0.6 lacks."""
    fake.install(monkeypatch, release)
    res = check_case(fake.on_cpu(backends.load(name)), case, "cpu")
    assert res.status == "pass", res.failure_text()
    assert res.verdict.lse_err is not None or case.sinks  # LSE checked wherever there are no sinks


def test_encoder_prefill_is_planned_non_causal_with_the_left_window():
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


def test_a_two_sided_window_is_a_skip_with_the_reason():
    c = Case(mode="ENCODER_ONLY", requests=(Request(0, 30),), window_left=5, window_right=2, **H)
    for name in ("flashinfer_ragged", "flashinfer_paged"):
        why = backends.load(name).supports(c)
        assert why and "window_left only" in why, (name, why)
        assert backends.load(name).supports(c.replace(window_right=-1)) is None


NUMERIC = [m for m in MUTANTS if m.check == "numeric"]


def _cpu(make):
    return lambda: fake.on_cpu(make())


@pytest.mark.parametrize("mutant", NUMERIC, ids=[m.name.split("~")[1] for m in NUMERIC])
def test_numeric_mutant_is_caught_under_the_fake(mutant):
    profiles.load("ci")
    d = hunt(dataclasses.replace(mutant, device="cpu", make=_cpu(mutant.make)), mutant.families[0])
    assert d.caught, f"{mutant.name} survived {d.examples} examples: {mutant.bug}"
    print(f"{mutant.name}: {d.examples} examples, {d.seconds:.1f}s, shrunk to {d.shrunk.to_json()}")


def test_sink_variants_sharing_flashinfers_module_name_each_run_their_own_kernel():
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
