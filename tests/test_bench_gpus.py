"""The bench's gpus section (harness/tools/bench/gpus.py), against a stand-in harness: priming checks
until one compiles nothing, then the check on the first GPU and on every GPU, each GPU's busy time and
the longest part read from its results.json, the speedup judged against its target; a skip off CUDA
or with one GPU, and a failed check failing the bench."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness import cli
from harness.tools import bench
from harness.tools.bench import gpus, harness_child
from harness.tools.bench.table import render
from tests.helpers import fresh_cache

FAKE = Path(__file__).with_name("coldstart_fake_harness.py")


def _fake(monkeypatch, tmp_path) -> Path:
    """The stand-in harness in a fresh cache directory; returns its call log."""
    monkeypatch.setattr(harness_child, "HARNESS", [sys.executable, str(FAKE)])
    cache = fresh_cache(monkeypatch, tmp_path)
    return cache.parent / "calls.log"


def test_primes_until_warm_then_one_gpu_then_every_gpu(monkeypatch, tmp_path):
    calls = _fake(monkeypatch, tmp_path)
    made: list[Path] = []
    real = gpus.tempfile.TemporaryDirectory

    def tracked(prefix: str):  # noqa: ANN202 - the context manager the section opens
        made.append(tmp_path / "tmp")
        made[-1].mkdir()
        return real(prefix=prefix, dir=made[-1])

    monkeypatch.setattr(gpus.tempfile, "TemporaryDirectory", tracked)
    rows = gpus.scaling("cuda", ["0", "1"], ["torch_native"], 60.0)
    assert [r.run for r in rows] == ["prime", "prime", "one", "all"]
    assert [r.compiled for r in rows] == [2, 0, 0, 0]  # the second prime found the cache warm
    logged = calls.read_text().splitlines()
    assert [c.split(" --gpus ")[1].split()[0] for c in logged] == ["0,1", "0,1", "0", "0,1"]
    cache = str(tmp_path / "cache")
    assert all(f"--cache-dir {cache} --profile gpu --backend torch_native --device cuda" in c for c in logged)
    one, every = rows[2], rows[3]
    assert (one.gpus, every.gpus) == (["0"], ["0", "1"])
    assert one.busy == {"0": 75.0} and every.busy == {"0": 36.0, "1": 39.0}
    assert (one.processes, one.jobs, every.processes, every.jobs) == (6, 2, 6, 4)
    assert (every.longest, every.longest_seconds) == ("fake[1/6]", 15.0)
    assert (one.expected, every.expected) == (30.0, 15.0)  # the plan's, from run.expected_s
    assert [p["part"] for p in every.parts] == [f"fake[{i}/6]" for i in range(6)]
    assert every.parts[1] == {
        "part": "fake[1/6]",
        "gpu": "1",
        "seconds": 15.0,
        "expected_s": 10.0,
        "cases_s": 9.0,
    }
    assert (one.cases_s, every.cases_s) == (37.5, 45.0)  # the fake's cases are 20 % slower on two GPUs
    assert one.cases_growth is None and every.cases_growth == 0.2 and "slower cases" in every.bound
    assert (one.outside_s, every.outside_s) == (37.5, 30.0)  # the parts' seconds less their cases'
    assert "time outside cases" in every.bound  # 30 of 75 s, over OUTSIDE_BOUND
    line = next(x for x in render({"gpus": [vars(r) for r in rows]}).splitlines() if "speedup" in x)
    assert "outside their cases 30 of 75 (6 parts), against 38 of 75 (6) on one GPU; at most " in line
    assert all(r.cpu_seconds > 0 and r.cores == os.cpu_count() for r in rows)
    assert one.speedup is None and every.speedup == round(one.seconds / every.seconds, 3)
    assert (one.elapsed, every.elapsed) == (0.05, 0.05)  # results.json run.elapsed_s
    packed = (75.0 / 2 + one.seconds - 0.05) / (75.0 / 4 + every.seconds - 0.05)  # busy s over the slots
    cases = (37.5 / 2 + one.seconds - 0.05) / (45.0 / 4 + every.seconds - 0.05)  # cases' own s only
    assert (every.speedup_packed, every.speedup_cases) == (round(packed, 3), round(cases, 3))
    assert one.speedup_packed is None and one.speedup_cases is None
    assert every.verdict == ("met" if every.speedup >= gpus.SPEEDUP_TARGET else "MISSED")
    assert all(r.exit == 0 and r.reason == "" for r in rows)
    assert made and list(made[0].iterdir()) == []  # its results and reports were removed
    assert all(r.results == "" for r in rows)  # none kept: no place was given


def test_each_checks_results_are_kept_where_asked_and_named_in_its_row(monkeypatch, tmp_path):
    """Every case's seconds stay readable after the section (what bounded a run is in them)."""
    _fake(monkeypatch, tmp_path)
    kept = tmp_path / "bench-gpus"
    rows = gpus.scaling("cuda", ["0", "1"], None, 60.0, keep=kept)
    assert [Path(r.results).name for r in rows] == [
        "0-prime.json",
        "1-prime.json",
        "2-one.json",
        "3-all.json",
    ]
    for row in rows:
        parts = json.loads(Path(row.results).read_text())["run"]["parts"]
        assert [p["part"] for p in parts] == [p["part"] for p in row.parts]
    assert sorted(p.name for p in kept.iterdir()) == sorted(Path(r.results).name for r in rows)  # no reports


