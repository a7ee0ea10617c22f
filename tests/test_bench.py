"""`python -m harness bench`: every section's rows and fields, honest counts, timeouts as rows, a mix
that replays, and clear errors. Small sizes only: the bench's numbers are measured, not asserted.
The coldstart section runs against a stand-in harness: the check (its warm-up beside it) in a fresh
cache directory and then with it warm, the children free of the parent's cache variables, and a
failed compile or check reported and failing the bench."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness import cli, hunts
from harness.backends import Backend, load
from harness.cli import main
from harness.core import timing
from harness.core.modes import Mode
from harness.mutants import by_name
from harness.run.workers import Outcome
from harness.tools import bench
from harness.tools.bench import coldstart, harness_child, opcount, throughput
from harness.tools.bench import phases as bench_phases
from harness.tools.bench.cases import MAX_BATCH, MAX_TOKENS, MIX_SHAPE, mix
from harness.tools.bench.scale import SCALE_WINDOW, scale_row
from harness.tools.bench.table import render
from harness.tools.bench.throughput import measure_backend, parallel_passes

# The fields docs/bench.md documents, per section.
THROUGHPUT = {
    "backend",
    "device",
    "cases",
    "checked",
    "passed",
    "failed",
    "crashed",
    "skipped",
    "seconds",
    "cases_per_s",
    "pass_seconds",
    "warm_seconds",
    "failures",
    "reason",
    "workers",
    "parallel_cases_per_s",
    "parallel_pass_seconds",
}
PHASES = {
    "backend",
    "device",
    "checked",
    "wall_seconds",
    "ms_per_case",
    "fractions",
    "overhead",
    "ops_per_case",
    "syncs_per_case",
    "not_counted",
}
SCALE = {
    "device",
    "tokens",
    "window_left",
    "status",
    "exact_seconds",
    "exact_peak_bytes",
    "native_seconds",
    "native_peak_bytes",
    "check_seconds",
    "peak_bytes",
    "target",
    "verdict",
    "reason",
}
DETECTION = {
    "mutant",
    "backend",
    "device",
    "family",
    "check",
    "outcome",
    "examples",
    "seconds",
    "hunt_seconds",
    "seed_class",
    "within_target",
    "reason",
}
FAST_MUTANT = "torch_native~window_ignored"


def test_the_json_has_every_section_with_its_documented_fields(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hunts, "every_mutant", lambda exact_pool=False: [by_name(FAST_MUTANT)])
    out = tmp_path / "bench.json"
    argv = ["bench", "--device", "cpu", "--backend", "torch_native", "--cases", "3", "--scale-tokens", "64"]
    assert main(argv + ["--max-examples", "50", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for heading in ("throughput on cpu", "phases:", "scale:", "detection:"):
        assert heading in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["passed"] is True and doc["meta"]["device"] == "cpu"
    assert doc["mix"]["cases"] == 3 and doc["mix"]["max_tokens"] == MAX_TOKENS

    (tp,) = doc["throughput"]
    assert set(tp) == THROUGHPUT and tp["backend"] == "torch_native" and not tp["reason"]
    assert tp["checked"] + tp["skipped"] == tp["cases"] == 3
    assert tp["passed"] == tp["checked"] and tp["cases_per_s"] > 0 and tp["failures"] == []
    assert tp["workers"] == 1 and tp["parallel_cases_per_s"] == 0.0 and tp["parallel_pass_seconds"] == []

    (ph,) = doc["phases"]
    assert set(ph) == PHASES and set(ph["fractions"]) == {*bench_phases.PHASES, "other"}
    assert all(0.0 <= f <= 1.0 for f in ph["fractions"].values())
    assert sum(ph["fractions"].values()) <= 1.0 + 1e-9
    assert ph["fractions"]["reference"] > 0 and ph["fractions"]["kernel"] > 0 and ph["fractions"]["plan"] > 0
    assert ph["overhead"] == pytest.approx(1 - ph["fractions"]["kernel"] - ph["fractions"]["reference"])
    assert set(ph["ops_per_case"]) == set(ph["syncs_per_case"]) == {*bench_phases.PHASES, "other"}
    assert ph["ops_per_case"]["reference"] > 0 and ph["syncs_per_case"]["compare"] >= 1  # its one readback
    assert ph["not_counted"] == ""
    assert "ops/syncs per case" in text

    assert [(r["tokens"], r["window_left"]) for r in doc["scale"]] == [(64, -1), (64, SCALE_WINDOW)]
    for r in doc["scale"]:
        assert set(r) == SCALE and r["status"] == "ok", r
        assert r["check_seconds"] == pytest.approx(r["exact_seconds"] + r["native_seconds"])
        assert r["peak_bytes"] == max(r["exact_peak_bytes"], r["native_peak_bytes"])
        assert r["target"] == r["verdict"] == ""  # the targets are for 32k (CPU) and 128k (GPU)

    (d,) = doc["detection"]
    assert DETECTION <= set(d) and d["mutant"] == FAST_MUTANT and d["outcome"] == "caught"
    # what seconds and hunt_seconds time: tests/test_mutants.py, on a clock moved by hand
    assert d["seed_class"] is True and d["examples"] >= 1 and d["status"] == "fail"


def test_a_broken_backend_is_reported_with_its_failures():
    broken = by_name(FAST_MUTANT).make()
    cases = mix(0, 10, broken.capabilities, max_tokens=128)
    assert any(c.window_left >= 0 and c.mode != Mode.CROSS for c in cases)
    row, phases = measure_backend(broken, "cpu", cases, ("throughput",))
    assert phases is None
    assert row.failed + row.crashed >= 1 and row.passed < row.checked
    f = row.failures[0]
    assert f["status"] == "fail" and "python -m harness repro" in f["repro"] and FAST_MUTANT in f["repro"]
    doc = {"throughput": [vars(row)]}
    assert bench.passed(doc) is False
    assert "FAIL" in render({**_skeleton(), **doc})


def test_the_rate_is_of_the_median_timed_pass_and_a_failure_in_any_pass_counts(monkeypatch):
    backend = load("torch_native")
    cases = mix(0, 4, backend.capabilities, max_tokens=64)
    calls = iter([1.0, 4.0, 2.0, 3.0])  # warm-up, then three timed passes
    real = throughput.one_pass

    def timed(b, cs, device):  # noqa: ANN001, ANN202
        results, _ = real(b, cs, device)
        n = next(calls)
        if n == 4.0:  # the first timed pass sees one failure
            results = [dataclasses.replace(results[0], status="fail", reason="injected")] + results[1:]
        return results, n

    monkeypatch.setattr(throughput, "one_pass", timed)
    row, _ = measure_backend(backend, "cpu", cases, ("throughput",), repeat=3)
    assert row.pass_seconds == [4.0, 2.0, 3.0] and row.seconds == 3.0
    assert row.cases_per_s == pytest.approx(row.checked / 3.0) and row.warm_seconds == 1.0
    assert row.failed == 1 and row.failures[0]["reason"] == "injected"


def _skeleton() -> dict:
    meta = {"device": "cpu", "device_name": "cpu", "threads": 1}
    mix = {"seed": 0, "cases": 10, "max_batch": 8, "max_tokens": 512, "workers": 1, **MIX_SHAPE}
    return {"meta": meta, "mix": mix}


def test_a_reference_run_over_its_time_limit_is_a_timeout_row():
    row = scale_row("cpu", 64, -1, timeout=0.01)
    assert row.status == "timeout" and row.reason == "timeout after 0.01s (exact)"
    assert row.exact_seconds is None and row.check_seconds is None
    row = scale_row("cpu", 32768, -1, timeout=0.01)
    assert row.target and row.verdict == "MISSED"


def test_the_mix_replays_from_its_seed():
    caps = load("torch_native").capabilities
    a, b = mix(7, 20, caps), mix(7, 20, caps)
    assert [c.to_json() for c in a] == [c.to_json() for c in b]
    assert [c.to_json() for c in mix(8, 20, caps)] != [c.to_json() for c in a]
    assert {c.mode for c in a} == set(Mode) and any(c.window_left >= 0 for c in a)
    for c in a:
        assert load("torch_native").supports(c) is None
        assert 1 <= c.batch_size <= MAX_BATCH
        keys = [r.encoder_len if c.mode == Mode.CROSS else r.prefix_len + r.extend_len for r in c.requests]
        assert max(keys) <= MAX_TOKENS


def test_the_mix_keeps_to_what_a_backend_supports():
    caps = load("flashinfer_dec_cc").capabilities
    assert {c.mode for c in mix(0, 12, caps)} == {Mode.DECODE}


def test_phases_are_exclusive_and_free_when_not_recording(monkeypatch):
    clock = [0.0]  # the recorder's clock, moved by hand: no test depends on how busy the machine is
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    with timing.phase("kernel"):  # no recorder: nothing happens, nothing is kept
        clock[0] += 1.0
    with timing.recording() as rec:
        with timing.phase("kernel"):
            clock[0] += 0.02
            with timing.phase("plan"):
                clock[0] += 0.03
    assert dict(rec.seconds) == {"kernel": pytest.approx(0.02), "plan": pytest.approx(0.03)}
    assert timing._active is None


def test_ops_and_syncs_are_counted_in_the_phase_that_runs_them():
    x = torch.arange(6.0)
    with opcount.counting("cpu") as counter:
        y = x * 2  # outside every phase: other
        with timing.phase("compare"):
            z = (y + 1).sum()
            float(z)  # a scalar read
            with timing.phase("plan"):  # nested: its own
                x.tolist()  # a host read without an aten operation on the CPU
                (x > 2).nonzero()  # an output sized by the values
            y[y > 3]  # a boolean index
    assert dict(counter.ops)["other"] == 1 and counter.syncs["other"] == 0
    assert counter.ops["compare"] >= 3 and counter.syncs["compare"] == 2  # float and the boolean index
    assert counter.syncs["plan"] == 2
    assert timing._active is None


def test_flex_is_counted_through_its_higher_order_operator_and_a_broken_count_says_so(monkeypatch):
    """flex_attention is a higher-order operator: the counting mode must accept it, or every flex case
    crashes while counted and its reference and compare count nothing. A count whose cases end
    otherwise than timed gives no numbers and says why."""
    flex = load("flex_eager")
    cases = mix(0, 3, flex.capabilities)
    row = bench_phases.phase_row(flex, "cpu", cases)
    assert row.not_counted == "" and row.ops_per_case["reference"] > 0 and row.ops_per_case["compare"] > 0
    monkeypatch.setattr(opcount._Ops, "supports_higher_order_operators", False)
    broken = bench_phases.phase_row(flex, "cpu", cases)
    assert broken.ops_per_case == broken.syncs_per_case == {}
    assert broken.not_counted.startswith("case 0 (")
    assert "pass when timed, crash when counted: backend raised NotImplementedError" in broken.not_counted
    doc = {"meta": {"device": "cpu"}, "phases": [dataclasses.asdict(row), dataclasses.asdict(broken)]}
    text = render(doc)
    assert f"flex_eager: not counted: {broken.not_counted}" in text


def test_on_a_gpu_only_reads_of_device_tensors_are_syncs():
    counter = opcount.Counter("cuda")  # is_sync alone: a meta tensor stands in for a device tensor
    host, dev = torch.ones(3), torch.ones(3, device="meta")
    aten = torch.ops.aten
    to_host = {"device": torch.device("cpu")}
    assert counter.is_sync(aten._local_scalar_dense.default, (dev,), {})
    assert counter.is_sync(aten._to_copy.default, (dev,), to_host)
    assert counter.is_sync(aten.copy_.default, (host, dev), {})
    assert counter.is_sync(aten.index.Tensor, (dev, [dev > 0]), {})
    assert not counter.is_sync(aten._local_scalar_dense.default, (host,), {})  # host-side data
    assert not counter.is_sync(aten._to_copy.default, (host,), to_host)
    assert not counter.is_sync(aten._to_copy.default, (dev,), {"dtype": torch.float64})
    assert counter.is_sync(aten.copy_.default, (dev, host), {})  # from pageable memory: waits for the stream
    assert counter.is_sync(aten._to_copy.default, (host,), {"device": torch.device("cuda")})
    assert not counter.is_sync(aten.copy_.default, (host, host), {})
    rows = torch.zeros(1, dtype=torch.long, device="meta")
    assert not counter.is_sync(aten.index.Tensor, (dev, [rows]), {})
    assert not counter.is_sync(aten.add.Tensor, (dev, dev), {})


def test_help_and_bad_input(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and "--scale-timeout" in capsys.readouterr().out
    assert main(["bench", "--device", "cpu", "--backend", "no_such_backend"]) == 2
    assert "unknown backend 'no_such_backend'" in capsys.readouterr().err
    assert main(["bench", "--device", "cpu", "--section", "speed"]) == 2
    assert "unknown section 'speed'" in capsys.readouterr().err


# --- throughput in several processes: backends loaded by their `module:factory` spec in each worker
# process (named bench-worker-W); the parent gets plain torch_native, a worker the misbehaviour.

LATE_S = 4.0


def _worker() -> int | None:
    name = multiprocessing.current_process().name
    return int(name.rsplit("-", 1)[1]) if name.startswith("bench-worker-") else None


def dies_in_worker_0() -> Backend:
    """Worker 0 exits at once, without a word; worker 1 warms up and waits at the barrier."""
    if _worker() == 0:
        os._exit(3)
    return load("torch_native")


def raises_in_worker_1() -> Backend:
    if _worker() == 1:
        raise RuntimeError("no backend in worker 1")
    return load("torch_native")


def late_worker_1() -> Backend:
    """Worker 1 starts LATE_S seconds after worker 0: only the barrier keeps that out of a pass."""
    if _worker() == 1:
        time.sleep(LATE_S)
    return load("torch_native")


def broken_in_workers() -> Backend:
    """Correct in the parent's passes, the window bug in the workers'."""
    return by_name("torch_native~window_ignored").make() if _worker() is not None else load("torch_native")


def test_workers_measure_the_mix_in_that_many_processes_too(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "--device", "cpu", "--backend", "torch_native", "--section", "throughput"]
    assert main(argv + ["--cases", "4", "--workers", "2", "--repeat", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (tp,) = doc["throughput"]
    assert set(tp) == THROUGHPUT and doc["mix"]["workers"] == 2 and tp["reason"] == ""
    assert tp["workers"] == 2 and tp["passed"] == tp["checked"] == 4 and len(tp["parallel_pass_seconds"]) == 2
    median = statistics.median(tp["parallel_pass_seconds"])
    assert tp["parallel_cases_per_s"] == pytest.approx(4 / median) and tp["parallel_cases_per_s"] > 0
    head = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("backend"))
    assert head.split()[:3] == ["backend", "cases/s", "2"] and "procs/s" in head


def test_a_pass_runs_from_the_barrier_not_from_a_late_workers_start():
    """Worker 1 loads its backend seconds after worker 0: with the barrier no pass includes the
    wait. The order of the workers' events shows it (one clock for every process, compared with
    each other, never with a constant): every worker's first pass starts after the last warm-up
    ended, each later pass after every worker ended the one before, and a pass's wall time spans
    its workers' passes. Every case is checked once per pass, by its worker, and comes back in its
    place in the mix."""
    backend = load("tests.test_bench:late_worker_1")
    cases = mix(0, 5, backend.capabilities, max_tokens=64)
    par = parallel_passes(backend, "cpu", cases, workers=2, repeat=2)
    assert par.error == "" and len(par.walls) == len(par.spans) == 2 and len(par.ready) == 2
    released = max(par.ready)
    for spans, wall in zip(par.spans, par.walls):
        assert all(released <= start < end for start, end in spans), (par.ready, par.spans)
        assert wall == max(end for _, end in spans) - min(start for start, _ in spans) > 0
        released = max(end for _, end in spans)
    here = [(r.status, r.reason) for r in throughput.one_pass(backend, cases, "cpu")[0]]
    assert par.found == [here, here] and {status for status, _ in here} == {"pass"}


@pytest.mark.parametrize(
    ("device", "env"),
    [("cuda", {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1", "MAX_JOBS": "2"}), ("cpu", {})],
)
def test_workers_get_the_threads_a_check_gives_its_parts(monkeypatch, device, env):
    """On CUDA the workers run with the CPU threads of `check --jobs`'s parts (parallel.cuda_threads),
    so the rate they measure is that of the check's processes; on the CPU torch's default."""
    made = []

    class NoWorker:
        def __init__(self, name=None, env=None, preload=()):  # noqa: ANN001
            made.append(env)

        def call(self, fn, args, timeout):  # noqa: ANN001
            return Outcome(kind="raised", error="not started")

        def stop(self, kill=False):  # noqa: ANN001
            pass

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(throughput, "Worker", NoWorker)
    par = parallel_passes(load("torch_native"), device, [], workers=2, repeat=1)
    assert made == [env, env] and par.error.startswith("worker 0: ")


@pytest.mark.parametrize(
    ("factory", "error"),
    [
        ("dies_in_worker_0", "worker 0 exited with code 3"),
        ("raises_in_worker_1", "worker 1: harness.backends.BackendError: backend "
         "'tests.test_bench:raises_in_worker_1': its factory raised RuntimeError"),
    ],
)
def test_a_worker_that_fails_ends_the_wait_and_fails_the_bench(factory, error):
    backend = load(f"tests.test_bench:{factory}")
    cases = mix(0, 4, backend.capabilities, max_tokens=64)
    row, _ = measure_backend(backend, "cpu", cases, ("throughput",), repeat=1, workers=2)
    # the failure ended the wait, not the 600 s of a silent worker ("reported nothing for 600 s")
    assert error in row.reason and row.reason.startswith("in 2 processes: ")
    assert row.workers == 2 and row.parallel_cases_per_s == 0.0 and row.cases_per_s > 0
    doc = {**_skeleton(), "throughput": [dataclasses.asdict(row)]}
    doc["mix"]["workers"] = 2
    assert bench.passed(doc) is False and "parallel measurement failed: in 2 processes" in render(doc)


def test_a_case_failing_only_in_a_parallel_pass_is_a_failure():
    backend = load("tests.test_bench:broken_in_workers")
    cases = mix(0, 10, backend.capabilities, max_tokens=128)
    row, _ = measure_backend(backend, "cpu", cases, ("throughput",), repeat=1, workers=2)
    assert row.reason == "" and row.parallel_cases_per_s > 0
    assert row.failed >= 1 and row.failures[0]["status"] == "fail"
    assert bench.passed({"throughput": [dataclasses.asdict(row)]}) is False


# --- coldstart (against a stand-in harness, coldstart_fake_harness.py)


FAKE = Path(__file__).with_name("coldstart_fake_harness.py")
FIELDS = {
    "run",
    "profile",
    "backends",
    "seconds",
    "warmup_seconds",
    "compiled",
    "warmup_failed",
    "exit",
    "cpu_seconds",
    "cores",
    "cache_bytes",
    "warmup_summary",
    "reason",
}


def _fake(monkeypatch, tmp_path) -> list[Path]:
    """The stand-in harness, its temporary directories kept in a list for the test to inspect."""
    monkeypatch.setattr(harness_child, "HARNESS", [sys.executable, str(FAKE)])
    made: list[Path] = []
    real = coldstart.tempfile.mkdtemp

    def mkdtemp(prefix: str) -> str:
        made.append(Path(real(prefix=prefix, dir=tmp_path)))
        return str(made[-1])

    monkeypatch.setattr(coldstart.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users-own"))
    return made


def test_cold_then_warm_in_one_fresh_directory(monkeypatch, tmp_path, capsys):
    made = _fake(monkeypatch, tmp_path)
    out = tmp_path / "bench.json"
    argv = ["bench", "--device", "cpu", "--backend", "torch_native", "--section", "coldstart"]
    assert cli.main(argv + ["--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cold, warm = doc["coldstart"]
    assert set(cold) == FIELDS and (cold["run"], warm["run"]) == ("cold", "warm")
    assert (cold["compiled"], warm["compiled"]) == (2, 0)
    assert cold["exit"] == warm["exit"] == 0 and cold["warmup_failed"] == warm["warmup_failed"] == 0
    assert cold["warmup_seconds"] == 3.0 and cold["seconds"] > 0
    assert cold["cache_bytes"] == warm["cache_bytes"] == {"fake": 2000}
    assert cold["profile"] == "ci" and cold["backends"] == ["torch_native"]
    assert cold["warmup_summary"] == ["library  variants  compiled", "fake  2  2"]
    (tmp,) = made
    assert not tmp.exists()  # the temporary cache is removed
    text = capsys.readouterr().out
    assert "coldstart: check --profile ci (torch_native)" in text
    assert f"floor s ({os.cpu_count()} cores)" in text
    assert "cache by library: fake 0 MiB" in text


def test_a_runs_cpu_counts_the_processes_its_check_started(monkeypatch, tmp_path):
    """Each run's CPU includes what the check's own children burned (the fake's "compile" child), and
    no more than the machine could give it in its wall time."""
    made = _fake(monkeypatch, tmp_path)
    monkeypatch.setattr(coldstart.shutil, "rmtree", lambda p, ignore_errors: None)
    rows = coldstart.coldstart("cpu", ["torch_native"], 60.0)
    (tmp,) = made
    burned = [float(x) for x in (tmp / "cpu.log").read_text().split()]
    assert len(burned) == 2
    for row, child in zip(rows, burned):
        assert child >= 0.3 and row.cpu_seconds >= child, (row.run, row.cpu_seconds, child)
        assert row.cpu_seconds <= row.seconds * row.cores and row.cores == os.cpu_count()


def test_the_children_get_only_the_cache_dir_and_run_in_order(monkeypatch, tmp_path):
    made = _fake(monkeypatch, tmp_path)
    seen: list[str] = []
    monkeypatch.setattr(coldstart.shutil, "rmtree", lambda p, ignore_errors: seen.append(str(p)))
    rows = coldstart.coldstart("cpu", None, 60.0)
    (tmp,) = made
    calls = (tmp / "calls.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["check", "check"]  # one command each, as make check
    assert all(c.endswith("leaked=") for c in calls), calls  # no cache variable from the parent
    assert all(f"--cache-dir {tmp / 'cache'} --profile ci" in c for c in calls)
    assert "--device cpu" in calls[1] and "--backend" not in calls[1]
    assert [r.exit for r in rows] == [0, 0] and seen == [str(tmp)]


def test_a_failed_compile_or_check_is_a_row_with_its_reason_and_fails_the_bench(monkeypatch, tmp_path):
    _fake(monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_WARMUP_FAILED", "1")
    rows = coldstart.coldstart("cpu", ["torch_native"], 60.0)
    assert [r.warmup_failed for r in rows] == [1, 1] and [r.exit for r in rows] == [0, 0]
    assert rows[0].reason.startswith("check exit 0, 1 variants failed to compile:")
    doc = {"coldstart": [vars(r) for r in rows]}
    assert bench.passed(doc) is False
    assert "  cold: check exit 0, 1 variants failed to compile:" in render(doc)
    monkeypatch.setenv("FAKE_WARMUP_FAILED", "0")
    monkeypatch.setenv("FAKE_CHECK_EXIT", "1")
    rows = coldstart.coldstart("cpu", ["torch_native"], 60.0)
    assert [r.exit for r in rows] == [1, 1] and bench.passed({"coldstart": [vars(r) for r in rows]}) is False


def test_coldstart_runs_only_when_asked_for():
    assert "coldstart" in bench.SECTIONS and "coldstart" not in bench.DEFAULT_SECTIONS
