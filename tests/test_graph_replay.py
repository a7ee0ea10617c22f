"""The CUDA-graph replay check on the CPU: GraphCase validation, the engine's capture sizes, the
graph runner over FlashInfer's decode path against the fake (its use_cuda_graph buffer semantics,
replayed by the graph emulator), the suite's graph tests, and the replay mutants: each caught by
the replay search, none by the eager suite."""

from __future__ import annotations

import dataclasses

import pytest

from harness import backends
from harness.backends.flashinfer_dec import FlashInferDecTC
from harness.backends.graph_glue import capture_sizes, padded_size
from harness.checks import known_issues
from harness.checks.replay import replay_result
from harness.core.case import Case, CaseError, Request
from harness.core.graph_case import GraphCase
from harness.mutants import hunt
from harness.mutants.graph import MUTANTS
from harness.run.graph_suite import GraphTarget, run
from harness.search import profiles
from tests import flashinfer_fake as fake

H = dict(head_dim=64)


@pytest.fixture(autouse=True)
def fi(monkeypatch):
    fake.install(monkeypatch)
    # Deterministic split-KV chunks of 16 keys (engines: 2048), so that ci-sized contexts split.
    monkeypatch.setattr(FlashInferDecTC, "split_tokens", 16)


def decode(*prefixes: int, **fields) -> Case:
    return Case(mode="DECODE", requests=tuple(Request(p, 1) for p in prefixes), **{**H, **fields})


def test_capture_sizes_are_the_engines():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 4]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(9) == [1, 2, 4, 8, 16]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert [padded_size(capture_sizes(20), b) for b in (1, 3, 5, 9, 17)] == [1, 4, 8, 16, 24]
    with pytest.raises(ValueError, match="exceeds the largest captured size 4"):
        padded_size([1, 2, 4], 5)


def test_a_graph_case_round_trips_through_json():
    g = GraphCase((decode(40, 3, seed=1), decode(70, seed=2, page_layout="interleaved")), 5, 80)
    assert GraphCase.from_json(g.to_json()) == g
    assert g.mode == "DECODE" and g.queries == 1 and len(g.requests) == 3


@pytest.mark.parametrize(
    "build,message",
    [
        (
            lambda: GraphCase((decode(4), decode(4, window_left=3)), 2, 10),
            r"batches\[1\]\.window_left=3 differs",
        ),
        (lambda: GraphCase((decode(4, 5, 6),), 2, 10), r"batches\[0\] has 3 requests, past max_batch=2"),
        (
            lambda: GraphCase((decode(4), decode(40)), 2, 10),
            r"batches\[1\] has a request of 41 keys, past max_kv=10",
        ),
        (
            lambda: GraphCase((Case(mode="EXTEND", requests=(Request(0, 3),)),), 1, 10),
            "EXTEND is not captured",
        ),
        (lambda: GraphCase((), 1, 10), "batches has 0 entries"),
        (lambda: GraphCase((decode(4),), 0, 10), r"max_batch=0 must be an integer in \[1, 2147483647\]"),
        (
            lambda: GraphCase(
                (
                    Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3),), **H),
                    Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 2),), **H),
                ),
                1,
                20,
            ),
            "batches\\[1\\] has 2 queries per request, batches\\[0\\] 3",
        ),
        (
            lambda: GraphCase.from_dict({"max_batch": 1, "max_kv": 9, "batches": [{"mode": "X"}]}),
            r"batches\[0\]:",
        ),
    ],
)
def test_a_bad_graph_case_is_one_line_naming_the_field(build, message):
    with pytest.raises(CaseError, match=message) as e:
        build()
    assert "\n" not in str(e.value)


def backend(name: str = "flashinfer_dec_tc"):
    return fake.on_cpu(backends.load(name))