def test_judge_gives_the_speedup_its_verdict_and_what_bounds_it():
    def row(run: str, seconds: float, longest: float, code: int = 0, cpu: float = 0.0) -> gpus.GpuRow:
        times = dict(seconds=seconds, longest_seconds=longest, cpu_seconds=cpu, cores=4)
        return gpus.GpuRow(run=run, gpus=["0"], profile="gpu", backends=[], exit=code, **times)

    one, every = row("one", 100.0, 30.0), row("all", 50.0, 45.0)
    gpus.judge(one, every)
    assert (every.speedup, every.verdict, every.bound) == (2.0, "met", "longest part")
    one, every = row("one", 100.0, 30.0), row("all", 80.0, 30.0, cpu=255.0)  # 80 % of 4 cores is 256
    gpus.judge(one, every)
    assert (every.speedup, every.verdict, every.bound) == (1.25, "MISSED", "load")
    one, every = row("one", 100.0, 30.0), row("all", 80.0, 30.0, cpu=256.0)
    gpus.judge(one, every)
    assert every.bound == "host"
    one, every = row("one", 100.0, 30.0), row("all", 80.0, 64.0, cpu=300.0)
    gpus.judge(one, every)
    assert every.bound == "longest part and host"
    one, every = row("one", 100.0, 30.0, code=1), row("all", 50.0, 30.0)
    gpus.judge(one, every)
    assert (every.speedup, every.verdict, every.bound) == (None, "", "")
    assert every.speedup_packed is None and every.speedup_cases is None  # no parts read: no ceilings
    for outside, bound in ((29.9, "load"), (30.0, "time outside cases")):  # OUTSIDE_BOUND of 100 busy s
        one, every = row("one", 100.0, 30.0), row("all", 80.0, 30.0)
        every.busy, every.outside_s = {"0": 60.0, "1": 40.0}, outside
        gpus.judge(one, every)
        assert every.bound == bound


def test_the_ceilings_are_the_speedup_of_perfectly_packed_work_plus_each_command_s_own_time():
    """A measured 2 x H200 pair: one GPU 51.3 s (elapsed 47.6, 8 slots, parts 333.5 s, cases 230.7
    s), two 38.7 s (35.5, 16 slots, 432.9 s, 261.1 s): 1.32 measured, 1.50 packed, 1.67 at best."""

    def row(run: str, seconds: float, elapsed: float, jobs: int, busy: float, cases: float) -> gpus.GpuRow:
        r = gpus.GpuRow(
            run=run,
            gpus=["0"],
            profile="gpu",
            backends=[],
            seconds=seconds,
            exit=0,
            jobs=jobs,
            elapsed=elapsed,
        )
        r.busy, r.cases_s = {"0": busy}, cases
        return r

    one, every = row("one", 51.26, 47.58, 8, 333.5, 230.7), row("all", 38.71, 35.55, 16, 432.9, 261.1)
    gpus.judge(one, every)
    assert (every.speedup, every.speedup_packed, every.speedup_cases) == (1.324, 1.501, 1.669)
    assert every.speedup_cases < gpus.SPEEDUP_TARGET  # out of reach of any schedule of these parts
    one.elapsed = 0.0  # a check that kept no elapsed time: no ceilings
    gpus.judge(one, every)
    assert every.speedup_packed is None and every.speedup_cases is None


