"""A backend that casts its queries to an FP8 cache's dtype (`fp8_queries`, as sglang's FA3 backend
does): judged over the rounded queries it is judged fairly, and a kernel wrong beyond that rounding
still fails. The stand-ins are torch_native with the cast in front (eager) and flashinfer_dec_tc
under the FlashInfer fake with the cast inside its captured forward (replay).
The FP8 noise tool (harness/tools/fp8_noise.py) reports the same judgement: its `rule` column is the
harness's own verdict.

A backend that casts only some requests' queries to an FP8 cache's dtype (`fp8_query_rows`
"prefill", as vLLM's FlashInfer on Hopper casts its prefill requests' and keeps its decode requests'
in the model dtype): judged over exactly those rounded rows it passes, and judged as if it rounded
none or every row it fails, as does one that declares the prefill rows but rounds every row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import backends
from harness.backends import load
from harness.backends.base import Capabilities
from harness.backends.engines.sglang.fa3 import FA3
from harness.backends.engines.vllm.gpu import FLASH_ATTN
from harness.backends.flashinfer_dec import FlashInferDecTC
from harness.backends.torch_native import TorchNative
from harness.checks.judged_inputs import judged_inputs, prefill_requests, rounded_queries
from harness.checks.numeric import check_case
from harness.checks.replay import replay_result
from harness.core.batch import make_inputs
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.core.modes import Mode
from harness.run.listing import describe_backend
from harness.tools import fp8_noise
from tests import flashinfer_fake as fake
from tests import helpers

CAST = "the adapter's run() casts batch.q to the cache's dtype (scale 1) before attention"


def cast(q: torch.Tensor, kv_dtype: str, scale: float = 1.0, to: str | None = None) -> torch.Tensor:
    """q / scale rounded to the FP8 dtype `to` (default: the cache's), times scale, in q's dtype."""
    fp8 = getattr(torch, to or kv_dtype)
    return ((q.float() / scale).to(fp8).float() * scale).to(q.dtype)


class RoundingNative(TorchNative):
    """torch_native with the queries cast as FA3's glue casts them; `fp8_queries` left undeclared."""

    name = "rounding_native"
    scale = 1.0  # the query scale it divides by before the cast (the declaration says 1)
    to: str | None = None  # the dtype it casts to (None: the cache's, as declared)

    def run(self, batch):  # noqa: ANN001, ANN201
        if batch.case.kv_dtype is not None:
            batch.q = cast(batch.q, batch.case.kv_dtype, self.scale, self.to)
        return super().run(batch)


def declared(cls: type, **fields) -> TorchNative:  # noqa: ANN003
    """An instance of `cls` declaring fp8_queries (and overriding class attributes `fields`)."""
    backend = cls()
    backend.capabilities = dataclasses.replace(cls.capabilities, fp8_queries=CAST)
    for name, value in fields.items():
        setattr(backend, name, value)
    return backend


class WindowDropped(RoundingNative):
    """Declares the cast and does it, but attends past the window: a glue bug, not precision."""

    def window_left(self, batch):  # noqa: ANN001, ANN201
        return -1


def fp8_case(mode: str, reqs: tuple, seed: int, kv_dtype: str = "float8_e4m3fn", **fields) -> Case:
    """The shape of the H200 failures: bf16, 4/4 heads, head_dim 64, page 16, scales 1."""
    return Case(
        mode=mode,
        requests=tuple(Request(*r) for r in reqs),
        dtype="bfloat16",
        num_q_heads=4,
        num_kv_heads=4,
        head_dim=64,
        page_size=16,
        kv_dtype=kv_dtype,
        seed=seed,
        **fields,
    )


# Drawn by seed, each failing the KV-only budget by the queries' rounding alone (ratios 1.04-2.9).
ROUNDED_FAIL = [
    fp8_case("DECODE", ((1, 1),), 29),  # one request of 1 cached + 1 new token, as on the H200
    fp8_case("DECODE", ((1, 1),), 32),
    fp8_case("DECODE", ((40, 1), (3, 1)), 30),
    fp8_case("EXTEND", ((5, 7), (0, 9)), 28),
    fp8_case("EXTEND", ((5, 7), (0, 9)), 31, kv_dtype="float8_e5m2"),
]


@pytest.mark.parametrize("case", ROUNDED_FAIL, ids=lambda c: f"{c.mode}-{c.kv_dtype}-{c.seed}")
def test_a_backend_that_rounds_its_queries_fails_undeclared_and_passes_declared(case):
    undeclared = check_case(RoundingNative(), case)
    assert undeclared.status == "fail", undeclared.reason
    assert "judged over" not in undeclared.reason
    res = check_case(declared(RoundingNative), case)
    assert res.status == "pass", res.reason
    note = f"judged over the queries rounded to {case.kv_dtype} (the backend declares fp8_queries)"
    assert res.reason.endswith(note)
    assert res.verdict.err > 0  # the kernel's own arithmetic is still measured, not matched by construction


def test_torch_native_itself_is_judged_as_before():
    """A backend that does not declare it is judged over the case's own queries: torch_native passes
    the same cases unchanged, and its references are the case's inputs themselves."""
    for case in ROUNDED_FAIL:
        assert check_case(TorchNative(), case).status == "pass"
        inputs = make_inputs(case)
        assert judged_inputs(TorchNative(), case, inputs) is inputs


def test_a_declared_backend_that_drops_the_window_still_fails():
    case = fp8_case("EXTEND", ((40, 6), (25, 3)), 4, window_left=7)
    assert check_case(declared(RoundingNative), case).status == "pass"
    res = check_case(declared(WindowDropped), case)
    assert res.status == "fail", res.reason
    assert res.verdict.ratio > 10  # far beyond the queries' rounding


@pytest.mark.parametrize(
    "wrong",
    [dict(scale=3.0), dict(to="float8_e5m2")],
    ids=["a query scale of 3", "cast to e5m2 over an e4m3 cache"],
)
def test_a_declared_backend_that_rounds_its_queries_otherwise_still_fails(wrong):
    """Rounded with a scale the declaration does not have, or to a coarser dtype than the cache's: the
    difference from the declared rounding is not the kernel's arithmetic, and fails."""
    e4m3 = [c for c in ROUNDED_FAIL if c.kv_dtype == "float8_e4m3fn"]
    failed = [check_case(declared(RoundingNative, **wrong), c) for c in e4m3]
    assert all(r.status == "fail" for r in failed), [r.reason for r in failed]


def test_rounding_twice_is_rounding_once():
    """The cast is idempotent: a glue that casts twice computes over the same queries (not a bug)."""
    q = make_inputs(ROUNDED_FAIL[0]).q_all
    once = cast(q, "float8_e4m3fn")
    assert torch.equal(cast(once, "float8_e4m3fn"), once) and not torch.equal(once, q)


def test_rounded_queries_keep_what_fp8_cannot_hold():
    """Within the FP8 range each query is the torch cast's; past its largest value (448 in e4m3) it is
    kept: the cast's saturation there is range, not precision, so a backend that clips is judged."""
    case = fp8_case("DECODE", ((3, 1),), 0)
    inputs = make_inputs(case)
    q = inputs.q_all.clone()
    q[0, 0, :3] = torch.tensor([0.3, 440.0, 2000.0])
    rounded = rounded_queries(case, dataclasses.replace(inputs, q_all=q)).q_all
    assert rounded[0, 0, :3].tolist() == [0.3125, 448.0, 2000.0]  # 0.3 -> e4m3 0.3125; 440 -> 448
    assert torch.equal(rounded[1:], cast(q[1:], "float8_e4m3fn"))
    assert torch.equal(inputs.kv_all, rounded_queries(case, inputs).kv_all)  # K/V untouched
    with pytest.raises(ValueError, match="needs a case with an FP8 cache"):
        rounded_queries(case.replace(kv_dtype=None), inputs)


def test_a_declaration_names_its_code_and_needs_an_fp8_cache():
    with pytest.raises(ValueError, match="an FP8 cache in kv_dtypes"):
        Capabilities(modes=frozenset({Mode.DECODE}), fp8_queries=CAST)
    with pytest.raises(ValueError, match="needs the code that casts them"):
        Capabilities(modes=frozenset({Mode.DECODE}), kv_dtypes=frozenset({"float8_e4m3fn"}), fp8_queries=" ")


def test_sglang_fa3_declares_it_from_its_code_and_vllm_flash_attn_does_not():
    """sglang's FlashAttentionBackend casts q in its forward; vLLM's FlashAttentionImpl leaves it to
    the Attention layer (query_quant, with the layer's _q_scale), which its adapter does not run, and
    declares no FP8 cache at all."""
    assert "q = q.to(self.kv_cache_dtype)" in FA3.fp8_queries
    assert FLASH_ATTN.fp8_queries is None and not FLASH_ATTN.kv_dtypes
    lines, _ = describe_backend("sglang_fa3")
    quoted = [line for line in lines if line.startswith("  FP8 queries: ")]
    assert len(quoted) == 1 and "q = q.to(self.kv_cache_dtype)" in quoted[0]
    lines, _ = describe_backend("torch_native")
    assert not any("FP8 queries" in line for line in lines)


# --- the replay check: the cast inside the captured forward ----------------------------------


class RoundingDecode(FlashInferDecTC):
    """flashinfer_dec_tc with the queries cast to the cache's dtype in its eager and captured forward."""

    def run(self, batch):  # noqa: ANN001, ANN201
        if batch.case.kv_dtype is not None:
            batch.q = cast(batch.q, batch.case.kv_dtype)
        return super().run(batch)

    def graph_forward(self, state, static):  # noqa: ANN001, ANN201
        kv_dtype = state.layer.case.kv_dtype
        q = cast(static.q, kv_dtype) if kv_dtype is not None else static.q
        return super().graph_forward(state, dataclasses.replace(static, q=q))


@pytest.fixture
def fi(monkeypatch):
    fake.install(monkeypatch)


def decode(*prefixes: int, seed: int) -> Case:
    fp8 = dict(kv_dtype="float8_e4m3fn", dtype="bfloat16", num_q_heads=4, num_kv_heads=4, head_dim=64)
    return Case(mode="DECODE", requests=tuple(Request(p, 1) for p in prefixes), seed=seed, **fp8)


def test_the_replay_check_judges_a_declared_replay_over_the_rounded_queries(fi):
    g = GraphCase((decode(1, 40, 3, seed=30), decode(1, seed=32), decode(9, 2, seed=29)), 4, 48)
    undeclared = replay_result(fake.on_cpu(RoundingDecode()), g, "cpu")
    assert undeclared.status == "fail", undeclared.reason
    backend = fake.on_cpu(RoundingDecode())
    backend.capabilities = dataclasses.replace(backend.capabilities, fp8_queries=CAST)
    res = replay_result(backend, g, "cpu")
    assert res.status == "pass", res.reason
    assert replay_result(fake.on_cpu(backends.load("flashinfer_dec_tc")), g, "cpu").status == "pass"


def test_the_rule_column_is_the_checks_err_over_budget_and_the_cases_carry_an_fp8_cache():
    fp8 = dict(kv_dtype="float8_e4m3fn", k_scale=0.0173, v_scale=3.7)
    c = helpers.case("EXTEND", ((30, 9),), window_left=6, **fp8)
    row = fp8_noise.measure(c, ("torch_native",))
    got = row["backends"]["torch_native"]
    verdict = check_case(load("torch_native"), c).verdict
    assert got["err"] == verdict.err and got["rule"] == pytest.approx(verdict.ratio)
    assert row["rounded_kv"] > 0 and row["quantization"] > 10 * row["native"]
    drawn = fp8_noise.fp8_cases(4, "ci")
    assert drawn and all(d.kv_dtype is not None for d in drawn)


class PrefillRounding(RoundingNative):
    """torch_native with the queries of the requests vLLM's split counts as prefills cast to the
    cache's dtype (scale 1), the decode requests' left as they are; nothing declared."""

    name = "prefill_rounding_native"

    def run(self, batch):  # noqa: ANN001, ANN201
        case = batch.case
        if case.kv_dtype is not None:
            lens = [r.extend_len for r in case.requests]
            rows = torch.tensor(prefill_requests(lens)).repeat_interleave(torch.tensor(lens))
            rows = rows.to(batch.q.device)[:, None, None]
            batch.q = torch.where(rows, cast(batch.q, case.kv_dtype), batch.q)
        return super(RoundingNative, self).run(batch)


def declaring(cls: type, rows: str | None) -> RoundingNative:
    """An instance of `cls` declaring fp8_queries with fp8_query_rows `rows` (None: no declaration)."""
    backend = cls()
    if rows is not None:
        backend.capabilities = dataclasses.replace(cls.capabilities, fp8_queries=CAST, fp8_query_rows=rows)
    return backend


# Two decodes, then two prefills (vLLM's order after its reorder); drawn by seed, each failing both
# the undeclared and the all-rows judgement (err / budget 1.27-3.40 on the CPU).
MIXED = [fp8_case("EXTEND", ((40, 1), (3, 1), (5, 7), (0, 9)), seed) for seed in (0, 3, 4, 5, 6)]


@pytest.mark.parametrize("case", MIXED, ids=lambda c: f"seed{c.seed}")
def test_prefill_rounding_passes_only_when_judged_over_its_prefill_rows(case):
    undeclared = check_case(declaring(PrefillRounding, None), case)
    assert undeclared.status == "fail", undeclared.reason  # the prefill rows' rounding, unmodelled
    every_row = check_case(declaring(PrefillRounding, "all"), case)
    assert every_row.status == "fail", every_row.reason  # the decode rows judged over rounding they lack
    res = check_case(declaring(PrefillRounding, "prefill"), case)
    assert res.status == "pass", res.reason
    note = f"judged over its prefill requests' queries rounded to {case.kv_dtype} (the backend declares "
    assert res.reason.endswith(note + "fp8_queries)")
    assert res.verdict.err > 0


@pytest.mark.parametrize("case", MIXED, ids=lambda c: f"seed{c.seed}")
def test_declaring_the_prefill_rows_while_rounding_every_row_fails(case):
    res = check_case(declaring(RoundingNative, "prefill"), case)
    assert res.status == "fail", res.reason


@pytest.mark.parametrize(
    "q_lens, prefill",
    [
        ((1, 1, 1), (False, False, False)),  # every request a decode
        ((7, 9), (True, True)),
        ((1, 1, 7, 9), (False, False, True, True)),
        ((7, 1), (True, True)),  # the first request a prefill: the whole batch is
        ((1, 7, 1), (False, True, True)),  # a decode after a prefill goes with the prefills
        ((3, 3), (True, True)),  # a uniform verify width over 1 (threshold 1): prefills
    ],
)
def test_prefill_requests_split_as_vllm_splits_a_batch_in_its_order(q_lens, prefill):
    assert prefill_requests(q_lens) == prefill


def test_the_prefill_rule_rounds_exactly_the_prefill_requests_rows():
    case = fp8_case("EXTEND", ((40, 1), (5, 7), (3, 1)), 0)
    inputs = make_inputs(case)
    got = judged_inputs(declaring(RoundingNative, "prefill"), case, inputs).q_all
    every = rounded_queries(case, inputs).q_all
    assert torch.equal(got[:1], inputs.q_all[:1]) and not torch.equal(every[:1], inputs.q_all[:1])
    assert torch.equal(got[1:], every[1:])  # the prefill and the decode after it, rounded
    decodes = fp8_case("DECODE", ((40, 1), (3, 1)), 0)
    inputs = make_inputs(decodes)
    assert judged_inputs(declaring(RoundingNative, "prefill"), decodes, inputs) is inputs  # no row rounded
    res = check_case(declaring(PrefillRounding, "prefill"), decodes)
    assert res.status == "pass" and "judged over" not in res.reason, res.reason


def test_a_rows_rule_is_one_of_the_known_and_needs_the_cast_declared():
    fp8 = frozenset({"float8_e4m3fn"})
    with pytest.raises(ValueError, match="one of all, prefill"):
        Capabilities(modes=frozenset({Mode.DECODE}), kv_dtypes=fp8, fp8_queries=CAST, fp8_query_rows="decode")
    with pytest.raises(ValueError, match="only with fp8_queries declared"):
        Capabilities(modes=frozenset({Mode.DECODE}), kv_dtypes=fp8, fp8_query_rows="prefill")


def test_sglang_fa3_still_rounds_every_row():
    assert FA3.fp8_queries is not None and FA3.fp8_query_rows == "all"


def test_the_replay_check_reads_the_rule_too(monkeypatch):
    """Decode graphs (vllm_flashinfer's only graph mode): declared "prefill", no row is judged rounded,
    so a replay that leaves its decode queries as they are passes and one that rounds them fails."""
    fake.install(monkeypatch)
    g = GraphCase((decode(1, 40, 3, seed=30), decode(1, seed=32), decode(9, 2, seed=29)), 4, 48)

    def prefill_rows(backend):  # noqa: ANN001, ANN202
        caps = backend.capabilities
        backend.capabilities = dataclasses.replace(caps, fp8_queries=CAST, fp8_query_rows="prefill")
        return backend

    rounding = replay_result(prefill_rows(fake.on_cpu(RoundingDecode())), g, "cpu")
    assert rounding.status == "fail", rounding.reason
    plain = replay_result(prefill_rows(fake.on_cpu(backends.load("flashinfer_dec_tc"))), g, "cpu")
    assert plain.status == "pass", plain.reason
