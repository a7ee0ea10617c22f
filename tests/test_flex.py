"""FlexAttention on the CPU: the compiled kernel on a dedicated subset of the `ci` profile, its
compile cost, both sink strategies, the LSE plumbing, and its batch invariance.

The compiled variant is skipped by the suite on the CPU (each new shape is a C++ compile), so it
runs here on small `ci`-profile shapes at one dtype and head shape (bf16, 8 query / 2 KV heads,
head_dim 64; batches of up to 3, prefixes up to 120): every family, with and without a window,
and the pinned cases. The eager variant runs in the suite itself (cases/), its batch invariance
included (cases/test_deterministic.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings

import pytest
import torch
from hypothesis import example, given, settings

from harness.backends.flex import CPU_SUITE_ENV, SHAPES_ENV, FlexBase, _flex_api, _unpack_lse
from harness.backends.flex_compiled import FlexCompiled
from harness.backends.flex_eager import FlexEager
from harness.backends.flex_launch import bucket
from harness.checks.invariance import check_invariance
from harness.checks.numeric import check_case
from harness.core.case import Case
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.run.suite import pinned_examples
from harness.search import profiles
from harness.search.strategies import cases
from tests.helpers import AtenOps, batch_of, case

SHAPE = {"dtype": "bfloat16", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64}
EXAMPLES = 4  # per family and window; shapes repeat, so most examples reuse a compiled kernel


class _CompiledHere(FlexCompiled):
    cpu_in_suite = True


class _EagerVirtualSink(FlexEager):
    """The eager kernel with the sink as a virtual key, the compiled CPU kernel's strategy."""

    def sinks_via_lse(self, batch):  # noqa: ANN001, ANN201
        return False


def _subset_sizes() -> profiles.Sizes:
    """The `ci` sizes at one dtype and head shape, batches of up to 3 and prefixes up to 120: each
    launch then pads to 128 or 512 rows, so the subset costs about two C++ compiles."""
    return dataclasses.replace(
        profiles.SIZES["ci"],
        max_batch=3,
        max_prefix=120,
        heads=((SHAPE["num_q_heads"], SHAPE["num_kv_heads"]),),
        head_dims=(SHAPE["head_dim"],),
        dtypes=(SHAPE["dtype"],),
    )


TARGETS = [(f, w) for f in FAMILIES for w in (("full",) if FAMILY_MODE[f] == Mode.CROSS else ("full", "swa"))]


@pytest.mark.parametrize("family,window", TARGETS, ids=[f"{f}-{w}" for f, w in TARGETS])
def test_compiled_kernel_passes_the_ci_subset(family, window, record):
    profiles.load("ci")
    backend = _CompiledHere()
    why = backend.available("cpu")
    if why:
        pytest.skip(why)
    backend.name = "flex_compiled"  # recorded under the registry name in the summary table
    strategy = cases(family, window == "swa", backend.capabilities, _subset_sizes())
    pins = [
        c.replace(**SHAPE)
        for c in pinned_examples(family)
        if (c.window_left >= 0) == (window == "swa") and backend.supports(c.replace(**SHAPE)) is None
    ]

    def check(c):  # noqa: ANN001, ANN202
        res = check_case(backend, c, "cpu")
        record(res)
        assert res.status == "pass", res.failure_text()

    test = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None)(
        given(strategy)(check)
    )
    for c in pins:
        test = example(c)(test)
    test()


def test_static_shapes_pad_to_few_buckets(monkeypatch):
    monkeypatch.delenv(SHAPES_ENV, raising=False)
    assert [bucket(n) for n in (1, 128, 129, 512, 513, 2048, 2049)] == [128, 128, 512, 512, 2048, 2048, 8192]
    assert FlexCompiled().padded_len(130, "cpu") == 512 and FlexCompiled().padded_len(130, "cuda") == 130
    assert FlexEager().padded_len(130, "cpu") == 130
    monkeypatch.setenv(SHAPES_ENV, "static")
    assert FlexCompiled().padded_len(130, "cuda") == 512


class _DynamicHere(_CompiledHere):
    """CUDA's dynamic-shape launches, on the CPU (the kernel is swapped for a counted compile)."""

    def static_shapes(self, device):  # noqa: ANN001, ANN202
        return False


class _DynamicUnpadded(_DynamicHere):
    """Launches at their real lengths, as before `launch_lengths` padded them."""

    def launch_lengths(self, num_queries, num_keys, device):  # noqa: ANN001, ANN202
        return num_queries, num_keys


