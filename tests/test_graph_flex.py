"""flex_compiled's CUDA-graph path on the CPU: the replay check (harness/checks/replay.py) over the
graph emulator, the compiled kernel as one opaque node reading the layout buffers.

Each sequence replays three batches of one layer: 3 requests (captured at 4), 5 longer ones (at 8),
then 1 (at 1). Every sequence shares one compiled shape (the layout's fixed lengths), so the file
costs one C++ compile of the graph kernel, plus those of the eager runs it compares with.
"""

from __future__ import annotations

import pytest
import torch

from harness.backends.flex_compiled import FlexCompiled
from harness.checks.numeric import check_case
from harness.checks.replay import GraphRunner, limits_of, replay_result
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants.flex import COMPILED_SHAPE, MUTANTS

pytestmark = [pytest.mark.graph, pytest.mark.flex_compiled]  # `-m "not flex_compiled"` skips the compiles
TREE3 = (-1, 0, 0)  # two siblings under the first draft's parent


class _CompiledHere(FlexCompiled):
    cpu_in_suite = True


@pytest.fixture(autouse=True)
def _compiler():
    why = _CompiledHere().available("cpu")
    if why:
        pytest.skip(why)


def sequence(mode: str, **kw) -> GraphCase:
    e = 1 if mode == "DECODE" else 3
    tree = TREE3 if mode == "TARGET_VERIFY" else None
    lens = [[5, 2, 9], [30, 17, 8, 40, 3], [12]]
    batches = tuple(
        Case(mode=mode, requests=tuple(Request(p, e, tree=tree) for p in ls), page_size=16, seed=i, **kw)
        for i, ls in enumerate(lens)
    )
    return GraphCase(batches, max_batch=8, max_kv=48).replace_layer(**COMPILED_SHAPE)


GRAPH_CASES = {
    "decode_swa_soft_cap_sinks": sequence("DECODE", window_left=6, soft_cap=20.0, sinks=True),
    "verify_tree_swa_hybrid_pool": sequence("TARGET_VERIFY", window_left=4, hybrid_swa_pool=True),
    "draft_extend_v2_deterministic": sequence("DRAFT_EXTEND_V2", deterministic=True),
}


@pytest.mark.parametrize("name", list(GRAPH_CASES))
def test_flex_compiled_graph_replays_pass(name):
    res = replay_result(_CompiledHere(), GRAPH_CASES[name], "cpu")
    assert res.status == "pass", res.reason


def test_the_layout_puts_each_request_at_its_fixed_offset():
    """Request r's keys at r * stride (stride: max_kv + a sink key, rounded to 128); the rest of every
    buffer is rewritten to the fill values (a smaller batch leaves nothing of a larger one). In
    deterministic mode each request has its own launch, as in the eager path."""
    g = GRAPH_CASES["draft_extend_v2_deterministic"]
    backend = _CompiledHere()
    batches = [build_batch(c, make_inputs(c, "cpu"), "cpu") for c in g.batches]
    runner = GraphRunner(backend, limits_of(g), batches)
    state = runner.state
    for batch in batches[1:]:  # 5 requests, then 1
        backend.replay_metadata(state, batch, 8)
    doc = state.buffers["kv_doc"].tolist()
    assert backend.graph_stride(state.limits) == 128
    assert doc[:15] == [0] * 15 and doc[15:] == [-2] * (len(doc) - 15)  # P + E keys: 12 + 3
    assert state.buffers["q_doc"].tolist()[:4] == [0, 0, 0, -1]
    # deterministic: one launch per captured request, each at the eager launch's padded lengths
    launches = backend.graph_launches(state, backend.graph_launch(state, runner.static(8)), 8)
    assert [(x.num_queries, x.q.shape[2], x.k.shape[2]) for x in launches] == [(3, 128, 128)] * 8
    assert launches[0].kv_doc.tolist()[:16] == [0] * 15 + [-2] and launches[1].q_doc.tolist()[0] == -1