GOOD = [
    (
        "flashinfer_dec_tc",
        GraphCase((decode(40, 3, 17, seed=1), decode(70, seed=2), decode(5, 9, 1, 2, 8)), 9, 100),
    ),
    (
        "flashinfer_dec_tc",  # a smaller batch after a larger one, on the hybrid pool, HND pages, soft cap
        GraphCase(
            (
                decode(50, 33, 7, 12, window_left=9, hybrid_swa_pool=True, kv_layout="HND", soft_cap=5.0),
                decode(90, window_left=9, hybrid_swa_pool=True, kv_layout="HND", soft_cap=5.0, seed=4),
            ),
            4,
            91,
        ),
    ),
    (
        "flashinfer_dec_tc",
        GraphCase((decode(40, 3, deterministic=True), decode(70, 60, 2, deterministic=True)), 3, 80),
    ),
    (
        "flashinfer_dec_tc",
        GraphCase(
            (
                Case(
                    mode="DRAFT_EXTEND_V2",
                    requests=(Request(33, 4), Request(16, 4), Request(2, 4)),
                    page_size=32,
                    **H,
                ),
                Case(mode="DRAFT_EXTEND_V2", requests=(Request(60, 4),), page_size=32, seed=3, **H),
            ),
            3,
            64,
        ),
    ),
    (
        "flashinfer_dec_tc",
        GraphCase(
            (
                Case(mode="TARGET_VERIFY", requests=(Request(50, 3, tree=(-1, 0, 1)),), window_left=2, **H),
                Case(
                    mode="TARGET_VERIFY",
                    requests=(Request(9, 3, tree=(-1, 0, 1)),) * 3,
                    window_left=2,
                    seed=5,
                    **H,
                ),
            ),
            3,
            53,
        ),
    ),
    (
        "flashinfer_paged",  # trees: the custom mask through its packed buffer
        GraphCase(
            (
                Case(
                    mode="TARGET_VERIFY",
                    requests=(Request(50, 5, tree=(-1, 0, 0, 1, 2)),),
                    window_left=9,
                    **H,
                ),
                Case(
                    mode="TARGET_VERIFY",
                    requests=(Request(7, 5, tree=(-1, 0, 1, 1, 0)), Request(30, 5, tree=(-1, 0, 0, 1, 2))),
                    window_left=9,
                    seed=5,
                    **H,
                ),
            ),
            2,
            60,
        ),
    ),
    (
        "flashinfer_paged",
        GraphCase(
            (
                Case(
                    mode="DRAFT_EXTEND_V2",
                    requests=(Request(33, 4), Request(16, 4)),
                    page_size=1,
                    soft_cap=5.0,
                    **H,
                ),
                Case(
                    mode="DRAFT_EXTEND_V2", requests=(Request(60, 4),), page_size=1, soft_cap=5.0, seed=3, **H
                ),
            ),
            3,
            64,
        ),
    ),
    (
        "flashinfer_dec_cc",
        GraphCase((decode(50, 3, window_left=9), decode(8, 20, 31, window_left=9, seed=9)), 3, 60),
    ),
]


@pytest.mark.parametrize("name,g", GOOD, ids=[f"{n}-{g.mode}-{i}" for i, (n, g) in enumerate(GOOD)])
def test_the_graph_path_passes_the_replay_check_under_the_fake(name, g):
    res = replay_result(backend(name), g, "cpu")
    assert res.status == "pass", res.failure_text() + res.extra.get("traceback", "")
    assert res.family == "graph" and res.extra["check"] == "graph"
    what = "paged" if name == "flashinfer_paged" else "decode"
    inits = [a for a in fake.calls(f"{what}.init") if a.get("use_cuda_graph")]
    assert len(inits) == len(capture_sizes(g.max_batch))  # one wrapper per captured size
    key = "paged_kv_last_page_len" if what == "paged" else "last_page_len"
    plans = [len(a[key]) for a in fake.calls(f"{what}.plan") if a["cuda_graph"]]
    sizes = sorted(capture_sizes(g.max_batch), reverse=True)
    assert plans[: len(sizes)] == sizes  # captured largest first, each planned at its fixed batch size
    assert plans[len(sizes) :][: len(g.batches)] == [padded_size(sizes, c.batch_size) for c in g.batches]


def test_padding_rows_go_to_the_reserved_slot_and_the_page_table_to_the_reserved_page():
    g = GraphCase((decode(40, 3, 17, 5, seed=1), decode(70, seed=2, window_left=-1), decode(9, 30, 2)), 4, 80)
    assert replay_result(backend(), g, "cpu").status == "pass"
    last = fake.calls("decode.plan")[-1]  # the third batch: 3 real requests at size 4 (no eager run)
    pad_pages = last["indices"][last["indptr"][3] :].tolist()
    assert pad_pages == [0] and last["last_page_len"].tolist()[3] == 1  # one key on the reserved page


