"""`check --jobs N`: one pytest process per backend, merged into one report."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.checks import footprint
from harness.cli import main
from harness.report import results_json
from harness.run import check, parallel, pytest_command
from harness.run.speed import schedule
from tests.helpers import sigint_as_in_a_terminal
from tests.report_helpers import WINDOW_IGNORED


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([0, 5], 0), ([5, 5], 5), ([0, 1, 5], 1), ([1, 2], 2), ([0, -9], 3), ([], 0)],
)
def test_one_exit_status_for_the_run(codes, expected):
    assert parallel.combined_code(codes) == expected


def test_default_jobs_one_on_the_cpu_and_per_two_cores_on_cuda_up_to_eight_per_gpu(monkeypatch):
    monkeypatch.setattr(check.os, "cpu_count", lambda: 16)
    assert check.jobs(None, cuda=False) == 1 and check.jobs(None, cuda=True) == 8
    assert check.jobs(None, cuda=True, gpus=2) == 8  # 16 cores: still 8
    monkeypatch.setattr(check.os, "cpu_count", lambda: 32)
    assert check.jobs(None, cuda=True, gpus=1) == 8 and check.jobs(None, cuda=True, gpus=2) == 16
    monkeypatch.setattr(check.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(footprint, "available", lambda device: 64 << 30)
    assert check.jobs(None, cuda=True) == 1 and check.jobs(2, cuda=False) == 2  # more: test_check_outcome


def test_jobs_below_one_is_a_one_line_error(capsys, tmp_path):
    assert main(["check", "--jobs", "0", "--reports", str(tmp_path)]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no empty run directory left behind


def test_a_parallel_run_merges_every_backend_and_a_failure_fails_it(tmp_path):
    """Two backends in two processes: one report with both, the window bug's failure in it, exit 1."""
    argv = [sys.executable, "-m", "harness", "check", "--device", "cpu", "--family", "decode", "-k", "swa"]
    argv += [
        "--backend",
        "torch_native",
        "--backend",
        WINDOW_IGNORED,
        "--jobs",
        "2",
        "--reports",
        str(tmp_path),
    ]
    argv += ["--no-probe"]
    env = {**os.environ, "ATTN_HARNESS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=pytest_command.ROOT, env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 processes, 2 at once" in proc.stdout and "[2/2]" in proc.stdout
    run = (tmp_path / "latest").resolve()
    doc = results_json.load(run / "results.json")
    assert {r["backend"] for r in doc["results"]} == {"torch_native", WINDOW_IGNORED}
    assert any(r["status"] == "fail" for r in doc["results"])
    assert all(r["status"] == "pass" for r in doc["results"] if r["backend"] == "torch_native")
    assert doc["run"]["exit_status"] == 1 and doc["run"]["profile"] == "ci"
    assert doc["run"]["jobs"] == 2
    assert doc["run"]["expected_s"] == round(max(p["expected_s"] for p in doc["run"]["parts"]), 1)
    assert sorted(p["backend"] for p in doc["run"]["parts"]) == sorted(["torch_native", WINDOW_IGNORED])
    assert (run / "index.html").is_file() and (run / "junit.xml").is_file()
    assert len(list((run / "parts").glob("*.log"))) == 2
    for part in doc["run"]["parts"]:  # where each part's seconds went, from its own results
        own = results_json.load(run / "parts" / f"{parallel.file_name(part['backend'])}.json")
        tests = own["run"]["test_s"]
        assert tests and set(tests) == {r["test_id"] for r in own["results"]}
        assert 0 < own["run"]["collect_s"] < own["run"]["elapsed_s"]
        assert part["cases_s"] == round(sum(r["seconds"] or 0 for r in own["results"]), 3) > 0
        assert part["cases_s"] <= part["tests_s"] == round(sum(tests.values()), 3)
        assert 0 < part["launch_s"] < part["startup_s"] < part["seconds"]
        assert part["outside"][0][0] in tests and len(part["outside"]) == min(3, len(tests))


def test_time_split_names_the_tests_with_the_most_time_outside_their_cases():
    part = parallel.Part(backend="b", results=Path("r.json"), log=Path("r.log"), seconds=30.0)
    assert parallel.time_split(part) == {}  # no results read: nothing to split
    part.run = {"elapsed_s": 26.0, "collect_s": 0.5, "test_s": {"t1": 10.0, "t2": 4.0, "t3": 9.0}}
    part.records = [
        {"test_id": "t1", "seconds": 9.5},  # 0.5 s outside its cases
        {"test_id": "t2", "seconds": 1.0},
        {"test_id": "t2", "seconds": None},  # a skip has no seconds
        {"test_id": "t3", "seconds": 1.0},  # 8 s outside: the worker started here
    ]
    split = parallel.time_split(part, top=2)
    assert split == {
        "startup_s": 4.0,
        "launch_s": None,  # no child, no configure time: unknown
        "collect_s": 0.5,
        "cases_s": 11.5,
        "tests_s": 23.0,
        "outside": [["t3", 8.0], ["t2", 3.0]],
    }
    assert tuple(split) == parallel.TIME_SPLIT_KEYS  # what the gpus bench keeps of each part
    part.child = SimpleNamespace(started_at=1000.0)
    part.run["configured_at"] = 1003.25
    assert parallel.time_split(part)["launch_s"] == 3.25  # of its 4 s outside its session


def test_a_planned_split_gives_each_shard_its_own_files_and_shard_option(tmp_path):
    plan = schedule.plan({"torch_native": 30, "fa4": 200, "m.x:make": 30}, 4, [])
    parts = parallel.parts(plan, tmp_path)
    assert [p.name for p in parts] == ["fa4[0/3]", "fa4[1/3]", "fa4[2/3]", "torch_native", "m.x:make"]
    assert parts[1].args == ["--harness-shard", "1/3"] and parts[1].results.name == "fa4.1of3.json"
    assert len({p.results for p in parts} | {p.log for p in parts}) == 10
    assert all(p.results.parent == tmp_path and "/" not in p.log.name for p in parts)
    whole = parts[-1]
    assert whole.name == "m.x:make" and whole.args == [] and whole.results.name == "m.x_make.json"


def _check(tmp_path, jobs: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`check` of torch_native's decode tests (full and swa) on the CPU; its merged records."""
    tmp_path.mkdir()  # --results must name a file in a directory that exists
    argv = [sys.executable, "-m", "harness", "check", "--device", "cpu", "--family", "decode"]
    argv += ["--backend", "torch_native", "--no-probe", "--jobs", str(jobs)]
    argv += ["--reports", str(tmp_path / "reports"), "--results", str(tmp_path / "results.json")]
    env = {**os.environ, "ATTN_HARNESS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=pytest_command.ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, results_json.load(tmp_path / "results.json")["results"]


def test_one_backend_with_two_jobs_runs_as_two_shards_that_together_check_what_one_process_does(tmp_path):
    """Two shards of one backend: every test of the unsharded run in exactly one shard, each record
    merged once, the shards' files apart, the exit status as before."""
    _, whole = _check(tmp_path / "one", 1)
    proc, sharded = _check(tmp_path / "two", 2)
    assert "2 shards x" in proc.stdout and "2 processes, 2 at once" in proc.stdout
    assert "torch_native[0/2]:" in proc.stdout and "torch_native[1/2]:" in proc.stdout
    parts = (tmp_path / "two" / "reports" / "latest" / "parts").resolve()
    shard_ids = [
        {r["test_id"] for r in results_json.load(parts / f"torch_native.{i}of2.json")["results"]}
        for i in range(2)
    ]
    assert all(shard_ids) and not shard_ids[0] & shard_ids[1]
    assert sorted(r["test_id"] for r in sharded) == sorted(r["test_id"] for r in whole)
    assert len({r["test_id"] for r in whole}) == 2 and len(whole) > 2
    timings = json.loads((tmp_path / "two" / "cache" / "timings.json").read_text())["selections"]
    assert list(timings) == ["profile ci; -m (decode) and not gpu; -k "]  # the next run's costs
    assert set(timings["profile ci; -m (decode) and not gpu; -k "]) == {"torch_native"}
    shards = json.loads((tmp_path / "two" / "cache" / "timings.json").read_text())["shards"]
    assert list(shards["profile ci; -m (decode) and not gpu; -k "]["torch_native"]) == ["2"]  # for the fit


CHILD = """
import os, signal, sys, time
from harness.report import results_json
path = sys.argv[sys.argv.index("--harness-results") + 1]
def stop(*_):
    rec = dict(status="pass", backend=os.environ["B"], device="cpu", family="decode", mode="DECODE",
               features=[], reason="")
    results_json.dump(path, results_json.build([rec], {}, {"torch": "x"}))
    sys.exit(2)
signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
time.sleep(120)
"""

DRIVER = """
import json, os, sys
from pathlib import Path
from types import SimpleNamespace
from harness.run import parallel
from harness.run.speed import schedule
d = Path(sys.argv[1])
cmd = [sys.executable, str(d / "child.py")]
plan = schedule.plan({"a": 1, "b": 1, "c": 1}, 2, [])
parts = parallel.run(cmd, dict(os.environ), "B", plan, d / "parts", d)
print(json.dumps({p.backend: [p.code, len(p.records)] for p in parts}))
"""


def test_an_interrupt_keeps_what_the_running_parts_checked(tmp_path):
    """Ctrl-C (or a time limit's SIGINT) mid-run: the running pytest processes are asked to stop and
    write their results, which the run keeps; the part not started is marked interrupted."""
    import os
    import signal
    import time

    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(pytest_command.ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_as_in_a_terminal,
    )
    logs = [tmp_path / "parts" / f"{n}.log" for n in ("a", "b")]
    # Wait for an event, not a duration: both parts ready, or the driver gone (it ends on its own
    # once its parts end; a part never ready has died, and no part outlives its 120 s sleep).
    while not all(p.is_file() and "ready" in p.read_text() for p in logs):
        assert proc.poll() is None, f"the driver exited ({proc.returncode}) before both parts were ready"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate()
    codes = json.loads(out.strip().splitlines()[-1])
    assert codes == {"a": [2, 1], "b": [2, 1], "c": [2, 0]}, out


def test_each_part_collects_only_its_own_backend():
    """A part runs the suite with one backend selected: every collected test (the model-level and
    deterministic ones included) must be that backend's, or the parts would repeat each other's work."""
    import os

    env = {**os.environ, "ATTN_HARNESS_BACKENDS": "torch_split"}
    argv = [sys.executable, "-m", "pytest", "cases", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=pytest_command.ROOT, env=env, timeout=300)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids and all("[torch_split-" in i for i in ids), [i for i in ids if "[torch_split-" not in i][:5]
    assert any("test_model_logprobs" in i for i in ids) and any("test_deterministic" in i for i in ids)


def test_check_asks_each_unmeasured_backend_whether_it_runs_here(monkeypatch, tmp_path, capsys):
    """fa2 cannot run on the CPU (nor without its library): `check` plans its part as one that skips,
    at STARTUP_S, and says so; a plugin that can run, never measured, keeps UNKNOWN_SECONDS."""
    from harness.run.speed import costs
    from harness.run.speed.schedule import STARTUP_S
    from tests.helpers import fresh_cache

    fresh_cache(monkeypatch, tmp_path).mkdir(parents=True)
    planned = []

    def fake_run(cmd, env, backends_env, plan, parts_dir, cwd, **kwargs):  # noqa: ANN001, ANN003, ANN202
        planned.append(plan)
        files = [(parts_dir / f"{i}.json", parts_dir / f"{i}.log") for i in range(len(plan.parts))]
        made = zip(plan.parts, files)
        return [
            parallel.Part(
                backend=p.backend, results=r, log=log, shard=p.shard, shards=p.shards, code=0, seconds=1.0
            )
            for p, (r, log) in made
        ]

    monkeypatch.setattr(parallel, "run", fake_run)
    names = ["fa2", "tests.test_variant_shards:native"]
    job = check.Prepared(cmd=["pytest"], env={}, names=names, jobs=2, gpus=[], run_dir=tmp_path / "run",
                         profile="gpu", results=None, selection="sel", cwd=tmp_path, command_line="check")
    assert check.run_parallel(job) == 0
    (plan,) = planned
    assert [p.seconds for p in plan.parts if p.backend == "fa2"] == [STARTUP_S]
    plugin = [p for p in plan.parts if p.backend != "fa2"]  # 60 s: split in two on two slots
    assert sum(p.seconds for p in plugin) == costs.UNKNOWN_SECONDS + (len(plugin) - 1) * STARTUP_S
    out = capsys.readouterr().out
    assert f"fa2{' ' * 20}{STARTUP_S:.0f} s (skips)" in out and "s (unknown)" in out


def test_a_fitted_fixed_cost_plans_the_shards_and_is_subtracted_from_the_saved_cost(monkeypatch, tmp_path):
    """torch_native seen at 1, 2 and 4 shards (20 s fixed + 50 s of work; STARTUP_S is 10): `check`
    plans its shards with that fixed cost, and saves the parts' sum less the extra shards' fixed costs."""
    from harness.run.speed import costs
    from tests.helpers import fresh_cache

    cache = fresh_cache(monkeypatch, tmp_path)
    cache.mkdir(parents=True)
    costs.save(cache, "sel", {"torch_native": 999.0}, {"torch_native": {"1": 70.0, "2": 45.0, "4": 32.5}})
    planned = []

    def fake_run(cmd, env, backends_env, plan, parts_dir, cwd, **kwargs):  # noqa: ANN001, ANN003, ANN202
        planned.append(plan)
        files = [(parts_dir / f"{i}.json", parts_dir / f"{i}.log") for i in range(len(plan.parts))]
        took = {"torch_native": 45.0, "fa4": 30.0}
        return [
            parallel.Part(
                backend=p.backend,
                results=r,
                log=log,
                shard=p.shard,
                shards=p.shards,
                code=0,
                seconds=took[p.backend],
            )
            for p, (r, log) in zip(plan.parts, files)
        ]

    monkeypatch.setattr(parallel, "run", fake_run)
    names = ["torch_native", "fa4"]
    job = check.Prepared(cmd=["pytest"], env={}, names=names, jobs=4, gpus=[], run_dir=tmp_path / "run",
                         profile="gpu", results=None, selection="sel", cwd=tmp_path, command_line="check")
    assert check.run_parallel(job) == 0
    (plan,) = planned
    mine = [p for p in plan.parts if p.backend == "torch_native"]
    n = len(mine)
    assert n > 1 and all(p.seconds == pytest.approx(20 + 50 / n) for p in mine)  # not 999 s, nor 10 s fixed
    kept = json.loads((cache / costs.TIMINGS).read_text())
    assert kept["selections"]["sel"]["torch_native"] == n * 45.0 - (n - 1) * 20.0  # the extra shards' fixed
    assert kept["shards"]["sel"]["torch_native"] == {"1": 70.0, "2": 45.0, "4": 32.5} | {str(n): 45.0}
    assert kept["shards"]["sel"]["fa4"] == {str(len(plan.parts) - n): 30.0}  # its first shard count
