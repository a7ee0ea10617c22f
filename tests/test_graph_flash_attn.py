"""The CUDA-graph path of the flash-attn adapters on the CPU: the replay check (harness/checks/replay.py)
over the graph emulator, with the library fakes as opaque kernels (tests/flash_attn_fakes.py).

Each sequence replays batches of one layer at padded sizes: fewer real requests than the captured
size, a smaller batch after a larger one, contexts longer than at capture. The replay mutants of
harness/mutants/flash_attn.py are caught here and pass the eager numeric check on the same batches.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends.flash_attn_fa2 import FA2
from harness.backends.flash_attn_fa3 import FA3
from harness.backends.flash_attn_fa4 import FA4
from harness.checks.numeric import check_case
from harness.checks.replay import replay_result
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import hunt
from harness.mutants.flash_attn import MUTANTS
from harness.search import profiles
from tests.test_flash_attn import libs, on_cpu  # noqa: F401 - libs is a fixture

CHAIN3 = (-1, 0, 1)
TREE3 = (-1, 0, 0)  # two siblings under the first draft's parent


def batch(mode: str, lens: list[int], seed: int, tree=None, **kw) -> Case:
    """A batch of requests with the given prefix lengths; E = 1 in DECODE, 3 otherwise."""
    e = 1 if mode == "DECODE" else 3
    reqs = tuple(Request(p, e, tree=(tree if mode == "TARGET_VERIFY" else None)) for p in lens)
    return Case(mode=mode, requests=reqs, head_dim=32, page_size=kw.pop("page_size", 16), seed=seed, **kw)


def sequence(mode: str, tree=CHAIN3, **kw) -> GraphCase:
    """Three replays: 3 requests (captured at 4), then 5 longer ones (at 8), then 1 (at 1)."""
    tree = tree if mode == "TARGET_VERIFY" else None
    lens = [[5, 2, 9], [30, 17, 8, 40, 3], [12]]
    batches = tuple(batch(mode, ls, i, tree, **kw) for i, ls in enumerate(lens))
    return GraphCase(batches, max_batch=8, max_kv=48)


GRAPH_CASES = {
    "decode": sequence("DECODE"),
    "decode_swa_soft_cap": sequence("DECODE", window_left=6, soft_cap=20.0),
    "decode_hybrid_pool": sequence("DECODE", window_left=5, hybrid_swa_pool=True),
    "decode_deterministic": sequence("DECODE", deterministic=True),
    "verify_chain": sequence("TARGET_VERIFY"),
    "verify_tree_swa": sequence("TARGET_VERIFY", TREE3, window_left=4),
    "draft_extend_v2": sequence("DRAFT_EXTEND_V2"),
    "draft_extend_v2_swa_deterministic": sequence("DRAFT_EXTEND_V2", window_left=7, deterministic=True),
    "decode_sinks": sequence("DECODE", sinks=True),
}
FA3_CASES = [k for k in GRAPH_CASES if "tree" not in k and "sinks" not in k]


@pytest.mark.parametrize("name", list(GRAPH_CASES))
def test_fa4_graph_replays_pass(libs, name):  # noqa: F811
    res = replay_result(on_cpu(FA4()), GRAPH_CASES[name], "cpu")
    assert res.status == "pass", res.reason


@pytest.mark.parametrize("name", FA3_CASES)
def test_fa3_graph_replays_pass(libs, name):  # noqa: F811
    res = replay_result(on_cpu(FA3()), GRAPH_CASES[name], "cpu")
    assert res.status == "pass", res.reason


def test_fa2_is_not_capturable_with_the_reason(libs):  # noqa: F811
    res = replay_result(on_cpu(FA2()), GRAPH_CASES["decode"], "cpu")
    assert res.status == "skip" and "per-request loop" in res.reason


def test_the_captured_call_reads_the_buffers_and_frozen_values(libs):  # noqa: F811
    """Every replay's kernel call gets the same buffer views (tensors by identity) and the values of
    the capture: max_seqlen_q = queries, max_seqlen_k = the page table's bound."""
    first_two = GRAPH_CASES["draft_extend_v2"].batches[:2]  # the last replay: 5 requests at size 8
    g = GraphCase(first_two, max_batch=8, max_kv=48)
    assert replay_result(on_cpu(FA4()), g, "cpu").status == "pass"
    calls = [c for c in libs["fa4"].calls if c["page_table"].shape[0] == 8]  # the size-8 graph's calls
    assert len(calls) >= 3  # warm-up, capture, and the replay of the 5-request batch
    assert len({c["page_table"].data_ptr() for c in calls}) == 1
    assert all(c["max_seqlen_q"] == 3 and c["max_seqlen_k"] == 48 for c in calls)
    replayed = calls[-1]
    assert replayed["seqused_k"].tolist() == [33, 20, 11, 43, 6] + [4] * 3  # bumped extents, then padding
    assert replayed["cu_seqlens_q"].tolist() == list(range(0, 27, 3))