def test_a_cudagraph_wrapper_keeps_its_batch_size_and_buffers():
    import torch

    indptr, indices = torch.zeros(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    last = torch.zeros(2, dtype=torch.int32)
    ws = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer should be a torch.Tensor"):
        fake.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True)
    w = fake.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )
    one = (torch.tensor([0, 1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), torch.tensor([5]))
    with pytest.raises(ValueError, match="batch size should be fixed in cudagraph mode"):
        w.plan(*one, 4, 4, 64, 16)
    two = (torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([7, 8, 9], dtype=torch.int32))
    w.plan(*two, torch.tensor([16, 2], dtype=torch.int32), 4, 4, 64, 16)
    assert indptr.tolist() == [0, 2, 3] and indices.tolist()[:3] == [7, 8, 9]  # the caller's buffers
    five = (torch.tensor([0, 2, 5], dtype=torch.int32), torch.arange(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="indices should be less than or equal to the allocated buffer"):
        w.plan(*five, torch.tensor([16, 2], dtype=torch.int32), 4, 4, 64, 16)


def test_the_suite_graph_test_passes_for_the_decode_path_under_the_fake(monkeypatch):
    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))
    profiles.load("ci")
    records = []
    run(GraphTarget("flashinfer_dec_tc", "cpu", "graph", "swa", "decode"), records.append)
    assert records and all(r.status in ("pass", "refused") for r in records)
    assert {r.family for r in records} == {"graph"}
    assert any(len(r.repro_target.batches) > 1 for r in records if r.status == "pass")


def _on_cpu(mutant, **changes):
    return dataclasses.replace(mutant, device="cpu", make=lambda: fake.on_cpu(mutant.make()), **changes)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name.split("~")[1] for m in MUTANTS])
def test_a_replay_mutant_is_caught_by_the_replay_search(mutant):
    profiles.load("ci")
    d = hunt(_on_cpu(mutant), mutant.families[0], shrink_runs=10)
    assert d.caught, f"{mutant.name} survived {d.examples} examples: {mutant.bug}"
    assert isinstance(d.shrunk, GraphCase)
    print(f"{mutant.name}: {d.examples} examples, {d.seconds:.1f}s, shrunk to {d.shrunk.to_json()}")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name.split("~")[1] for m in MUTANTS])
def test_a_replay_mutant_passes_the_eager_suite(mutant):
    """The eager check of the same family (with the mutant's forced fields) finds nothing: only
    replays reach the overridden method. The split mutant's eager check is batch invariance."""
    profiles.load("ci")
    eager = "invariance" if mutant.name.endswith("split_at_capture_only") else "numeric"
    d = hunt(_on_cpu(mutant, check=eager), mutant.families[0], max_examples=8)
    assert not d.caught and d.examples > 0, d.reason


def test_each_replay_gets_its_own_pool_and_poison_in_the_static_pool():
    import torch

    from harness.checks.replay import GraphRunner, limits_of
    from harness.core.batch import build_batch, make_inputs

    g = GraphCase((decode(150, 90, 70, seed=1), decode(5, seed=2)), 3, 160)
    batches = [build_batch(c, make_inputs(c), "cpu") for c in g.batches]
    runner = GraphRunner(backend(), limits_of(g), batches)
    runner.load(batches[0])
    runner.load(batches[1])
    small = batches[1].pool.k
    assert torch.equal(runner.pool.k[: small.shape[0]].nan_to_num(7.0), small.nan_to_num(7.0))
    assert runner.pool.k.shape[0] > small.shape[0] and runner.pool.k[small.shape[0] :].isnan().all()


