"""Record mode (harness/run/record_mode.py): a search in record mode draws exactly the cases a real
passing run checks, records them, and checks none; a pytest run in record mode says so and writes
no results."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from hypothesis import Phase, settings

from harness.run import isolation, record_mode
from harness.run.speed.settings import ISOLATE_ENV, RECORD_ENV
from harness.run.suite import Target, run_family
from harness.search import profiles

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def settings_profile(chosen: settings):  # noqa: ANN201
    """`chosen` as hypothesis's default settings for the block (a temporary registered profile)."""
    settings.register_profile("record-mode-test", chosen)
    settings.load_profile("record-mode-test")
    try:
        yield
    finally:
        profiles.load("ci")


def _checked_and_recorded(monkeypatch, tmp_path) -> tuple[list, list, list]:
    """torch_native's decode family on the CPU, once checked (the cases its check ran) and once in
    record mode (the cases recorded; the results the search saw)."""
    monkeypatch.delenv(RECORD_ENV, raising=False)
    monkeypatch.setenv(ISOLATE_ENV, "0")
    checked, real_check = [], isolation.check

    def logging_check(backend, case, device):  # noqa: ANN001, ANN202
        res = real_check(backend, case, device)
        if res.status != "skip":
            checked.append(case)
        return res

    monkeypatch.setattr(isolation, "check", logging_check)
    target = Target("torch_native", "cpu", "decode", "full")
    run_family(target)
    really_checked = list(checked)
    file = tmp_path / "drawn.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(file))
    results = []
    run_family(target, results.append)
    assert checked == really_checked  # nothing was checked in record mode
    return really_checked, record_mode.read(str(file)), results


def test_record_mode_draws_what_a_real_run_checks_with_the_gpu_profiles_phases(monkeypatch, tmp_path):
    """The gpu profile searches without hypothesis's target phase, and so reports no err/budget to
    `target()` (hypothesis's generate phase keeps a mutated example only if it scores as high, and
    record mode measures nothing), so the two runs draw the same cases in the same order, at the gpu
    profile's 40 examples a search: the warm-up compiles what its check draws."""
    profiles.load("ci")
    assert Phase.target in settings.default.phases  # the other profiles keep it (the test below)
    gpu = settings.get_profile("gpu")
    with settings_profile(settings(settings.default, phases=gpu.phases, max_examples=gpu.max_examples)):
        checked, recorded, results = _checked_and_recorded(monkeypatch, tmp_path)
    assert len(checked) >= 30
    assert [r["case"] for r in recorded] == checked
    assert {(r["backend"], r["family"], r["kind"], r["device"]) for r in recorded} == {
        ("torch_native", "decode", "numeric", "cpu")
    }
    assert {r.reason for r in results} == {record_mode.REASON}


def test_record_mode_draws_a_real_runs_cases_up_to_its_target_phase(monkeypatch, tmp_path):
    """With the profile's own phases: hypothesis starts targeting after max(max_examples // 2, 10)
    valid examples (its engine's `optimise_at`); every case before that is the same."""
    profiles.load("ci")
    checked, recorded, _ = _checked_and_recorded(monkeypatch, tmp_path)
    before_targeting = max(settings.default.max_examples // 2, 10)
    assert [r["case"] for r in recorded][:before_targeting] == checked[:before_targeting]


def test_a_pytest_run_in_record_mode_says_so_and_writes_no_results(tmp_path):
    file, results = tmp_path / "drawn.jsonl", tmp_path / "results.json"
    cmd = [sys.executable, "-m", "pytest", "cases/test_decode.py", "-q", "-p", "harness.run.pytest_plugin"]
    cmd += ["-k", "torch_native and full", "--harness-results", str(results), "-p", "no:cacheprovider"]
    env = {**os.environ, RECORD_ENV: str(file), "ATTN_HARNESS_BACKENDS": "torch_native"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "RECORD MODE" in out.stdout and "no results or report written" in out.stdout
    assert not results.exists()
    assert len(record_mode.read(str(file))) >= 10


def test_a_graph_replay_search_records_its_graph_cases(monkeypatch, tmp_path):
    """flex_compiled's warm-up learns its captured launches this way: every drawn GraphCase is
    recorded as kind `graph`, read back as a GraphCase, and nothing is captured or replayed."""
    from harness import backends
    from harness.checks import replay
    from harness.core.graph_case import GraphCase
    from harness.run.graph_suite import GraphTarget, run
    from tests import flashinfer_fake as fake

    fake.install(monkeypatch)
    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))

    def replayed(*args):  # noqa: ANN002, ANN202
        raise AssertionError("record mode captured or replayed a graph")

    monkeypatch.setattr(isolation, "check_replay", replayed)
    monkeypatch.setattr(replay, "replay_result", replayed)
    file = tmp_path / "drawn.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(file))
    monkeypatch.setenv(ISOLATE_ENV, "0")
    profiles.load("ci")
    results = []
    run(GraphTarget("flashinfer_dec_tc", "cpu", "graph", "full", "decode"), results.append)
    recorded = record_mode.read(str(file))
    assert len(recorded) >= 3 and {r["kind"] for r in recorded} == {"graph"}
    assert all(isinstance(r["case"], GraphCase) for r in recorded)
    assert {r.reason for r in results if r.status == "pass"} == {record_mode.REASON}
