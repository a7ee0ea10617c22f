"""Every suite test leaves a record where users look (results.json, the summary, index.html,
junit.xml): a harness exception as an `error` with its traceback, a search the backend mostly
refused as a `fail` beside its `refused` cases, a known library issue as an `xfail`, and a
model-level check as a `model` row."""

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.report import results_json

ROOT = Path(__file__).resolve().parent.parent

SUITE = '''
import dataclasses

import pytest

from harness.checks import numeric
from harness.run import isolation
from harness.run.suite import Target, run_family

REAL_BUILD = numeric.build_batch
REAL_CHECK = isolation.check


def broken_build(case, *args, **kwargs):
    """A harness bug (not the backend's): build_batch raises on batches of more than one request."""
    if len(case.requests) > 1:
        raise TypeError("a harness bug <sim>")
    return REAL_BUILD(case, *args, **kwargs)


@pytest.mark.parametrize("target", [Target("torch_native", "cpu", "decode", "full").param()])
def test_decode(target, record, monkeypatch):
    monkeypatch.setattr(numeric, "build_batch", broken_build)
    run_family(target, record)


REFUSER = Target("tests.test_refusals:RefusesOtherPages", "cpu", "prefill", "full")


def known_on_batches(backend, case, device):
    """A known library issue (xfail) on every batch of more than one request <sim>."""
    res = REAL_CHECK(backend, case, device)
    if len(case.requests) > 1:
        return dataclasses.replace(res, status="xfail", reason="known issue <sim>")
    return res


@pytest.mark.parametrize("target", [Target("torch_native", "cpu", "verify", "full").param()])
def test_verify(target, record, monkeypatch):
    monkeypatch.setattr(isolation, "check", known_on_batches)
    run_family(target, record)


@pytest.mark.parametrize("target", [REFUSER.param()])
def test_prefill(target, record):
    run_family(target, record)
'''