def test_dynamic_launches_pad_past_the_sizes_dynamo_specialises(monkeypatch):
    """With dynamic shapes a launch has at least 2 rows, never exactly 128 (one query block at the
    main kernel) and at least 129 keys (two key blocks); static shapes keep their buckets."""
    monkeypatch.delenv(SHAPES_ENV, raising=False)
    b = FlexCompiled()
    got = [b.launch_lengths(q, k, "cuda") for q, k in ((1, 1), (2, 128), (127, 129), (128, 300), (129, 5))]
    assert got == [(2, 129), (2, 129), (127, 129), (129, 300), (129, 129)]
    assert b.launch_lengths(1, 130, "cpu") == (128, 512)
    assert FlexEager().launch_lengths(1, 1, "cuda") == (1, 1)
    launch = _DynamicHere().pack(batch_of(case("DECODE", ((6, 1),), **SHAPE)), [0])
    assert (launch.q.shape[2], launch.k.shape[2], launch.num_queries, launch.num_keys) == (2, 129, 1, 7)
    assert launch.q_doc.tolist() == [0, -1] and launch.kv_doc.tolist()[6:8] == [0, -2]


def _traced_graphs(backend: type[FlexCompiled], batches: list[Case]) -> int:
    """Graphs dynamo traces for torch.compile(flex_attention, dynamic=True) over `batches`, run one
    after the other by `backend` (its compiled kernel swapped for one whose backend counts them)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    flex = torch.compile(_flex_api()[0], dynamic=True, fullgraph=True, backend=counter)

    class _Counted(backend):
        def kernel(self, device):  # noqa: ANN001, ANN202
            return flex

    torch._dynamo.reset()
    try:
        for c in batches:
            _Counted().run(batch_of(c))
    finally:
        torch._dynamo.reset()
    return counter.frame_count


def test_dynamic_launches_of_one_kernel_share_one_graph():
    """Launches of one variant but any lengths (1 to 300 query rows, 1 to 400 keys) trace one graph
    below 128 rows (flex's decoding kernel) and one from 128 on; at their real lengths a one-row,
    one-key, one-query-block or one-key-block launch each traced a graph of its own."""
    batches = [
        case("DECODE", ((6, 1),), **SHAPE),
        case("DECODE", ((60, 1), (2, 1), (9, 1)), **SHAPE),
        case("DECODE", ((300, 1), (2, 1)), **SHAPE),
        case("EXTEND", ((4, 3),), **SHAPE),
        case("CROSS", ((0, 1, 1),), **SHAPE),
        case("EXTEND", ((40, 128),), **SHAPE),
        case("EXTEND", ((40, 200),), **SHAPE),
        case("EXTEND", ((100, 300),), **SHAPE),
    ]
    assert _traced_graphs(_DynamicHere, batches) == 2
    assert _traced_graphs(_DynamicUnpadded, batches) > 2


def test_the_suite_runs_compiled_on_the_cpu_only_when_asked(monkeypatch):
    monkeypatch.delenv(CPU_SUITE_ENV, raising=False)
    why = FlexCompiled().available("cpu")
    if why and "C++ compiler" in why:
        pytest.skip(why)
    assert why and CPU_SUITE_ENV in why and "tests/test_flex.py" in why
    monkeypatch.setenv(CPU_SUITE_ENV, "1")
    assert FlexCompiled().available("cpu") is None
    assert FlexEager().available("cpu") is None


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_compiled_cost_a_new_batch_of_a_seen_shape_does_not_recompile():
    """The first call compiles once; other batches in the same padded bucket (other lengths, window,
    soft cap, sinks, mode, an encoder's causality and right window edge) reuse the kernel."""
    b = _CompiledHere()
    if b.available("cpu"):
        pytest.skip(b.available("cpu"))
    mqa = {**SHAPE, "num_q_heads": 4, "num_kv_heads": 1}  # a head shape no other test compiles
    first = case("EXTEND", ((40, 30), (3, 20)), window_left=7, **mqa)
    same_bucket = [
        case("EXTEND", ((20, 9),), window_left=3, soft_cap=5.0, sinks=True, **mqa),
        case("DECODE", ((60, 1), (2, 1)), **mqa),
        case("CROSS", ((0, 5, 9),), sinks=True, **mqa),
        case("ENCODER_ONLY", ((0, 25), (0, 4)), window_left=4, window_right=2, **mqa),
    ]
    check_case(FlexEager(), first)  # the harness's lazy imports (they re-key dynamo guards) first
    t0, g0 = time.perf_counter(), _graphs()
    assert check_case(b, first).status == "pass"
    t1, g1 = time.perf_counter(), _graphs()
    for c in same_bucket:
        assert check_case(b, c).status == "pass", c
    t2, g2 = time.perf_counter(), _graphs()
    print(
        f"\nflex_compiled cpu: first case {t1 - t0:.1f}s ({g1 - g0} graph), "
        f"{len(same_bucket)} more in its bucket {t2 - t1:.2f}s ({g2 - g1} graphs)"
    )
    assert g1 == g0 + 1, "the first call did not compile exactly once"
    assert g2 == g1, "a new batch of an already compiled shape recompiled"


@pytest.mark.parametrize("backend", [FlexEager(), _EagerVirtualSink()], ids=["lse", "virtual_key"])
@pytest.mark.parametrize(
    "c",
    [
        case("EXTEND", ((40, 30), (3, 20)), window_left=7, sinks=True, q_amplitude=8.0),
        case("TARGET_VERIFY", ((50, 5, 0, (-1, 0, 0, 1, 2)),), window_left=3, sinks=True, soft_cap=5.0),
        case("CROSS", ((0, 5, 9), (2, 1, 3)), sinks=True),
    ],
    ids=["extend", "tree", "encoder"],
)
def test_both_sink_strategies_match_the_reference(backend, c):
    res = check_case(backend, c)
    assert res.status == "pass", res.failure_text()


def test_sink_renormalisation_is_the_softmax_with_one_more_logit():
    lse = torch.tensor([[[0.5, -3.0, float("-inf"), 80.0]]])  # [1, Hq=1, L=4]
    sink = torch.tensor([2.0])
    out = torch.ones(1, 1, 4, 2)
    got = FlexEager().apply_sinks(out, lse, sink)[0, 0, :, 0]
    want = [math.exp(x) / (math.exp(x) + math.exp(2.0)) for x in (0.5, -3.0)]
    assert torch.allclose(got[:2], torch.tensor(want), rtol=1e-6)
    assert got[2] == 0.0  # no visible key: zero, not NaN
    assert torch.isclose(got[3], torch.tensor(1.0))  # exp(80) does not overflow the formula


def test_lse_is_read_from_either_return_form():
    """torch >= 2.9 returns (out, AuxOutput) for return_aux; older versions (out, lse)."""
    from torch.nn.attention.flex_attention import AuxOutput

    out, lse = torch.zeros(1), torch.ones(1)
    assert _unpack_lse((out, lse))[1] is lse
    assert _unpack_lse((out, AuxOutput(lse=lse, max_scores=None)))[1] is lse


def test_eager_lse_is_checked_in_natural_log():
    res = check_case(FlexEager(), case("EXTEND", ((40, 30), (3, 20)), window_left=7))
    assert res.status == "pass", res.failure_text()
    assert res.verdict.lse_err is not None and res.verdict.lse_err <= res.verdict.lse_budget


def test_compiled_is_batch_invariant_in_deterministic_mode():
    b = _CompiledHere()
    if b.available("cpu"):
        pytest.skip(b.available("cpu"))
    c = case("DECODE", ((60, 1), (5, 1)), deterministic=True, window_left=20, sinks=True, **SHAPE)
    res = check_invariance(b, c, long_kv=60)
    assert res.passed, res.reason


@pytest.mark.parametrize(
    "c",
    [
        case("EXTEND", ((40, 30), (3, 20)), window_left=7),
        case("TARGET_VERIFY", ((50, 5, 0, (-1, 0, 0, 1, 2)), (9, 5, 0, (-1, 0, 1, 1, 3))), window_left=3),
        case("CROSS", ((0, 5, 9), (2, 1, 3))),
        case("ENCODER_ONLY", ((0, 30), (0, 7)), window_left=4, window_right=2),
        case("DECODE", ((60, 1), (5, 1)), sinks=True),
    ],
    ids=["extend", "tree", "cross", "encoder", "decode"],
)
@pytest.mark.parametrize("backend", [FlexEager(), _EagerVirtualSink()], ids=["lse", "virtual_key"])
def test_eager_mask_lookup_is_flex_own_evaluation_of_the_mask_mod(backend, c):
    """flex_eager hands flex a lookup into mask_mod evaluated once by broadcasting; flex's own vmapped
    evaluation of the same mask_mod (create_mask) must give the same grid, launch by launch (the
    whole batch in one launch, as the CUDA path packs it, and as the CPU path splits it)."""
    from torch.nn.attention.flex_attention import create_mask

    batch = batch_of(c)
    for requests in backend.launches(batch):
        launch = backend.pack(batch, requests)
        lq, lk = launch.q.shape[2], launch.k.shape[2]
        want = create_mask(backend.mask_mod(launch), 1, 1, lq, lk, device="cpu")[0, 0]
        lookup = backend.flex_mask_mod(launch, backend.visible_grid(launch))
        got = create_mask(lookup, 1, 1, lq, lk, device="cpu")[0, 0]
        assert want.any() and not want.all(), "a mask that hides nothing or everything proves nothing"
        assert torch.equal(got, want)


def test_eager_score_mod_is_left_out_only_when_it_has_nothing_to_do():
    b = FlexEager()
    plain, capped = case("EXTEND", ((4, 3),)), case("EXTEND", ((4, 3),), soft_cap=5.0)
    assert b.score_mod(b.pack(batch_of(plain), [0])) is None
    assert b.score_mod(b.pack(batch_of(capped), [0])) is not None
    assert _EagerVirtualSink().score_mod(_EagerVirtualSink().pack(batch_of(plain.replace(sinks=True)), [0]))


@pytest.mark.parametrize(
    ("soft_cap", "sinks", "most_ops"),
    [(5.0, False, 3), (0.0, True, 5), (5.0, True, 10)],
    ids=["cap", "sink", "both"],
)
def test_eager_score_mod_has_only_its_launchs_terms_and_the_shared_scores(soft_cap, sinks, most_ops):
    """flex_eager's score function keeps only the terms its launch needs (each operation is Python
    dispatch under flex's vmaps), and scores bit for bit as flex_compiled's shared one, which has
    every term: over every query and key of a launch with scores past the cap."""
    b = _EagerVirtualSink()
    launch = b.pack(batch_of(case("EXTEND", ((6, 5), (3, 2)), soft_cap=soft_cap, sinks=sinks)), [0, 1])
    mine, shared = b.score_mod(launch), FlexBase.score_mod(b, launch)
    heads, nq, nk = launch.q.shape[1], launch.q.shape[2], launch.k.shape[2]
    h, q, k = (
        torch.arange(n).view(shape) for n, shape in ((heads, (-1, 1, 1)), (nq, (1, -1, 1)), (nk, (1, 1, -1)))
    )
    s = torch.randn(heads, nq, nk, generator=torch.Generator().manual_seed(0)) * 20
    zero = torch.zeros((), dtype=torch.int64)
    with AtenOps() as ops:
        got = mine(s, zero, h, q, k)
    assert len(ops.names) <= most_ops
    want = shared(s, zero, h, q, k)
    assert torch.equal(got.expand_as(want), want) and not torch.equal(want, s)


class _EagerThroughDynamo(FlexEager):
    """flex_eager as torch runs eager flex by default: through torch.compile(backend="eager")."""

    @contextlib.contextmanager
    def calling(self):  # noqa: ANN201
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            yield


@pytest.mark.parametrize(
    "c",
    [
        case("EXTEND", ((40, 30), (3, 20)), window_left=7, sinks=True, soft_cap=5.0, **SHAPE),
        case("TARGET_VERIFY", ((50, 5, 0, (-1, 0, 0, 1, 2)),), window_left=3, **SHAPE),
        case("CROSS", ((0, 5, 9), (2, 1, 3)), dtype="float16"),
    ],
    ids=["extend", "tree", "cross"],
)
def test_eager_without_dynamo_is_bitwise_torch_default_eager_path(c):
    """flex_eager calls flex's unfused implementation directly (flex's own debug flag): the output
    and LSE are those of the default eager path, which wraps it in torch.compile(backend="eager")."""
    batch = batch_of(c)
    direct = FlexEager().run(batch)
    wrapped = _EagerThroughDynamo().run(batch_of(c))
    assert torch.equal(direct.out, wrapped.out) and torch.equal(direct.lse, wrapped.lse)


def test_eager_call_traces_no_graph_and_leaves_flex_flag_as_it_was():
    from torch._dynamo.utils import counters
    from torch.nn.attention import flex_attention as fa

    before = counters["stats"]["unique_graphs"]
    res = check_case(FlexEager(), case("EXTEND", ((33, 17), (5, 11)), window_left=9, seed=12345))
    assert res.status == "pass", res.failure_text()
    assert counters["stats"]["unique_graphs"] == before, "eager flex went through dynamo"
    assert fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False


# The direct BlockMask (flex_blocks.py) against create_block_mask over the glue's own mask_mod: the
# `dev` sizes (several 128-blocks per launch), every family with and without a window (trees, the
# hybrid pool, sinks as a virtual key included), at flex's block (128) and at 16 (many partial and
# full blocks even in small launches), for both variants' launches (compiled: every mask term, padded).
def _same_block_mask(got, want) -> None:  # noqa: ANN001 - flex BlockMasks
    assert got.BLOCK_SIZE == want.BLOCK_SIZE and got.seq_lengths == want.seq_lengths
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.to_dense(), want.to_dense())


@pytest.mark.parametrize("family,window", TARGETS, ids=[f"{f}-{w}" for f, w in TARGETS])
def test_direct_block_mask_is_create_block_mask(family, window):
    from torch.nn.attention.flex_attention import create_block_mask

    from harness.backends.flex_blocks import block_mask_from_grid

    sizes = dataclasses.replace(profiles.SIZES["dev"], max_batch=4)
    backends = [_CompiledHere(), FlexEager(), _EagerVirtualSink()]
    strategy = cases(family, window == "swa", backends[0].capabilities, sizes)

    @settings(max_examples=6, derandomize=True, database=None, deadline=None)
    @given(strategy)
    def check(c):  # noqa: ANN001, ANN202
        sinks = c.sinks or (c.seed % 2 == 0 and c.logit_offset >= 0)  # a Case refuses sinks under -L
        batch = batch_of(c.replace(sinks=sinks))
        for backend in backends:
            for requests in backend.launches(batch):
                launch = backend.pack(batch, requests)
                lengths = (launch.q.shape[2], launch.k.shape[2])
                mask_mod = backend.mask_mod(launch)
                for block in (128, 16):
                    want = create_block_mask(mask_mod, 1, None, *lengths, device="cpu", BLOCK_SIZE=block)
                    got = block_mask_from_grid(backend.visible_grid(launch), lengths, mask_mod, block)
                    _same_block_mask(got, want)
                assert backend.block_mask(launch).mask_mod is not None

    check()


@pytest.mark.parametrize(
    "c",
    [
        case("EXTEND", ((200, 300), (3, 20), (0, 150)), window_left=70, soft_cap=5.0),
        case("TARGET_VERIFY", ((150, 5, 0, (-1, 0, 0, 1, 2)), (300, 5, 0, (-1, 0, 1, 1, 3))), window_left=3),
        case("CROSS", ((0, 5, 300), (2, 1, 3))),
        case("ENCODER_ONLY", ((0, 300), (0, 7)), window_left=40, window_right=20),
    ],
    ids=["extend", "tree", "cross", "encoder"],
)
def test_eager_output_is_unchanged_by_the_direct_block_mask(c):
    """flex's output (and LSE) with the direct BlockMask is bitwise what create_block_mask's gives."""
    from torch.nn.attention.flex_attention import create_block_mask

    class _ThroughCreateBlockMask(FlexEager):
        def block_mask(self, launch):  # noqa: ANN001, ANN202
            lengths = (launch.q.shape[2], launch.k.shape[2])
            return create_block_mask(self.mask_mod(launch), 1, None, *lengths, device="cpu")

    direct, reference = FlexEager().run(batch_of(c)), _ThroughCreateBlockMask().run(batch_of(c))
    assert torch.equal(direct.out, reference.out) and torch.equal(direct.lse, reference.lse)


def test_eager_splits_a_launch_where_the_packed_grid_is_mostly_waste(monkeypatch):
    """On the CPU the unfused kernel's arithmetic over other requests' blocks of the packed grid costs
    more than another launch: long requests get launches of their own, short ones share one; each
    request exactly once, in order. With the waste allowed (CUDA's setting), one launch."""
    c = case("EXTEND", ((0, 300), (2, 3), (1, 4), (0, 300), (5, 1)), num_q_heads=8, num_kv_heads=2)
    batch = batch_of(c)
    assert FlexEager().launches(batch) == [[0, 1, 2], [3, 4]]
    monkeypatch.setitem(FlexEager.waste_per_launch, "cpu", FlexEager.waste_per_launch["cuda"])
    assert FlexEager().launches(batch) == [[0, 1, 2, 3, 4]]
    assert FlexEager().launches(batch_of(c.replace(deterministic=True))) == [[r] for r in range(5)]


def _graph_signatures(order: list[tuple[torch.Tensor, ...]]) -> set[str]:
    """The graphs dynamo builds for a dynamic=True compiled function called on each argument tuple of
    `order` in the compiled flex call's context: each as its placeholders' symbolic sizes and strides."""
    found = set()

    def record(gm, example_inputs):  # noqa: ANN001, ANN202 - a dynamo backend
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        found.add(repr([(tuple(v.shape), v.stride()) for v in values if isinstance(v, torch.Tensor)]))
        return gm

    torch._dynamo.reset()
    scores = torch.compile(lambda q, k: (q * 0.5) @ k.transpose(-1, -2), backend=record, dynamic=True)
    with FlexCompiled().calling():
        for args in order:
            scores(*args)
    torch._dynamo.reset()
    return found


def test_compiled_call_traces_graphs_that_follow_from_the_inputs_alone():
    """In the compiled call's context a graph depends on its input, not on what the process met
    first (dynamo's automatic dynamic shapes off): the warm-up's order and a check shard's give the
    same graphs, so the shard finds them in inductor's cache."""
    one_row = torch.randn(1, 1, 8, 16).transpose(1, 2)  # [1, 8, 1, 16]: a size-1 dim, stride 128
    keys = torch.randn(1, 8, 9, 16)
    inputs = [(one_row, keys), (torch.randn(1, 8, 1, 16), keys), (torch.randn(1, 8, 7, 16), keys)]
    assert _graph_signatures(inputs) == _graph_signatures(inputs[::-1])


def test_compiled_call_gives_equal_sizes_no_symbol_of_their_own():
    """As many queries as keys and a different number are one graph (no duck shapes)."""
    keys = torch.randn(1, 8, 9, 16)
    assert len(_graph_signatures([(torch.randn(1, 8, 9, 16), keys), (torch.randn(1, 8, 5, 16), keys)])) == 1


def test_compiled_call_takes_one_layout_per_shape_with_gradients_off():
    """q, k and v reach the kernel with a fresh contiguous tensor's strides (a one-row view may carry
    any stride on its size-1 dimension, and dynamo guards on strides), and without gradients."""
    seen = []

    class _Spy(_CompiledHere):
        def kernel(self, device):  # noqa: ANN001, ANN202
            def flex(q, k, v, score_mod, block_mask, **kwargs):  # noqa: ANN001, ANN202
                seen.append(([x.stride() for x in (q, k, v)], torch.is_grad_enabled()))
                return torch.zeros_like(q)

            return flex

    b = _Spy()
    launch = b.pack(batch_of(case("DECODE", ((6, 1),), **SHAPE)), [0])
    one_row = torch.randn(1, 1, 8, 64).transpose(1, 2)
    assert one_row.is_contiguous() and one_row.stride() != (512, 64, 64, 1)
    out, _ = b.call_flex(dataclasses.replace(launch, q=one_row), None, None, 0.1, False)
    strides, grad = seen[0]
    assert strides[0] == (512, 64, 64, 1) and strides[1] == launch.k.stride()
    assert not grad and torch.is_grad_enabled()
    assert out.shape == one_row.shape


def test_canonical_layout_keeps_the_values():
    from harness.backends.flex_compiled import canonical_layout, contiguous_strides

    assert contiguous_strides((1, 8, 1, 64)) == (512, 64, 64, 1)
    one_row = torch.randn(1, 1, 8, 64).transpose(1, 2)
    strided = torch.randn(1, 8, 5, 64).transpose(1, 2)
    for x in (one_row, strided):
        got = canonical_layout(x)
        assert got.stride() == contiguous_strides(tuple(x.shape)) and torch.equal(got, x)


def test_compiled_launch_captures_no_length_one_table():
    """The tree table a compiled launch captures has at least two entries, with no tree and with a
    one-draft tree, on the eager and the graph path: dynamo specialises a size-1 dimension, so a
    length-1 table would be a compile of its own."""
    from harness.backends.graph_glue import GraphLimits

    class _Unpadded(FlexCompiled):
        def padded_len(self, n, device):  # noqa: ANN001, ANN202 - CUDA's lengths, on the CPU
            return n

    b = _Unpadded()
    for c in (case("EXTEND", ((4, 3),), **SHAPE), case("TARGET_VERIFY", ((6, 1, 0, (-1,)),), **SHAPE)):
        batch = batch_of(c)
        assert b.pack(batch, [0]).tree.numel() >= 2
        limits = GraphLimits(max_batch=1, queries=1, max_kv=16, page_size=batch.case.page_size)
        assert b.graph_buffers(limits, batch).buffers["tree"].numel() >= 2