def test_padding_rows_read_the_reserved_page(libs):  # noqa: F811
    """3 requests replayed at size 4 (the recorded arguments are the buffers themselves: one replay)."""
    g = GraphCase(GRAPH_CASES["decode"].batches[:1], max_batch=8, max_kv=48)
    assert replay_result(on_cpu(FA4()), g, "cpu").status == "pass"
    last4 = [c for c in libs["fa4"].calls if c["page_table"].shape[0] == 4][-1]
    assert last4["page_table"][3, :1].tolist() == [0] and last4["seqused_k"][3] == 1


GRAPH_MUTANTS = [m for m in MUTANTS if m.check == "graph"]
CAUGHT_BY = {
    "fa4~graph_seqlens_from_capture": "decode",
    "fa4~graph_page_columns_from_capture": "decode",
    "fa4~graph_de_v2_extent_unbumped": "draft_extend_v2",
    "fa4~graph_tree_tables_from_capture": "verify_tree_swa",
}


def test_every_graph_mutant_has_a_sequence_here():
    assert sorted(m.name for m in GRAPH_MUTANTS) == sorted(CAUGHT_BY)


@pytest.mark.parametrize("mutant", GRAPH_MUTANTS, ids=lambda m: m.name)
def test_graph_mutant_is_caught_by_the_replay_check_only(libs, mutant):  # noqa: F811
    g = GRAPH_CASES[CAUGHT_BY[mutant.name]]
    res = replay_result(on_cpu(mutant.make()), g, "cpu")
    assert res.status == "fail", res.reason
    for c in g.batches:  # the eager path is intact: the suite's numeric check passes every batch
        eager = check_case(on_cpu(mutant.make()), c, "cpu")
        assert eager.status == "pass", eager.reason


def test_fa3_replays_through_the_same_buffers(libs):  # noqa: F811
    assert replay_result(on_cpu(FA3()), GRAPH_CASES["decode"], "cpu").status == "pass"
    last = libs["fa3"].calls[-1]
    assert last["cache_seqlens"].dtype == torch.int32 and last["max_seqlen_q"] == 1


@pytest.mark.parametrize("name", ["fa2", "flex_eager", "torch_native", "torch_split"])
def test_uncaptured_backends_say_why(name):
    """Each reason names what a graph cannot hold (a per-request Python loop), not the default."""
    from harness import backends

    why = backends.load(name).capabilities.graph_reason()
    assert why.startswith("not capturable") and "loop" in why, why


@pytest.mark.parametrize("mutant", GRAPH_MUTANTS, ids=lambda m: m.name)
def test_graph_mutant_passes_the_eager_suite_search(libs, mutant):  # noqa: F811
    """The eager suite's own search (numeric check, the mutant's first family) finds nothing; the
    replay search (test_flash_attn.py's hunts, check graph) catches each."""
    profiles.load("ci")
    eager = dataclasses.replace(mutant, device="cpu", make=lambda: on_cpu(mutant.make()), check="numeric")
    d = hunt(eager, mutant.families[0], max_examples=8)
    assert not d.caught and d.examples > 0, d.reason
