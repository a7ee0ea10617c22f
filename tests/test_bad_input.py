"""Bad input to the command line: each is one line naming the problem, exit status 2, and
nothing already written is lost (no report replaced, no run started, `latest` kept)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import hunts
from harness.checks import footprint
from harness.cli import main
from harness.core.case import MAX_REQUESTS, Case, CaseError, Request
from harness.report import results_json
from harness.run import check
from tests.report_helpers import sample_document

ROOT = Path(__file__).resolve().parent.parent
EXTEND = {"mode": "EXTEND", "requests": [{"prefix_len": 3, "extend_len": 4}]}
GIB = 1 << 30


def one_line_error(capsys, argv, *needles):
    """`main(argv)` exits 2 with one line on stderr holding every needle; returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    return err


def broken_factory():
    raise RuntimeError("no such driver\nsecond line")


# --- the Case: numbers of the wrong kind ----------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [(16.0, "16.0"), (True, "True")])
def test_page_size_must_be_an_integer(capsys, value, shown):
    case = json.dumps({**EXTEND, "page_size": value})
    one_line_error(capsys, ["repro", case], f"page_size={shown} must be an integer")


INT_FIELDS = ("num_q_heads", "num_kv_heads", "head_dim", "window_left", "page_size", "seed")
REQUEST_INT_FIELDS = ("prefix_len", "extend_len", "encoder_len")


@pytest.mark.parametrize("field", INT_FIELDS + REQUEST_INT_FIELDS)
@pytest.mark.parametrize("wrong", [True, 16.0])
def test_every_integer_field_refuses_bools_and_floats(field, wrong):
    """16.0 == 16 and True == 1 in Python: an integer field must check the type, not just the value."""
    d = json.loads(json.dumps(EXTEND))
    (d["requests"][0] if field in REQUEST_INT_FIELDS else d)[field] = wrong
    with pytest.raises(CaseError, match=f"{field}={wrong!r} must be an integer"):
        Case.from_dict(d)


@pytest.mark.parametrize("field", ["soft_cap", "sm_scale", "q_amplitude"])
@pytest.mark.parametrize("wrong", [True, "1", 10**400], ids=["true", "string", "10**400"])
def test_every_real_field_refuses_bools_strings_and_numbers_no_float_holds(field, wrong):
    with pytest.raises(CaseError, match=f"{field}="):
        Case.from_dict({**EXTEND, field: wrong})


def test_a_json_integer_too_long_to_read_is_malformed_json(capsys):
    one_line_error(capsys, ["repro", '{"mode": "EXTEND", "seed": 1' + "0" * 5000 + "}"], "malformed JSON")


# --- files that are not UTF-8 -----------------------------------------------------------------------


def test_a_case_file_that_is_not_utf8(capsys, tmp_path):
    bad = tmp_path / "case.json"
    bad.write_bytes(json.dumps(EXTEND).encode() + b"\xff")
    one_line_error(capsys, ["repro", str(bad)], str(bad), "not UTF-8")


def test_a_results_file_that_is_not_utf8_replaces_no_report(capsys, tmp_path):
    bad = tmp_path / "results.json"
    bad.write_bytes(b'{"format": "attn-harness-results"}\xff')
    (tmp_path / "index.html").write_text("the old report")
    one_line_error(capsys, ["report", str(bad)], str(bad), "not UTF-8")
    assert (tmp_path / "index.html").read_text() == "the old report"


# --- size: requests and memory ------------------------------------------------------------------------


def test_too_many_requests_is_refused_before_anything_runs(capsys, tmp_path):
    big = tmp_path / "decode.json"
    big.write_text(json.dumps({"mode": "DECODE", "requests": [{"prefix_len": 0, "extend_len": 1}] * 200_000}))
    one_line_error(capsys, ["repro", str(big)], "requests has 200000 entries", f"at most {MAX_REQUESTS}")
    Case(mode="DECODE", requests=(Request(0, 1),) * MAX_REQUESTS)  # the bound itself is a valid case


