"""A check split over CI runners: `check --shard I/N` run one share after another, then `merge`,
gives exactly the records of one unsharded check over the same selection."""

import json
import os
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from tests.report_helpers import ROOT

SELECTION = ["--backend", "torch_native", "--family", "decode", "--device", "cpu"]
SHARES = 4


def _harness(*args: str, cwd: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")} | (env_extra or {})
    cmd = [sys.executable, "-m", "harness", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=900)


@cache
def _runs(tmp: Path) -> dict:
    """One unsharded check, SHARES shares (the third from $ATTN_HARNESS_SHARD), and their merge."""
    common = [*SELECTION, "--no-progress", "--reports", str(tmp / "reports")]
    out = {"full": _harness("check", *common, "--results", str(tmp / "full.json"), cwd=tmp)}
    for i in range(1, SHARES + 1):
        how = {"env_extra": {"ATTN_HARNESS_SHARD": f"{i}/{SHARES}"}} if i == 3 else {}
        shard = [] if i == 3 else ["--shard", f"{i}/{SHARES}"]
        out[i] = _harness("check", *common, *shard, "--results", str(tmp / f"s{i}.json"), cwd=tmp, **how)
    shares = [str(tmp / f"s{i}.json") for i in range(1, SHARES + 1)]
    out["merge"] = _harness("merge", *shares, "--out", str(tmp / "merged"), cwd=tmp)
    out["partial"] = _harness("merge", *shares[:-1], "--out", str(tmp / "partial"), cwd=tmp)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    return tmp, _runs(tmp)


def _records(path: Path) -> Counter:
    data = json.loads(path.read_text())
    return Counter(
        (r["backend"], r["test_id"], json.dumps(r.get("case"), sort_keys=True), r["status"], r["reason"])
        for r in data["results"]
    )


def test_every_share_and_the_merge_exit_green(runs):
    _, out = runs
    for name, proc in out.items():
        if name != "partial":
            assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-2000:])


def test_the_merged_shares_hold_exactly_the_unsharded_check_s_records(runs):
    tmp, _ = runs
    full, merged = _records(tmp / "full.json"), _records(tmp / "merged" / "results.json")
    assert sum(full.values()) > 0
    assert merged == full


def test_each_test_is_checked_by_one_share_only(runs):
    tmp, _ = runs
    tests = [{r["test_id"] for r in json.loads((tmp / f"s{i}.json").read_text())["results"]}
             for i in range(1, SHARES + 1)]
    assert sum(len(t) for t in tests) == len(set().union(*tests))


def test_each_share_says_its_part_of_the_split(runs):
    tmp, out = runs
    keys = set()
    for i in range(1, SHARES + 1):
        shard = json.loads((tmp / f"s{i}.json").read_text())["run"]["shard"]
        assert (shard["index"], shard["count"]) == (i, SHARES)
        keys.add(shard["key"])
        assert f"share {i}/{SHARES}:" in out[i].stdout
    assert len(keys) == 1


def test_a_merge_missing_a_share_is_incomplete_and_not_green(runs):
    tmp, out = runs
    assert out["partial"].returncode == 3
    page = (tmp / "partial" / "index.html").read_text()
    assert "attn-harness report: INCOMPLETE" in page and f"shares missing: {SHARES}/{SHARES}" in page


def test_a_bad_share_is_one_line_before_anything_runs(tmp_path):
    for args, needle in (
        (["--shard", "0/4"], "expected I/N with integers 1 <= I <= N"),
        (["--costs", str(tmp_path / "none.json")], "cannot read a JSON cost table"),
    ):
        proc = _harness("check", *SELECTION, *args, "--reports", str(tmp_path / "r"), cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())
