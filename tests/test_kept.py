"""The same commit gives the same verdict: a run records the set it drew, and a failure a nightly
found is kept in a pins file that every later run checks first (harness/search/kept.py,
harness/report/trend.py, docs/ci.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import core as hypothesis_core
from hypothesis import settings

from harness import backends
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import by_name
from harness.report import results_json, trend
from harness.run import check
from harness.run.suite import Target, run_family
from harness.search import kept, profiles

WINDOW_IGNORED = "torch_native~window_ignored"  # sees the whole context: a windowed case fails


def record(status: str, case: Case, test: str = "t", **extra) -> dict:
    return {
        "status": status, "backend": "torch_native", "device": "cpu", "family": "prefix", "test_id": test,
        "case": case.to_dict(), "mode": str(case.mode), "features": [], "reason": "",
        **({"extra": extra} if extra else {}),
    }


PREFIX = Case(mode="EXTEND", requests=(Request(40, 8),), window_left=3)
GRAPH = GraphCase((Case(mode="DECODE", requests=(Request(9, 1),)),), 1, 16)


def doc(*records: dict) -> dict:
    return results_json.build(list(records), {"id": "r", "profile": "ci"}, {})


def test_every_failing_case_is_kept_once_and_graphs_whole(tmp_path):
    pins = tmp_path / "pins.json"
    results = doc(
        record("fail", PREFIX),
        record("pass", PREFIX.replace(window_left=5)),
        record("crash", PREFIX, test="u"),  # the same case failing in another test: kept once
        record("fail", GRAPH.layer, check="graph", graph_case=GRAPH.to_dict()),
    )
    assert kept.add_failures(results, pins) == 2
    assert kept.add_failures(results, pins) == 0
    data = json.loads(pins.read_text())
    assert data["cases"] == {"prefix": [PREFIX.to_dict()]} and data["graphs"] == {"decode": [GRAPH.to_dict()]}


def test_the_suite_reads_the_pins_file_its_run_names(tmp_path, monkeypatch):
    pins = tmp_path / "pins.json"
    kept.add_failures(doc(record("fail", PREFIX)), pins)
    monkeypatch.delenv(kept.PINS_ENV, raising=False)
    assert kept.cases("prefix") == []
    monkeypatch.setenv(kept.PINS_ENV, str(pins))
    assert kept.cases("prefix") == [PREFIX] and kept.cases("decode") == []


@pytest.mark.parametrize(
    "text,problem",
    [
        ("{", "Expecting"),
        ('{"format": "x"}', "not an attn-harness pins file"),
        ('{"format": "attn-harness-pins", "cases": {"prefix": [{}]}}', r"cases\['prefix'\]\[0\]: Case"),
    ],
)
def test_a_bad_pins_file_is_refused_in_one_line_before_the_check_runs(tmp_path, text, problem):
    bad = tmp_path / "pins.json"
    bad.write_text(text)
    with pytest.raises(check.RequestError, match=problem):
        check.prepare(check.CheckRequest(backends=("torch_native",), pins=bad, reports=tmp_path))


def test_the_drawn_set_has_a_fingerprint_and_the_trend_says_when_two_runs_differ():
    a = doc(record("pass", PREFIX), record("fail", PREFIX.replace(window_left=5)))
    b = doc(record("fail", PREFIX.replace(window_left=5)), record("pass", PREFIX))  # another order, statuses
    c = doc(record("pass", PREFIX))
    assert a["run"]["draws"] == b["run"]["draws"] and a["run"]["draws"]["cases"] == 2
    assert a["run"]["draws"] != c["run"]["draws"]
    assert "the same 2 cases drawn" in trend.compare(a, b).line()
    assert "another set of cases drawn: 1" in trend.compare(c, a).line()
    assert trend.fingerprint([]) == {"fingerprint": trend.fingerprint([])["fingerprint"], "cases": 0}


@pytest.fixture
def restored_profiles():
    """Profiles as registered at import, after a test re-registered one (fix_draws)."""
    saved = {name: settings.get_profile(name) for name in profiles.PROFILES}
    yield
    for name, profile in saved.items():
        settings.register_profile(name, profile)
    hypothesis_core.global_force_seed = None
    profiles.load("ci")


def search(mutant: str, monkeypatch) -> list:
    """One prefill (windowed) search of the mutant, as torch_native on the CPU (no case of this family
    is pinned in harness/search/pinned.py); its records (it fails)."""
    records: list = []
    monkeypatch.setattr(backends, "load", lambda name: by_name(mutant).make())
    with pytest.raises(AssertionError):
        run_family(Target("torch_native", "cpu", "prefill", "swa"), records.append)
    return records


def test_a_failure_a_nightly_found_is_replayed_first_by_the_next_pr_run(
    tmp_path, monkeypatch, restored_profiles
):
    """A seeded, not derandomized search (a nightly's) catches the mutant; its failing cases land in
    the pins file; a derandomized ci run replays a kept case first and fails on it. The case replayed
    is the nightly's first failure, before shrinking: not one the ci search draws itself."""
    monkeypatch.setenv("ATTN_HARNESS_ISOLATE", "0")
    monkeypatch.setenv(profiles.SEED_ENV, "20261129")
    profiles.load("dev")
    profiles.fix_draws()
    assert not profiles.derandomized()
    nightly = search(WINDOW_IGNORED, monkeypatch)
    failing = [r for r in nightly if r.status == "fail"]
    assert failing
    pins = tmp_path / "pins.json"
    assert kept.add_failures(doc(*(r.to_dict() for r in nightly)), pins) >= 1
    assert [Case.from_dict(c) for c in kept.read(pins)["cases"]["prefill"]] == list(
        dict.fromkeys(r.case for r in failing)
    )
    first = tmp_path / "first.json"  # the first failure found, as the only pin
    kept.add_failures(doc(failing[0].to_dict()), first)
    assert failing[0].case != failing[-1].case  # shrunk since
    monkeypatch.delenv(profiles.SEED_ENV)
    monkeypatch.setenv(kept.PINS_ENV, str(first))
    profiles.load("ci")
    assert profiles.derandomized()
    pr = search(WINDOW_IGNORED, monkeypatch)
    assert pr[0].case == failing[0].case and pr[0].status == "fail"


def test_a_seed_that_is_not_a_number_is_refused(monkeypatch, restored_profiles):
    monkeypatch.setenv(profiles.SEED_ENV, "tonight")
    with pytest.raises(ValueError, match="ATTN_HARNESS_SEED='tonight' must be a non-negative integer"):
        profiles.fix_draws()


def test_the_run_object_says_whether_its_draws_were_fixed():
    from harness.run import RunInfo

    info = RunInfo(
        id="r", started="s", elapsed_s=1, profile="ci", command="c", exit_status=0, derandomized=True
    )
    assert info.to_dict()["derandomized"] is True


def test_the_check_replays_a_pins_file_and_keeps_its_failures_in_another(tmp_path):
    """check --pins names the file to the suite's processes; check --keep-failures adds the run's
    failing cases (from its results.json) to its file."""
    pins = tmp_path / "pins.json"
    kept.add_failures(doc(record("fail", PREFIX)), pins)
    request = check.CheckRequest(backends=("torch_native",), pins=pins, reports=tmp_path / "reports")
    assert check.prepare(request).env[kept.PINS_ENV] == str(pins.resolve())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    results_json.dump(run_dir / "results.json", doc(record("fail", PREFIX.replace(window_left=5))))
    result = check.RunResult(exit_status=1, run_dir=run_dir, latest=run_dir)
    said = []
    check.keep_failures(check.CheckRequest(keep_failures=pins), result, said.append)
    assert len(kept.read(pins)["cases"]["prefix"]) == 2 and said == [
        f"attn-harness check: 1 new failing case(s) kept in {pins}"
    ]
