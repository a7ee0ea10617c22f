"""`python -m harness mutants`: the table, the JSON, and an exit status that fails when a mutant
survives or a hunt errors (skips, with their reasons, do neither)."""

import itertools
import json
from types import SimpleNamespace

import harness.mutants
from harness import hunts
from harness.backends.torch_native import TorchNative
from harness.cli import main
from harness.mutants import Mutant, by_name, named
from harness.search import profiles
from tests.helpers import case


def _fake(name, make, **kw):
    return Mutant(name, "a test mutant", "run", ("decode",), False, make, **kw)


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