def test_a_replay_record_is_its_own_check_with_the_graph_case_as_repro(monkeypatch, capsys):
    import json

    from harness.cli import main
    from harness.core.results import summary_table
    from harness.run.repro import NOTHING_CHECKED

    g = GraphCase((decode(40, 3, seed=1), decode(70, seed=2)), 2, 80)
    res = replay_result(backend(), g, "cpu")
    d = res.to_dict()
    assert d["family"] == "graph" and d["extra"]["check"] == "graph" and d["mode"] == "DECODE"
    assert GraphCase.from_json(d["repro"].split("'")[1]) == g  # the repro replays the whole sequence
    assert "graph" in summary_table([d]).splitlines()[2]
    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))
    assert main(["repro", g.to_json(), "--backend", "flashinfer_dec_tc", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr().out
    assert "PASS: 2 replays within budget" in out and json.loads(out[out.index("{") :])["family"] == "graph"
    assert main(["repro", g.to_json(), "--backend", "torch_native", "--device", "cpu"]) == NOTHING_CHECKED
    assert "not capturable" in capsys.readouterr().out


GRAPH_SHAPES = {
    "a smaller batch after a larger one": lambda g: any(
        a.batch_size > b.batch_size for a, b in zip(g.batches, g.batches[1:])
    ),
    "fewer real requests than the captured size": lambda g: any(
        padded_size(capture_sizes(g.max_batch), c.batch_size) > c.batch_size for c in g.batches
    ),
    "five batches": lambda g: len(g.batches) == 5,
    "a tree in verify": lambda g: any(
        r.tree and any(p != j - 1 for j, p in enumerate(r.tree)) for r in g.requests
    ),
    "a captured size past 8": lambda g: capture_sizes(g.max_batch)[-1] > 8,
}


@pytest.mark.parametrize("shape", GRAPH_SHAPES)
def test_graph_cases_reach_the_replay_shapes(shape):
    from hypothesis import Phase, find, settings

    from harness.search.profiles import SIZES
    from harness.search.strategies import graph_cases

    caps = backends.load("flashinfer_paged").capabilities
    family = "verify" if "verify" in shape else "draft_extend_v2"
    found = find(
        graph_cases(family, False, caps, SIZES["ci"]),
        GRAPH_SHAPES[shape],
        settings=settings(max_examples=500, database=None, deadline=None, phases=[Phase.generate]),
    )
    assert GRAPH_SHAPES[shape](found)


def test_a_deterministic_capture_plans_its_dummy_batch_at_the_limits_so_the_split_kernel_is_captured():
    """FlashInfer's run() picks the split or the unsplit kernel from the plan, and the capture freezes
    it: in deterministic mode the dummy batch is planned at max_kv keys (a split at the limits), not
    at the fill value, so a replay whose context needs several chunks runs the split kernel."""
    g = GraphCase((decode(3, deterministic=True), decode(70, deterministic=True)), 1, 80)
    fake.reset()
    assert replay_result(backend(), g, "cpu").status == "pass"
    plans = [a for a in fake.calls("decode.plan") if a["cuda_graph"]]
    assert [int(x) for x in plans[0]["seq_lens"].tolist()] == [80]  # the capture's dummy request
    assert [int(x) for x in plans[1]["seq_lens"].tolist()] == [4]  # the first replay's
    fake.reset()
    plain = GraphCase((decode(3), decode(70)), 1, 80)
    assert replay_result(backend(), plain, "cpu").status == "pass"
    capture = next(a for a in fake.calls("decode.plan") if a["cuda_graph"])
    assert [int(x) for x in capture["seq_lens"].tolist()] == [1]  # the fill value


def test_flashinfer_paged_refuses_deterministic_mode_under_a_graph_with_the_measured_reason():
    case = Case(mode="DRAFT_EXTEND_V2", requests=(Request(30, 4),), deterministic=True, **H)
    paged = backends.load("flashinfer_paged")
    assert "query tile" in paged.graph_supports(case)
    assert paged.graph_supports(dataclasses.replace(case, deterministic=False)) is None


def graph_library_confirms(monkeypatch, wrong: bool = True) -> None:
    """The graph entry's confirmation stubbed: FlashInfer called directly on the GraphCase is `wrong`
    (the fake does not model the library's bug; tests/test_flashinfer_gpu.py runs the real one)."""
    stand_in = [
        dataclasses.replace(i, confirm=lambda g, device: wrong) if i.on_replay else i
        for i in known_issues.KNOWN_ISSUES
    ]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))
    monkeypatch.setattr(known_issues, "_CONFIRMED", {})


def test_a_graph_known_issue_excuses_a_replay_failure_on_its_version_only(monkeypatch):
    """flashinfer-graph-unsplit-plan (FlashInfer writes the split bookkeeping only when a plan splits):
    a deterministic dec_tc graph failure with an unsplit plan is xfail on the releases it names, where
    the library called directly is wrong on it too, and a failure on any other; the same failure on
    the eager path is not excused."""
    wrong = next(m for m in MUTANTS if m.name.endswith("replay_capture_seq_lens")).make()
    wrong = fake.on_cpu(wrong)
    wrong.name = "flashinfer_dec_tc"
    g = GraphCase((decode(40, 3, deterministic=True), decode(7, 2, deterministic=True)), 2, 80)
    assert known_issues.has_unsplit_plan(g, FlashInferDecTC.split_tokens)  # the second replay (chunk 16)
    graph_library_confirms(monkeypatch)
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.6.18.post1")
    res = replay_result(wrong, g, "cpu")
    assert res.status == "xfail" and res.reason.startswith("known issue flashinfer-graph-unsplit-plan (")
    assert "known_issues/flashinfer_graph_unsplit_plan.py" in res.reason and "replay " in res.reason
    assert not known_issues.excuse("flashinfer_dec_tc", g.layer, "err", "cpu")[0]  # eager: not reached
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.7.1")
    assert replay_result(wrong, g, "cpu").status == "fail"


