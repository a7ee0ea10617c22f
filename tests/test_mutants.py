"""Every check is shown able to fail: each CPU mutant must be caught, with a shrunk counterexample.

CI hunts each mutant in the first family it names (`make mutants` hunts every family). GPU mutants
are hunted on CUDA and skip here with the reason. `python -m harness mutants`: the table, the JSON, and
an exit status that fails when a mutant survives or a hunt errors (skips, with their reasons, do
neither)."""

import itertools
import json
from types import SimpleNamespace

import pytest

import harness.mutants
from harness import hunts
from harness.backends.torch_native import TorchNative
from harness.cli import main
from harness.core.modes import family_of
from harness.mutants import CHECKS, Mutant, by_name, catalogue, hunt, named
from harness.search import profiles
from tests.helpers import case

MUTANTS = catalogue()
CPU = [m for m in MUTANTS if m.device == "cpu"]
GPU = [m for m in MUTANTS if m.device == "cuda"]
# A determinism mutant's passing shrink candidates each cost a whole invariance check (a dozen
# batches, up to 64 requests): CI shrinks those for a few runs only. On a GPU, where each shrink
# step of a crash would cost a fresh worker and device time is scarce, numeric hunts shrink for 20.
INVARIANCE_SHRINK_RUNS = 4
GPU_SHRINK_RUNS = 20


def _id(m) -> str:
    return f"{m.name}@{m.families[0]}"


def _hunt(mutant, device):
    shrink = INVARIANCE_SHRINK_RUNS if mutant.check == "invariance" else None
    if device == "cuda" and shrink is None:
        shrink = GPU_SHRINK_RUNS
    d = hunt(mutant, mutant.families[0], device=device, shrink_runs=shrink)
    if d.skipped:
        pytest.skip(d.skipped)
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived: {d.reason}"
    assert d.examples >= 1 and d.status in ("fail", "crash", "hang"), (d.status, d.reason)
    prefixes = [r.prefix_len for r in d.shrunk.requests]
    assert family_of(d.shrunk.mode, prefixes) == mutant.families[0], d.shrunk  # the hunted family's
    if mutant.expect:
        assert d.status == mutant.expect, d.reason
    print(
        f"{mutant.name} on {mutant.families[0]}: caught ({d.status}) after {d.examples} examples, "
        f"{d.seconds:.2f}s; shrunk to {d.shrunk.to_json()}"
    )
    return d


@pytest.mark.parametrize("mutant", CPU, ids=[_id(m) for m in CPU])
def test_cpu_mutant_is_caught(mutant):
    profiles.load("ci")
    d = _hunt(mutant, "cpu")
    if mutant.check == "numeric":
        assert d.shrunk.batch_size == 1, d.shrunk


@pytest.mark.parametrize("mutant", GPU, ids=[_id(m) for m in GPU])
def test_gpu_mutant_is_caught(mutant):
    profiles.load("gpu")
    try:
        _hunt(mutant, "cuda")
    finally:
        profiles.load("ci")


def test_catalogue_is_well_formed():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    for m in MUTANTS:
        assert "~" in m.name and m.families and m.check in CHECKS, m
        backend = m.make()
        assert backend.name == m.name
        # An engine mutant names the engine's own method ("TorchNativeAttnBackend._causal_mask"): its
        # adapter overrides only `backend_class`, which returns the engine class with that one change.
        expected = "backend_class" if "." in m.method else m.method
        assert hasattr(type(backend), expected), f"{m.name} overrides no method {expected!r}"
        overridden = [k for k in vars(type(backend)) if callable(vars(type(backend))[k]) and k != "__init__"]
        assert overridden == [expected], f"{m.name} must override exactly {expected}, not {overridden}"


REQUIRED_CPU_CLASSES = {
    # docs/design.md's table
    "torch_split~ragged_no_window",
    "torch_split~prefix_window_at_end",
    "torch_native~de_v2_prefix_only",
    "torch_split~split_dropped_swa",
    "torch_split~split_dropped_cross",
    "torch_native~window_ignored",
    "torch_native~swa_untranslated",
    # the list
    "torch_native~window_short",
    "torch_native~window_long",
    "torch_native~verify_window_flat",
    "torch_native~soft_cap_missing",
    "torch_native~soft_cap_after_mask",
    "torch_split~lse_base2_as_natural",
    "torch_native~gqa_modulo",
    "torch_native~sm_scale_default",
    "torch_native~cross_offset",
    "torch_native~stale_page",
    "torch_native~de_v2_double_counted",
    "torch_native~swa_untranslated_exact",
    # encoder-only
    "torch_native~encoder_causal",
    "torch_native~window_wrong_side",
    "torch_native~window_at_end",
    "torch_native~two_sided_left_only",
    # an FP8 KV cache
    "torch_native~fp8_k_scale_for_v",
    "torch_native~fp8_scale_twice",
    "torch_native~fp8_scale_missing",
    "torch_native~fp8_read_as_case_dtype",
    "torch_split~fp8_k_scale_for_v",
}


def test_every_required_bug_class_has_a_cpu_mutant():
    assert REQUIRED_CPU_CLASSES <= {m.name for m in CPU}


GRAPH = [m for m in GPU if m.check == "graph"]


