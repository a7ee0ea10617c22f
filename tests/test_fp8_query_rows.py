"""A backend that casts only some requests' queries to an FP8 cache's dtype (`fp8_query_rows`
"prefill", as vLLM's FlashInfer on Hopper casts its prefill requests' and keeps its decode requests'
in the model dtype): judged over exactly those rounded rows it passes, and judged as if it rounded
none or every row it fails, as does one that declares the prefill rows but rounds every row. The
stand-ins are torch_native with the cast in front."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import backends
from harness.backends.base import Capabilities
from harness.backends.engines.sglang.fa3 import FA3
from harness.checks.judged_inputs import judged_inputs, prefill_requests, rounded_queries
from harness.checks.numeric import check_case
from harness.checks.replay import replay_result
from harness.core.batch import make_inputs
from harness.core.graph_case import GraphCase
from harness.core.modes import Mode
from tests import flashinfer_fake as fake
from tests.test_fp8_queries import CAST, RoundingDecode, RoundingNative, cast, decode, fp8_case


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