def test_a_graph_failure_the_library_gets_right_is_the_glues(monkeypatch):
    """The same failure, on a release the entry names, where FlashInfer called directly is right (or,
    as on this CPU, cannot run the graph at all): a failure, saying why it is not excused."""
    wrong = fake.on_cpu(next(m for m in MUTANTS if m.name.endswith("replay_capture_seq_lens")).make())
    wrong.name = "flashinfer_dec_tc"
    g = GraphCase((decode(40, 3, deterministic=True), decode(7, 2, deterministic=True)), 2, 80)
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.6.18.post1")
    monkeypatch.setattr(known_issues, "_CONFIRMED", {})
    res = replay_result(wrong, g, "cpu")  # the real confirmation: no CUDA here, nothing confirmed
    assert res.status == "fail" and "not known issue flashinfer-graph-unsplit-plan" in res.reason
    graph_library_confirms(monkeypatch, wrong=False)
    assert replay_result(wrong, g, "cpu").status == "fail"


def test_a_graph_known_issue_excuses_a_capture_crash_and_keeps_its_traceback(monkeypatch):
    class FaultsAtCapture(FlashInferDecTC):
        def capture_metadata(self, state, bs):
            raise RuntimeError("CUDA error: operation not supported on global/shared address space")

    g = GraphCase((decode(40, 3, deterministic=True, window_left=9),), 2, 80)
    graph_library_confirms(monkeypatch)
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.6.18.post1")
    res = replay_result(fake.on_cpu(FaultsAtCapture()), g, "cpu")
    assert res.status == "xfail" and "capture: backend raised RuntimeError" in res.reason
    assert "Traceback" in res.extra["traceback"]  # isolation retires the worker on it
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.6.17")
    assert replay_result(fake.on_cpu(FaultsAtCapture()), g, "cpu").status == "crash"


@pytest.mark.parametrize(
    "g,unsplit",
    [
        (GraphCase((decode(40, 3), decode(2)), 2, 80), False),  # not deterministic: no fixed chunk
        (GraphCase((decode(40, 3, deterministic=True), decode(70, deterministic=True)), 2, 80), False),
        (GraphCase((decode(40, 3, deterministic=True), decode(7, deterministic=True)), 2, 80), True),
        (GraphCase((decode(9, 3, deterministic=True),), 2, 16), False),  # no plan splits, no window
        (GraphCase((decode(40, 30, deterministic=True, window_left=9),), 2, 80), True),  # window < chunk
    ],
)
def test_the_plans_flashinfer_gets_wrong_are_a_short_replay_after_a_split_capture_or_a_window_under_it(
    g, unsplit
):
    assert known_issues.has_unsplit_plan(g, 16) == unsplit


def test_the_pinned_graphs_are_checked_first_in_their_family(monkeypatch):
    """harness/search/pinned.py's GraphCases (the split capture then unsplit replay that FlashInfer
    gets wrong) run in every search of their family, not only when hypothesis draws them."""
    from harness.run.graph_suite import pinned_graphs

    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))
    profiles.load("ci")
    records = []
    run(GraphTarget("flashinfer_dec_tc", "cpu", "graph", "full", "decode"), records.append)
    (pin,) = pinned_graphs("decode", windowed=False)
    assert pin.max_kv == 2049 and pin.layer.deterministic
    assert [r.status for r in records if r.repro_target == pin] == ["pass"]