def test_a_case_larger_than_free_memory_names_the_estimate_and_the_limit(capsys, monkeypatch):
    """10^9 keys need terabytes on any machine; 10^7 need well over 100 GiB, here against 16 GiB free."""
    huge = json.dumps({"mode": "EXTEND", "requests": [{"prefix_len": 10**9, "extend_len": 8}]})
    err = one_line_error(capsys, ["repro", huge, "--device", "cpu"], "too large for cpu", "1000000008 keys")
    assert "GiB (pool" in err and "reference" in err and "free" in err
    monkeypatch.setattr(footprint, "available", lambda device: 16 * GIB)
    large = json.dumps({"mode": "EXTEND", "requests": [{"prefix_len": 10**7, "extend_len": 8}]})
    one_line_error(capsys, ["repro", large, "--device", "cpu"], "10000008 keys", "than the 16.0 GiB free")
    assert main(["repro", json.dumps(EXTEND), "--device", "cpu"]) == 0  # a small case still runs


def test_the_limit_is_the_devices_free_memory(monkeypatch):
    import torch

    assert 0 < footprint.available("cpu") < 1 << 50  # the host's available RAM
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (3 * GIB, 80 * GIB))
    assert footprint.available("cuda") == 3 * GIB
    case = Case(mode="DECODE", requests=(Request(2_000_000, 1),))
    assert 3 * GIB < sum(footprint.estimate(case, "cuda").values()) < 80 * GIB
    with pytest.raises(CaseError, match="more than the 3.0 GiB free"):
        footprint.fits(case, "cuda")


def test_the_estimate_grows_with_every_dimension_of_a_case():
    base = Case(mode="EXTEND", requests=(Request(1000, 64),), num_q_heads=8, num_kv_heads=2, head_dim=64)
    total = sum(footprint.estimate(base, "cpu").values())
    for change in (
        dict(requests=(Request(4000, 64),)),
        dict(requests=(Request(1000, 256),)),
        dict(requests=(Request(1000, 64),) * 3),
        dict(num_q_heads=16, num_kv_heads=4),
        dict(head_dim=128),
        dict(dtype="float32"),
    ):
        assert sum(footprint.estimate(base.replace(**change), "cpu").values()) > total, change