def test_off_cuda_or_with_one_gpu_it_is_a_skip_with_its_reason_and_runs_nothing(monkeypatch, tmp_path):
    calls = _fake(monkeypatch, tmp_path)
    for device, visible in (("cpu", []), ("cuda", ["0"])):
        (row,) = gpus.scaling(device, visible, None, 60.0)
        assert row.run == "skip" and row.exit is None
        seen = ",".join(visible) or "none"
        assert row.reason == f"needs CUDA and at least 2 visible GPUs (device {device}, visible: {seen})"
        doc = {"gpus": [vars(row)]}
        assert bench.passed(doc) is True
        assert f"  skipped: {row.reason}" in render(doc)
    assert not calls.exists()


def test_a_failed_check_stops_the_section_and_fails_the_bench(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_CHECK_EXIT", "1")
    (row,) = gpus.scaling("cuda", ["0", "1"], None, 60.0)
    assert row.run == "prime" and row.exit == 1 and row.reason.startswith("check exit 1: ")
    doc = {"gpus": [vars(row)]}
    assert bench.passed(doc) is False
    assert "  prime: check exit 1: " in render(doc)


def test_a_check_of_one_process_has_no_parts_to_compare_and_fails_the_bench(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_ONE_PROCESS", "1")
    rows = gpus.scaling("cuda", ["0", "1"], None, 60.0)
    assert [r.run for r in rows] == ["prime", "prime", "one", "all"] and all(r.exit == 0 for r in rows)
    for i, r in enumerate(rows):
        why = f"cannot read its {i}-{r.run}.json: the check ran as one pytest process"
        assert r.reason.startswith(why) and r.busy == {} and r.processes == 0
    assert bench.passed({"gpus": [vars(r) for r in rows]}) is False


def test_the_table_shows_each_run_and_the_speedup(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path)
    rows = gpus.scaling("cuda", ["0", "1"], None, 60.0)
    text = render({"gpus": [vars(r) for r in rows]})
    assert "gpus: check --profile gpu (every backend); cache warm: one GPU, then every visible GPU" in text
    assert "0:36 1:39" in text and "fake[1/6] 15 s" in text
    every = rows[-1]
    (line,) = [r for r in text.splitlines() if r.startswith("all ")]
    load = f"{every.cpu_seconds / (every.seconds * every.cores):.0%}"
    assert line.split()[2:5] == [f"{every.seconds:.2f}", "15.00", load]  # check s, planned s, host CPU
    longest = "fake[1/6] 15 s (GPU 1, planned 10, cases 9), fake[2/6] 14 s (GPU 0, planned 10, cases 8)"
    assert f"  all: longest parts: {longest}, " in text
    assert "  one: longest parts: fake[1/6] 15 s (GPU 0, planned 10, cases 8), " in text
    assert "prime: longest parts" not in text
    every = rows[-1]
    line = f"  speedup {every.speedup:.2f} on 2 GPUs (target 1.7: {every.verdict}); bound by {every.bound}"
    assert line + "; cases' own seconds +20% against one GPU (45 s)" in text
    ceilings = f"; at most {every.speedup_packed:.2f} packed perfectly, {every.speedup_cases:.2f} with no"
    assert ceilings + " part's time outside its cases" in text


def test_the_cli_section_runs_only_when_asked_for_and_skips_without_a_gpu(tmp_path):
    assert "gpus" in bench.SECTIONS and "gpus" not in bench.DEFAULT_SECTIONS
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--device", "cpu", "--section", "gpus", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["gpus"]
    assert row["run"] == "skip" and "needs CUDA" in row["reason"] and row["results"] == ""


def test_the_cli_keeps_the_checks_results_beside_its_json(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(gpus, "scaling", lambda *args: seen.append(args[5]) or [])
    out = tmp_path / "out" / "bench.json"
    assert cli.main(["bench", "--device", "cpu", "--section", "gpus", "--json", str(out)]) == 0
    assert seen == [tmp_path / "out" / "bench-gpus"]


def test_a_part_s_time_split_is_kept_and_its_cases_seconds_shown(tmp_path):
    split = {"start_s": 7.2, "startup_s": 6.0, "launch_s": 4.5, "collect_s": 0.1, "cases_s": 27.9}
    split["tests_s"] = 63.6
    split["outside"] = [["t", 9.2]]
    parts = [
        {"part": "a", "gpu": "0", "seconds": 70.1, "expected_s": 60.0, "exit_status": 0, **split},
        {"part": "b", "gpu": "1", "seconds": 20.0, "expected_s": 20.0, "exit_status": 0},  # an older check
    ]
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps(
            {
                "format": "attn-harness-results",
                "version": 1,
                "environment": {},
                "results": [],
                "run": {
                    "id": "x",
                    "elapsed_s": 71.0,
                    "exit_status": 0,
                    "jobs": 2,
                    "expected_s": 60.0,
                    "parts": parts,
                },
            }
        )
    )
    row = gpus.GpuRow(run="all", gpus=["0", "1"], profile="gpu", backends=[])
    gpus.read_parts(row, results)
    assert row.parts[0] == {"part": "a", "gpu": "0", "seconds": 70.1, "expected_s": 60.0, **split}
    assert row.parts[1] == {"part": "b", "gpu": "1", "seconds": 20.0, "expected_s": 20.0}
    text = render({"gpus": [vars(row)]})
    shown = "  all: longest parts: a 70 s (GPU 0, from 7 s, planned 60, cases 28), b 20 s (GPU 1, planned 20)"
    assert shown in text
    fixed = "  all: outside pytest: 4 s before it configured (4.5 s a part, 1 parts), 2 s after its session"
    assert fixed in text


def test_a_mis_planned_pair_is_not_judged_and_is_measured_once_more(monkeypatch, tmp_path):
    """On 2 x H200 flex_compiled planned unsplit at 30 s took 75 s of the one-GPU
    run's 79 s, and the speedup read 1.95 (met). A run whose bounding part took over MISPLANNED times
    its plan measured the plan: its pair's verdict says so, and the pair runs again once, planned from
    the costs the mis-planned runs saved."""
    calls = _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_MISPLANNED", "1")  # the first one-GPU check: its longest part planned at 5 s
    rows = gpus.scaling("cuda", ["0", "1"], None, 60.0)
    assert [r.run for r in rows] == ["prime", "prime", "one", "all", "one", "all"]
    gpu_args = [c.split(" --gpus ")[1].split()[0] for c in calls.read_text().splitlines()]
    assert gpu_args == ["0,1", "0,1", "0", "0,1", "0", "0,1"]
    first, second = rows[2], rows[4]
    assert first.misplanned == f"fake[1/6] took 15 s of the run's {first.seconds:.0f} s, planned 5 s"
    assert second.misplanned == "" and rows[3].misplanned == "" and rows[5].misplanned == ""
    assert rows[3].verdict == "mis-planned" and rows[3].speedup is not None
    last = rows[5]
    assert last.verdict in ("met", "MISSED") and last.speedup == round(second.seconds / last.seconds, 3)
    text = render({"gpus": [vars(r) for r in rows]})
    assert f"  one: mis-planned: {first.misplanned}" in text
    assert "(target 1.7: mis-planned)" in text
    assert bench.passed({"gpus": [vars(r) for r in rows]}) is True  # a verdict, not a failed check


def test_misplanned_needs_a_bounding_part_far_over_its_plan():
    def row(longest: float, planned: float, wall: float) -> gpus.GpuRow:
        r = gpus.GpuRow(
            run="one",
            gpus=["0"],
            profile="gpu",
            backends=[],
            seconds=wall,
            longest="p",
            longest_seconds=longest,
        )
        r.parts = [{"part": "p", "gpu": "0", "seconds": longest, "expected_s": planned}]
        return r

    assert gpus.misplanned(row(75.0, 30.0, 79.0)) == "p took 75 s of the run's 79 s, planned 30 s"
    assert gpus.misplanned(row(45.0, 30.0, 46.0)) == ""  # 1.5 times its plan: within MISPLANNED
    assert gpus.misplanned(row(75.0, 30.0, 94.0)) == ""  # under LONGEST_BOUND of the run: not bounding
    assert gpus.misplanned(row(75.0, 0.0, 79.0)) == ""  # no plan to compare with