class _DynamicHere(_CompiledHere):
    """CUDA's dynamic-shape lengths, on the CPU (nothing here calls the kernel)."""

    def static_shapes(self, device):  # noqa: ANN001, ANN202
        return False


@pytest.mark.parametrize(
    "g",
    [sequence("DECODE", deterministic=True), GRAPH_CASES["draft_extend_v2_deterministic"]],
    ids=["decode", "draft_extend_v2"],
)
def test_dynamic_graph_launches_have_each_requests_eager_blocks(g):
    """With CUDA's dynamic shapes a captured request's launch is padded as its eager launch is (a
    decode's one row to two, its keys to two blocks), so it reaches into the next request's first
    row and key; its BlockMask still lists exactly the blocks of the request's own eager launch, in
    order, as deterministic mode's bitwise replay needs."""
    backend = _DynamicHere()
    batches = [build_batch(c, make_inputs(c, "cpu"), "cpu") for c in g.batches]
    runner = GraphRunner(backend, limits_of(g), batches)
    state, batch = runner.state, batches[0]  # 3 requests, captured at 4
    backend.replay_metadata(state, batch, 4)
    graph = backend.graph_launches(state, backend.graph_launch(state, runner.static(4)), 4)
    eager = [backend.pack(batch, r) for r in backend.launches(batch)]
    e = state.limits.queries
    assert [(x.q.shape[2], x.k.shape[2]) for x in graph] == [(max(e, 2), 129)] * 4
    if e == 1:  # the padding row and key are the next request's
        assert graph[0].q_doc.tolist() == [0, 1] and graph[0].kv_doc.tolist()[128] == 1
    for captured, own in zip(graph, eager, strict=False):
        a, b = backend.block_mask(captured), backend.block_mask(own)
        for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
            assert torch.equal(getattr(a, num)[..., :1], getattr(b, num)[..., :1]), num
            n = int(getattr(b, num)[0, 0, 0])
            assert torch.equal(getattr(a, idx)[0, 0, 0, :n], getattr(b, idx)[0, 0, 0, :n]), idx


def test_deterministic_launches_pin_flex_main_kernel_on_cuda():
    """In deterministic mode both paths call flex's main kernel on CUDA (FORCE_USE_FLEX_ATTENTION): the
    decoding kernel would tile the keys by the launch's length, the graph's stride vs the eager
    request's own. Other launches keep inductor's choice; the CPU takes no kernel options."""
    backend = _CompiledHere()
    pins = [("draft_extend_v2_deterministic", True), ("decode_swa_soft_cap_sinks", False)]
    for g, pinned in ((GRAPH_CASES[name], pinned) for name, pinned in pins):
        batches = [build_batch(c, make_inputs(c, "cpu"), "cpu") for c in g.batches]
        runner = GraphRunner(backend, limits_of(g), batches)
        backend.replay_metadata(runner.state, batches[0], 4)
        graph = backend.graph_launches(runner.state, backend.graph_launch(runner.state, runner.static(4)), 4)
        eager = [backend.pack(batches[0], r) for r in backend.launches(batches[0])]
        for launch in graph + eager:
            options = backend.kernel_kwargs("cuda", launch)["kernel_options"]
            assert options.get("FORCE_USE_FLEX_ATTENTION", False) is pinned
            assert options["BLOCK_M"] == 64 and backend.kernel_kwargs("cpu", launch) == {}


GRAPH_MUTANTS = [m for m in MUTANTS if m.check == "graph"]


@pytest.mark.parametrize("mutant", GRAPH_MUTANTS, ids=lambda m: m.name)
def test_graph_mutant_is_caught_by_the_replay_check_only(mutant):
    g = GRAPH_CASES["verify_tree_swa_hybrid_pool"]
    res = replay_result(mutant.make(), g, "cpu")
    assert res.status == "fail", res.reason
    for c in g.batches:  # the eager path is intact: the suite's numeric check passes every batch
        eager = check_case(mutant.make(), c, "cpu")
        assert eager.status == "pass", eager.reason