def _pytest(args: list[str], cwd: Path, report: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    cmd += ["--harness-report", str(report)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str, ET.Element]:
    """A two-test suite (a harness bug, a mostly refusing backend) run by pytest with the plugin:
    (results.json, stdout, index.html, junit.xml root)."""
    tmp = tmp_path_factory.mktemp("suite")
    (tmp / "conftest.py").write_text((ROOT / "conftest.py").read_text())  # the plugin and the profile
    (tmp / "test_suite.py").write_text(textwrap.dedent(SUITE))
    proc = _pytest(["test_suite.py"], tmp, tmp / "report")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _outputs(tmp / "report", proc)


def _outputs(report: Path, proc: subprocess.CompletedProcess) -> tuple[dict, str, str, ET.Element]:
    data = results_json.load(report / "results.json")
    page = (report / "index.html").read_text()
    return data, proc.stdout, page, ET.parse(report / "junit.xml").getroot()


def _row(stdout: str, backend: str, family: str) -> dict:
    lines = stdout.splitlines()
    head = next(line for line in lines if line.startswith("backend ")).split()
    row = next(line for line in lines if line.startswith(f"{backend}@cpu ") and f" {family} " in line)
    return dict(zip(head, row.split()))


def test_a_harness_exception_is_an_error_record_with_its_traceback(suite_run):
    data, stdout, page, junit = suite_run
    decode = [r for r in data["results"] if r["test_id"].endswith("test_decode[torch_native-cpu-full]")]
    errors = [r for r in decode if r["status"] == "error"]
    assert len(errors) == 1 and any(r["status"] == "pass" for r in decode)
    err = errors[0]
    assert err["reason"].startswith("the harness raised TypeError: a harness bug <sim> (at test_suite.py:")
    assert "TypeError: a harness bug <sim>" in err["extra"]["traceback"]
    assert err["backend"] == "torch_native" and err["family"] == "decode"
    assert _row(stdout, "torch_native", "decode")["error"] == "1"
    assert "attn-harness report: FAILED" in page and "ERROR · torch_native on cpu" in page
    assert '<pre class="traceback">' in page and "a harness bug &lt;sim&gt;" in page
    error = junit.find(".//testcase/error[@type='error']")
    assert error is not None and "a harness bug <sim>" in error.get("message")
    assert "Traceback:" in error.text


def test_a_known_issue_a_passing_search_reaches_is_an_xfail_record(suite_run):
    data, stdout, page, junit = suite_run
    verify = [r for r in data["results"] if r["family"] == "verify"]
    xfails = [r for r in verify if r["status"] == "xfail"]
    assert xfails and all(r["reason"] == "known issue <sim>" for r in xfails)
    assert all(len(r["case"]["requests"]) > 1 for r in xfails)
    assert _row(stdout, "torch_native", "verify")["xfail"] == str(len(xfails))
    skipped = [s.get("message") for s in junit.iter("skipped")]
    assert skipped.count("expected failure: known issue <sim>") == len(xfails)


def test_a_mostly_refused_search_is_a_failure_and_its_refusals_are_shown(suite_run):
    data, stdout, page, junit = suite_run
    prefill = [r for r in data["results"] if r["backend"] == "tests.test_refusals:RefusesOtherPages"]
    refused = [r for r in prefill if r["status"] == "refused"]
    fails = [r for r in prefill if r["status"] == "fail"]
    assert refused and all(r["reason"] == "page size 16 only <sim>" for r in refused)
    assert len(fails) == 1 and fails[0]["case"] is None and "the backend refused" in fails[0]["reason"]
    row = _row(stdout, "tests.test_refusals:RefusesOtherPages", "prefill")
    assert row["refused"] == str(len(refused)) and row["checked"] == row["pass"] and row["fail"] == "1"
    assert "refused " + str(len(refused)) in stdout and "most often" in stdout
    assert 'id="refusal-table"' in page and "page size 16 only &lt;sim&gt;" in page
    assert "drawn but refused by the backend: " + str(len(refused)) in page
    skipped = [s.get("message") for s in junit.iter("skipped")]
    assert skipped.count("refused by the backend: page size 16 only <sim>") == len(refused)


FAKE_CUDA = """
import json, os
from harness.backends.torch_native import TorchNative
from harness.checks.model.check import ModelResult
from harness.run import isolation

TorchNative.available = lambda self, device: None  # as if on a GPU

class Runner:
    worker = "the isolation worker"

isolation.runner_for = lambda device: Runner

def log(*event):
    with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
        f.write(json.dumps(event) + "\\n")

def run_jobs(jobs, device, timeout, worker=None):
    log("jobs", jobs, device, worker)
    return [
        ModelResult(
            model=model, backend=name, device=device, status="pass", reason="faked", dtype="bfloat16/float32"
        )
        for name, model in jobs
    ]

def pytest_collection_finish(session):
    import cases.test_model
    cases.test_model.run_jobs = run_jobs

def pytest_runtest_call(item):
    log("test", item.callspec.params["model"])
"""


def test_each_cuda_model_check_runs_within_its_own_test_in_the_isolation_worker(tmp_path):
    """Its wall time is then its own (a part's time split and the reports' per-test times); before,
    the first model test ran all three in a session fixture."""
    (tmp_path / "fake_cuda.py").write_text(FAKE_CUDA)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), FAKE_CUDA_LOG=str(tmp_path / "log"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fake_cuda"]
    cmd += ["cases/test_model.py", "-k", "torch_native-cuda and not sglang"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    expected = []
    for model in ("gemma2", "gpt_oss", "mistral"):
        expected += [["test", model], ["jobs", [["torch_native", model]], "cuda", "the isolation worker"]]
    assert events == expected


def test_each_checked_case_is_one_record_though_hypothesis_draws_it_again(tmp_path):
    """Under the gpu profile hypothesis draws some of torch_native's cross cases more than once (13 of
    40 records were repeats on this machine before): each is checked once and recorded once, and the
    summary's count is the records'."""
    argv = [sys.executable, "-m", "harness", "check", "--device", "cpu", "--profile", "gpu"]
    argv += ["--backend", "torch_native", "--family", "cross", "--reports", str(tmp_path), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env["ATTN_HARNESS_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = results_json.load(tmp_path / "latest" / "results.json")["results"]
    keys = [(r["test_id"], json.dumps(r["case"], sort_keys=True)) for r in records if r["case"]]
    assert keys and len(keys) == len(set(keys))
    assert _row(proc.stdout, "torch_native", "cross")["pass"] == str(len(keys))


def test_model_level_checks_are_rows_of_every_report(tmp_path):
    proc = _pytest(
        ["cases/test_model.py", "-k", "cpu-mistral and (torch_native or flex_eager) and not sglang"],
        ROOT,
        tmp_path / "r",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data, stdout, page, junit = _outputs(tmp_path / "r", proc)
    rows = {r["backend"]: r for r in data["results"]}
    assert {r["family"] for r in rows.values()} == {"model"} and len(rows) == 2
    native = rows["torch_native"]
    assert native["status"] == "pass" and native["extra"]["model"] == "mistral"
    assert native["extra"]["tokens"] > 0 and native["features"] == ["window", "deterministic"]
    assert native["verdict"]["ratio"] <= 1 and "logprobs differ beyond tolerance" in native["reason"]
    assert rows["flex_eager"]["status"] == "skip" and rows["flex_eager"]["extra"]["model"] == "mistral"
    assert _row(stdout, "torch_native", "model")["pass"] == "1"
    assert "<td>model</td>" in page
    names = {(c.get("classname"), c.get("name")) for c in junit.iter("testcase")}
    assert ("attn_harness.torch_native.cpu", "model[mistral] #0") in names
    assert json.dumps(native)  # plain JSON, as written


EMPTY = '''
import pytest


@pytest.mark.parametrize("target", [])  # as the determinism tests of a backend with no deterministic mode
def test_deterministic(target, record):
    record(target)


def test_other(record):
    pass
'''


def test_a_test_parametrized_over_nothing_is_deselected_not_a_skip_of_backend_question_mark(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "test_suite.py").write_text(EMPTY)
    proc = _pytest(["test_suite.py"], tmp_path, tmp_path / "report")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data, stdout, page, _ = _outputs(tmp_path / "report", proc)
    assert data["results"] == [] and "1 passed, 1 deselected" in stdout
    assert "?@?" not in stdout and "empty parameter set" not in page