def test_a_sequence_whose_reference_no_output_could_fail_is_refused_not_passed(monkeypatch, capsys):
    """k_scale = v_scale = 1e30 round every cached value to FP8 code 0: each batch's exact reference is
    all 0, its budget 0, and an output of zeros (a graph that attends to nothing) meets it. The replay
    check refuses the sequence in one line before capturing, as the numeric check refuses such a case,
    and `repro` says nothing was checked; scales that keep the values are judged and pass."""
    from harness.cli import main
    from harness.run.repro import NOTHING_CHECKED

    fp8 = dict(kv_dtype="float8_e4m3fn", k_scale=1e30, v_scale=1e30)
    vacuous = GraphCase((decode(40, 3, seed=1, **fp8), decode(70, seed=2, **fp8)), 2, 80)
    fake.reset()
    res = replay_result(backend(), vacuous, "cpu")
    assert res.status == "skip", res.reason
    assert res.reason.startswith("replay 0: refused: every element of the exact reference is 0 ")
    assert "\n" not in res.reason and not fake.calls("decode.plan")  # refused before any capture
    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))
    code = main(["repro", vacuous.to_json(), "--backend", "flashinfer_dec_tc", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == NOTHING_CHECKED and "PASS" not in out and "every element of the exact reference" in out
    judged = vacuous.replace_layer(k_scale=0.5, v_scale=3.7)
    assert replay_result(backend(), judged, "cpu").status == "pass"


def engine_confirms(monkeypatch, issue_id: str, wrong: bool) -> list:
    """Known issue `issue_id`'s confirmation stubbed: the engine called directly is `wrong` (no sglang
    nor vLLM here); returns the cases it was asked about."""
    asked = []
    stand_in = [
        dataclasses.replace(i, confirm=lambda g, device: asked.append(g) or wrong) if i.id == issue_id else i
        for i in known_issues.KNOWN_ISSUES
    ]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))
    monkeypatch.setattr(known_issues, "_CONFIRMED", {})
    return asked


@pytest.mark.parametrize(
    "name,issue,release,g",
    [
        # sglang's graph forward reads the layer's window, 0 read as none: the second replay has two keys
        (
            "sglang_fa3",
            "sglang-window-zero",
            "0.5.17",
            GraphCase((decode(0, window_left=0), decode(1, window_left=0)), 1, 40),
        ),
        # vLLM's FA3 plans a replay whose requests fit the window for a kernel without one
        (
            "vllm_flash_attn",
            "vllm-fa3-graph-window-metadata",
            "0.26.0",
            GraphCase((decode(0, window_left=3), decode(2, window_left=3)), 1, 40),
        ),
    ],
)
def test_an_engine_graph_failure_its_known_issue_reaches_is_xfail_where_the_engine_confirms_on_the_graph(
    monkeypatch, name, issue, release, g
):
    """The H200's window graphs on sglang_fa3 and vllm_flash_attn: a replay failure there is the engine's
    where the engine, asked about this GraphCase, is wrong too; the glue's where it is right."""
    wrong = fake.on_cpu(next(m for m in MUTANTS if m.name.endswith("replay_capture_seq_lens")).make())
    wrong.name = name
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: release)
    asked = engine_confirms(monkeypatch, issue, wrong=True)
    res = replay_result(wrong, g, "cpu")
    assert res.status == "xfail" and res.reason.startswith(f"known issue {issue} ("), res.reason
    assert asked == [g]
    engine_confirms(monkeypatch, issue, wrong=False)
    res = replay_result(wrong, g, "cpu")
    assert res.status == "fail" and f"not known issue {issue}" in res.reason


def test_a_replay_crash_is_excused_only_by_an_issue_that_can_fault_the_kernel(monkeypatch):
    """sglang-window-zero makes a forward attend over too many keys, never fault: a crash on a graph it
    reaches and confirms is still a crash; vLLM's FA3 window entry (its kernel reads metadata laid out
    for another) excuses one where it confirms."""

    class FaultsAtReplay(FlashInferDecTC):
        def replay_metadata(self, state, batch, bs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    sglang = fake.on_cpu(FaultsAtReplay())
    sglang.name = "sglang_fa3"
    g = GraphCase((decode(0, window_left=0), decode(1, window_left=0)), 1, 40)
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.5.17")
    engine_confirms(monkeypatch, "sglang-window-zero", wrong=True)
    assert replay_result(sglang, g, "cpu").status == "crash"
    vllm = fake.on_cpu(FaultsAtReplay())
    vllm.name = "vllm_flash_attn"
    g = GraphCase((decode(0, window_left=3), decode(2, window_left=3)), 1, 40)
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: "0.26.0")
    engine_confirms(monkeypatch, "vllm-fa3-graph-window-metadata", wrong=True)
    res = replay_result(vllm, g, "cpu")
    assert res.status == "xfail" and "replay 0: backend raised RuntimeError" in res.reason, res.reason