@pytest.mark.parametrize("mutant", GRAPH, ids=[_id(m) for m in GRAPH])
def test_gpu_replay_mutant_passes_the_eager_suite(mutant):
    """A replay-path mutant changes no eager run: the family's eager check (batch invariance for the
    split mutant, numeric otherwise) finds nothing on the GPU (tests/test_graph_replay.py: the CPU)."""
    import dataclasses

    profiles.load("gpu")
    try:
        eager = "invariance" if mutant.force and mutant.force.get("deterministic") else "numeric"
        d = hunt(dataclasses.replace(mutant, check=eager), mutant.families[0], max_examples=20, device="cuda")
    finally:
        profiles.load("ci")
    if d.skipped:
        pytest.skip(d.skipped)
    assert not d.caught and d.examples > 0, d.reason


def _fake(name, make, **kw):
    return Mutant(
        name=name, bug="a test mutant", method="run", families=("decode",), windowed=False, make=make, **kw
    )


def _broken():
    raise RuntimeError("this factory is broken")


CORRECT = _fake("torch_native~not_a_bug", named(TorchNative, "torch_native~not_a_bug"))


def test_a_caught_mutant_is_reported_with_its_shrunk_case(tmp_path, capsys):
    out = tmp_path / "mutants.json"
    argv = ["mutants", "--mutant", "torch_native~stale_page", "--device", "cpu", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "torch_native~stale_page" in text and "CAUGHT (fail)" in text and "B=1 q=1" in text
    data = json.loads(out.read_text())
    assert data["passed"] is True and data["meta"]["torch"]
    rows = data["rows"]
    assert [(r["family"], r["outcome"]) for r in rows] == [("decode", "caught"), ("prefix", "caught")]
    assert rows[0]["examples"] >= 1 and rows[0]["shrunk"]["requests"] and "NaN" in rows[0]["reason"]


def test_a_survivor_fails_the_run(monkeypatch, capsys):
    monkeypatch.setattr(hunts, "every_mutant", lambda exact_pool=False: [CORRECT])
    assert main(["mutants", "--device", "cpu", "--max-examples", "3"]) == 1
    text = capsys.readouterr().out
    assert "SURVIVED" in text and "0 caught, 1 survived" in text


def test_errors_and_skips_are_rows_and_the_run_goes_on():
    pairs = [
        (_fake("torch_native~broken", _broken), "decode"),
        (_fake("fa9~gpu_only", named(TorchNative, "fa9~gpu_only"), device="cuda"), "decode"),
        (by_name("torch_native~stale_page"), "decode"),
    ]
    rows = hunts.run(pairs, ["cpu"])
    assert [r.outcome for r in rows] == ["error", "skip", "caught"]
    assert "this factory is broken" in rows[0].reason
    assert "GPU mutant" in rows[1].reason
    assert not hunts.passed(rows)
    assert hunts.passed(rows[1:])
    table = hunts.table(rows)
    assert "ERROR" in table and "not caught:" in table


def test_cuda_rows_skip_with_the_reason_on_a_cpu_machine():
    rows = hunts.run([(by_name("torch_native~stale_page"), "decode")], ["cuda"])
    assert rows[0].outcome == "skip" and "CUDA" in rows[0].reason
    assert profiles.current() == "ci"  # the gpu profile it loaded for CUDA is undone


def test_exact_pool_variants_derive_only_where_a_backend_has_none():
    hybrid = _fake(
        "fa9~untranslated", named(TorchNative, "fa9~untranslated"), force={"hybrid_swa_pool": True}
    )
    mutants = [
        hybrid,
        by_name("torch_native~swa_untranslated"),
        by_name("torch_native~swa_untranslated_exact"),
    ]
    derived = hunts.exact_pool_variants(mutants)
    assert [m.name for m in derived] == ["fa9~untranslated+exact_pool"]
    assert derived[0].force == {"hybrid_swa_pool": True, "swa_pool_exact": True}


def test_selection_and_unknown_names(capsys):
    pairs = hunts.select(hunts.every_mutant(), ["split_dropped"], ["torch_split"], ["cross"])
    assert [(m.name, f) for m, f in pairs] == [("torch_split~split_dropped_cross", "cross")]
    firsts = hunts.select(hunts.every_mutant(), ["torch_native~window_ignored"], first_family=True)
    assert [(m.name, f) for m, f in firsts] == [("torch_native~window_ignored", "prefix")]
    assert main(["mutants", "--mutant", "no_such_bug"]) == 2
    assert "no mutant matches" in capsys.readouterr().err
    assert main(["mutants", "--backend", "torch_split", "--list"]) == 0
    assert "torch_split~lse_base2_as_natural" in capsys.readouterr().out


def test_case_size():
    assert hunts.case_size(case("EXTEND", ((3, 4), (6, 1)))) == "B=2 q=5 kv=14"
    assert hunts.case_size(case("CROSS", ((0, 2, 9),))) == "B=1 q=2 kv=9"


def test_seconds_run_to_the_first_failure_and_hunt_seconds_over_the_whole_hunt(monkeypatch):
    """A clock that moves one second per reading, not the machine's: the row reads it at its start
    and end, the hunt at its start and at the first failure (shrinking reads it no more)."""
    ticks = itertools.count()
    clock = SimpleNamespace(perf_counter=lambda: float(next(ticks)))
    monkeypatch.setattr(harness.mutants, "time", clock)
    monkeypatch.setattr(hunts, "time", clock)
    row = hunts.hunt_row(by_name("torch_native~window_ignored"), "prefix", "cpu", 200, shrink_runs=3)
    assert row.outcome == "caught" and row.examples >= 1
    assert (row.seconds, row.hunt_seconds) == (1.0, 3.0)  # readings 0 (row), 1 (hunt), 2 (failure), 3 (row)
