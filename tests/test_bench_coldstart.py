"""The bench's coldstart section (harness/tools/bench/coldstart.py), against a stand-in harness: the
check (its warm-up beside it) in a fresh cache directory and then with it warm, the children free of
the parent's cache variables, and a failed compile or check reported and failing the bench."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness import cli
from harness.tools import bench
from harness.tools.bench import coldstart, harness_child
from harness.tools.bench.table import render

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