RSS_PROBE = """
from harness.backends import load
from harness.checks.footprint import estimate
from harness.checks.numeric import check_case
from harness.core.case import Case, Request

def size(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

backend = load("torch_native")
check_case(backend, Case(mode="EXTEND", requests=(Request(40, 8),)), "cpu")  # imports and first-use costs
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again at the resident size: an earlier peak hides nothing
before = size("VmRSS")
case = Case(mode="EXTEND", requests=(Request(30000, 8), Request(500, 40)), num_q_heads=8, num_kv_heads=2)
assert check_case(backend, case, "cpu").status == "pass"
print(size("VmHWM") - before, sum(estimate(case, "cpu").values()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs: Linux")
def test_the_estimate_is_not_below_what_a_check_takes():
    """Measured: the peak memory a CPU check of a long request adds (its own process) is at most the
    estimate, and the estimate is not so high that it would refuse cases that fit several times over."""
    argv = [sys.executable, "-c", RSS_PROBE]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grew, estimated = map(int, out.stdout.split())
    assert grew <= estimated <= 4 * grew, (grew, estimated)


# --- backends -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["list"], ["repro", json.dumps(EXTEND)], ["check"]])
def test_a_factory_that_raises_is_one_line_naming_the_spec(capsys, command):
    spec = "tests.test_bad_input:broken_factory"
    one_line_error(capsys, [*command, "--backend", spec], f"backend {spec!r}", "RuntimeError: no such driver")


# --- report: a results file of the right header with wrongly typed records ----------------------------


def _first(doc, status):
    return next(r for r in doc["results"] if r["status"] == status and r.get("probe"))


WRONG_RECORDS = [
    (lambda d: d["results"][0].update(backend=3), "results[0].backend=3 must be a string"),
    (lambda d: d["results"][0].update(features="window"), "results[0].features='window' must be a list"),
    (lambda d: d["results"][0].update(features=[1]), "results[0].features[0]=1 must be a string"),
    (lambda d: d["results"][0].update(seconds="slow"), "results[0].seconds='slow' must be a number or null"),
    (lambda d: d["results"][0].update(reason=["x"]), "results[0].reason=['x'] must be a string or null"),
    (lambda d: d["results"][0]["verdict"].update(ratio="x"), "verdict.ratio='x' must be a number or null"),
    (lambda d: d["results"][0]["verdict"].update(worst=[0, "a", 1]), "verdict.worst=[0, 'a', 1] must be"),
    (lambda d: _first(d, "fail")["error_map"].update(token_bin=0), "token_bin=0 and heads=8 must be >= 1"),
    (lambda d: _first(d, "fail")["error_map"]["values"].append([1.0]), "must be a list of heads=8 values"),
    (lambda d: _first(d, "fail")["error_map"].pop("heads"), "error_map lacks field 'heads'"),
    (lambda d: _first(d, "fail")["probe"].update(lines="x"), "probe.lines='x' must be a list"),
    (lambda d: _first(d, "fail")["probe"]["requests"][0]["grid"].append("ab"), "grid must be rows of one"),
    (lambda d: _first(d, "fail")["probe"]["requests"][0].update(row_bin="1"), "row_bin='1' must be an int"),
    (lambda d: d["run"].update(elapsed_s="x"), "run.elapsed_s='x' must be a number or null"),
]


@pytest.mark.parametrize(("spoil", "message"), WRONG_RECORDS, ids=[m for _, m in WRONG_RECORDS])
def test_report_of_wrongly_typed_records_replaces_no_report(capsys, tmp_path, spoil, message):
    doc = sample_document()
    spoil(doc)
    path = tmp_path / "results.json"
    path.write_text(results_json.dumps(doc))
    for name in ("index.html", "junit.xml"):
        (tmp_path / name).write_text(f"the old {name}")
    one_line_error(capsys, ["report", str(path)], str(path), message)
    for name in ("index.html", "junit.xml"):
        assert (tmp_path / name).read_text() == f"the old {name}"


def test_the_sample_document_itself_renders(capsys, tmp_path):
    """The checks above refuse only what they spoil: the real document they start from is accepted."""
    path = tmp_path / "results.json"
    path.write_text(results_json.dumps(sample_document()))
    assert main(["report", str(path)]) == 0


# --- check and mutants: refused before any run --------------------------------------------------------


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if a check's pytest or a mutant hunt is started."""

    def started(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(check.subprocess, "run", started)  # a --shard check's collection
    monkeypatch.setattr(check, "run_pytest", started)
    monkeypatch.setattr(hunts, "run", started)


@pytest.fixture
def reports(tmp_path):
    """A reports directory whose `latest` points at an earlier run."""
    root = tmp_path / "reports"
    (root / "earlier").mkdir(parents=True)
    (root / "latest").symlink_to("earlier")
    return root


def _untouched(root):
    assert sorted(p.name for p in root.iterdir()) == ["earlier", "latest"]
    assert (root / "latest").resolve() == root / "earlier"


def test_check_results_in_a_missing_directory_fails_before_the_run(capsys, no_run, reports):
    argv = ["check", "--device", "cpu", "--reports", str(reports), "--results", "/nonexistent/dir/x.json"]
    one_line_error(capsys, argv, "--results /nonexistent/dir/x.json", "no such directory /nonexistent/dir")
    one_line_error(capsys, argv[:-1] + [str(reports)], "is a directory")
    _untouched(reports)


@pytest.mark.parametrize(("option", "expression"), [("-m", "not (("), ("-k", "swa and")])
def test_check_with_a_bad_expression_keeps_latest(capsys, no_run, reports, option, expression):
    argv = ["check", "--device", "cpu", "--reports", str(reports), option, expression]
    one_line_error(capsys, argv, f"{option} {expression!r} is not a valid pytest expression", "column")
    _untouched(reports)


def test_check_that_pytest_refuses_keeps_latest(capsys, monkeypatch, reports):
    """Whatever else pytest refuses (exit 4): its empty report does not become `latest`."""
    monkeypatch.setattr(check, "run_pytest", lambda cmd, cwd, env: subprocess.CompletedProcess(cmd, 4))
    assert main(["check", "--device", "cpu", "--reports", str(reports), "--no-progress"]) == 2
    assert "latest" in capsys.readouterr().err
    assert (reports / "latest").resolve() == reports / "earlier"


def test_mutants_json_in_a_missing_directory_fails_before_the_first_hunt(capsys, no_run):
    argv = ["mutants", "--mutant", "stale_page", "--device", "cpu", "--json", "/nonexistent/m.json"]
    one_line_error(capsys, argv, "--json /nonexistent/m.json", "no such directory")


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_mutants_max_examples_is_checked_as_it_is_parsed(capsys, no_run, value):
    argv = ["mutants", "--mutant", "stale_page", "--max-examples", value]
    one_line_error(capsys, argv, "argument --max-examples", value)
