"""Bad input to the command line: each is one line naming the problem, exit status 2, and
nothing already written is lost (no report replaced, no run started, `latest` kept)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import hunts
from harness.backends.base import ALL_CAPABILITIES, Backend, BackendOutput
from harness.checks import footprint
from harness.cli import main
from harness.core import case as case_module
from harness.core.case import MAX_REQUESTS, Case, CaseError, Request
from harness.report import results_json
from harness.run import check
from harness.run.speed import settings
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


THIS = "tests.test_bad_input"  # this module in a --backend spec
RETURNS = "BackendOutput(out=[sum E, Hq, D] tensor, lse=None or [sum E, Hq] tensor)"


def broken_factory():
    raise RuntimeError("no such driver\nsecond line")


# --- the Case: numbers of the wrong kind ---


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


# --- files that are not UTF-8 ---


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


# --- size: requests and memory ---


def test_too_many_requests_is_refused_before_anything_runs(capsys, tmp_path):
    big = tmp_path / "decode.json"
    big.write_text(json.dumps({"mode": "DECODE", "requests": [{"prefix_len": 0, "extend_len": 1}] * 200_000}))
    one_line_error(capsys, ["repro", str(big)], "requests has 200000 entries", f"at most {MAX_REQUESTS}")
    Case(mode="DECODE", requests=(Request(0, 1),) * MAX_REQUESTS)  # the bound itself is a valid case


def test_a_case_larger_than_free_memory_names_the_estimate_and_the_limit(capsys, monkeypatch):
    """10^9 keys need terabytes on any machine; 10^7 well over 100 GiB, here against 16 GiB free."""

    def keys(prefix: int) -> list[str]:
        case = {**EXTEND, "requests": [{"prefix_len": prefix, "extend_len": 8}]}
        return ["repro", json.dumps(case), "--device", "cpu"]

    err = one_line_error(capsys, keys(10**9), "too large for cpu", "1000000008 keys")
    assert "GiB (pool" in err and "reference" in err and "free" in err
    monkeypatch.setattr(footprint, "available", lambda device: 16 * GIB)
    one_line_error(capsys, keys(10**7), "10000008 keys", "than the 16.0 GiB free")
    assert main(["repro", json.dumps(EXTEND), "--device", "cpu"]) == 0  # a small case still runs


def test_the_limit_is_the_devices_free_memory(monkeypatch):
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
    f.write("5")  # the peak (VmHWM) restarts at the resident size: an earlier peak hides nothing
before = size("VmRSS")
case = Case(mode="EXTEND", requests=(Request(30000, 8), Request(500, 40)), num_q_heads=8, num_kv_heads=2)
assert check_case(backend, case, "cpu").status == "pass"
print(size("VmHWM") - before, sum(estimate(case, "cpu").values()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs: Linux")
def test_the_estimate_is_not_below_what_a_check_takes():
    """Measured in its own process: the peak memory a CPU check of a long request adds is at most the
    estimate, and the estimate is not so high it refuses cases that fit several times over."""
    argv = [sys.executable, "-c", RSS_PROBE]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grew, estimated = map(int, out.stdout.split())
    assert grew <= estimated <= 4 * grew, (grew, estimated)


# --- backends ---


@pytest.mark.parametrize("command", [["list"], ["repro", json.dumps(EXTEND)], ["check"]])
def test_a_factory_that_raises_is_one_line_naming_the_spec(capsys, command):
    spec = f"{THIS}:broken_factory"
    one_line_error(capsys, [*command, "--backend", spec], f"backend {spec!r}", "RuntimeError: no such driver")


# --- report: a results file of the right header with wrongly typed records ---


def _failed(doc):
    return next(r for r in doc["results"] if r["status"] == "fail" and r.get("probe"))


WRONG_RECORDS = [
    (lambda d: d["results"][0].update(backend=3), "results[0].backend=3 must be a string"),
    (lambda d: d["results"][0].update(features="window"), "results[0].features='window' must be a list"),
    (lambda d: d["results"][0].update(features=[1]), "results[0].features[0]=1 must be a string"),
    (lambda d: d["results"][0].update(seconds="slow"), "results[0].seconds='slow' must be a number or null"),
    (lambda d: d["results"][0].update(reason=["x"]), "results[0].reason=['x'] must be a string or null"),
    (lambda d: d["results"][0]["verdict"].update(ratio="x"), "verdict.ratio='x' must be a number or null"),
    (lambda d: d["results"][0]["verdict"].update(worst=[0, "a", 1]), "verdict.worst=[0, 'a', 1] must be"),
    (lambda d: _failed(d)["error_map"].update(token_bin=0), "token_bin=0 and heads=8 must be >= 1"),
    (lambda d: _failed(d)["error_map"]["values"].append([1.0]), "must be a list of heads=8 values"),
    (lambda d: _failed(d)["error_map"].pop("heads"), "error_map lacks field 'heads'"),
    (lambda d: _failed(d)["probe"].update(lines="x"), "probe.lines='x' must be a list"),
    (lambda d: _failed(d)["probe"]["requests"][0]["grid"].append("ab"), "grid must be rows of one"),
    (lambda d: _failed(d)["probe"]["requests"][0].update(row_bin="1"), "row_bin='1' must be an int"),
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
    """The checks above refuse only what they spoil: the document they start from is accepted."""
    path = tmp_path / "results.json"
    path.write_text(results_json.dumps(sample_document()))
    assert main(["report", str(path)]) == 0


# --- check and mutants: refused before any run ---


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


def _prepare(**request) -> check.Prepared:
    return check.prepare(check.CheckRequest(device="cpu", **request), lambda line: None)


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


# --- the Case: integers past the engines' range ---

INT32_MAX = 2**31 - 1
INT32_FIELDS = {  # every integer a Case carries into a kernel, and a case where it can take its largest
    "window_left": {},
    "num_q_heads": {"num_kv_heads": 1},
    "num_kv_heads": {"num_q_heads": INT32_MAX},
}
REQUEST_INT32_FIELDS = ("prefix_len", "extend_len")


@pytest.mark.parametrize("value", [2**31, 2**62, 2**63, 10**30])
@pytest.mark.parametrize("field", [*INT32_FIELDS, *REQUEST_INT32_FIELDS, "encoder_len", "window_right"])
def test_an_integer_past_int32_is_one_line_naming_the_field_and_the_range(capsys, field, value):
    """Engines pass lengths, windows and head counts as int32: past it a kernel wraps or overflows, so
    the Case refuses it (exit 2) before a backend is blamed."""
    mode = {"encoder_len": "CROSS", "window_right": "ENCODER_ONLY"}.get(field, "EXTEND")
    d = {"mode": mode, "requests": [{"prefix_len": 0 if mode == "ENCODER_ONLY" else 3, "extend_len": 4}]}
    if mode == "CROSS":
        d["requests"][0]["encoder_len"] = 5
    if field == "window_right":
        d["window_left"] = 2
    (d["requests"][0] if field in (*REQUEST_INT32_FIELDS, "encoder_len") else d)[field] = value
    err = one_line_error(capsys, ["repro", json.dumps(d)], f"{field}={value}", "[", f"{INT32_MAX}]", "int32")
    assert "CRASH" not in err and "FAIL" not in err


@pytest.mark.parametrize("field", list(INT32_FIELDS))
def test_int32s_largest_is_a_valid_case(field):
    """The bound itself is accepted: the check is at int32's edge, not below it."""
    Case.from_dict({**EXTEND, field: INT32_MAX, **INT32_FIELDS[field]})
    with pytest.raises(CaseError, match=f"{field}={INT32_MAX + 1} must be in"):
        Case.from_dict({**EXTEND, field: INT32_MAX + 1, **INT32_FIELDS[field]})


def test_a_window_at_int32s_largest_is_judged_like_no_window(capsys):
    """window_left = 2**31 - 1 covers every key: the backends pass, as with no window."""
    windowed = json.dumps({**EXTEND, "window_left": INT32_MAX})
    for backend in ("torch_native", "torch_split", "flex_eager"):
        assert main(["repro", windowed, "--backend", backend, "--device", "cpu"]) == 0, backend
        assert "PASS" in capsys.readouterr().out


def test_the_batchs_token_count_is_an_int32_index():
    """Each request within int32 but the batch past it: the KV pool's slot indices would overflow."""
    half = Request(prefix_len=2**30, extend_len=1)
    with pytest.raises(CaseError, match=f"tokens in all, past {INT32_MAX}"):
        Case(mode="EXTEND", requests=(half, half))


@pytest.mark.parametrize("value", [1e30, 4.0, float("inf")])
def test_a_float_where_an_integer_is_wanted_is_refused(value):
    with pytest.raises(CaseError, match="window_left=.* must be an integer"):
        Case.from_dict({**EXTEND, "window_left": value})
    tree = {"mode": "TARGET_VERIFY", "requests": [{"prefix_len": 3, "extend_len": 2, "tree": [-1, value]}]}
    with pytest.raises(CaseError, match=r"requests\[0\].tree\[1\]=.* must be -1 or the index"):
        Case.from_dict(tree)


def test_graph_case_sizes_are_int32():
    from harness.core.graph_case import GraphCase

    batch = {"mode": "DECODE", "requests": [{"prefix_len": 3, "extend_len": 1}]}
    with pytest.raises(CaseError, match=f"max_kv={2**40} must be an integer in \\[1, {INT32_MAX}\\]"):
        GraphCase.from_dict({"batches": [batch], "max_batch": 4, "max_kv": 2**40})


# --- the Case's JSON: duplicate keys, long values ---


@pytest.mark.parametrize(
    "text",
    [
        '{"mode": "EXTEND", "window_left": 3, "requests": [{"prefix_len": 3, "extend_len": 4}], '
        '"window_left": -1}',
        '{"mode": "EXTEND", "requests": [{"prefix_len": 3, "extend_len": 4, "prefix_len": 9}]}',
    ],
    ids=["case", "request"],
)
def test_a_key_given_twice_is_refused_naming_it(capsys, text):
    """json keeps the last of two equal keys: the case run would not be the case written."""
    key = "window_left" if "window_left" in text else "prefix_len"
    one_line_error(capsys, ["repro", text], f"field '{key}' is given twice")


def test_a_graph_case_with_a_key_given_twice_is_refused(capsys):
    batch = '{"mode": "DECODE", "requests": [{"prefix_len": 3, "extend_len": 1}]}'
    text = f'{{"batches": [{batch}], "max_batch": 4, "max_kv": 64, "max_kv": 8}}'
    one_line_error(capsys, ["repro", text], "field 'max_kv' is given twice")


@pytest.mark.parametrize("field", ["mode", "dtype", "window_left", "page_layout", "k_scale"])
def test_a_huge_value_is_cut_in_the_error_line(capsys, field):
    """A 50 MB field is named by its start and its length, not echoed whole into the one line."""
    huge = "x" * 50_000_000
    argv = ["repro", json.dumps({**EXTEND, field: huge})]
    err = one_line_error(capsys, argv, f"{field}='xxxx", "(50000002 characters)")
    assert len(err) < 500


def test_a_huge_unknown_field_name_is_cut_too(capsys):
    argv = ["repro", json.dumps({**EXTEND, "y" * 1_000_000: 1})]
    err = one_line_error(capsys, argv, "unknown Case field", "characters)")
    assert len(err) < 500


# --- a plugin backend that breaks the contract ---


class NoCapabilities(Backend):
    def run(self, batch):
        return BackendOutput(out=batch.q)


class CapabilitiesAsADict(NoCapabilities):
    capabilities = {"modes": ["EXTEND"]}


class NoRun(Backend):
    capabilities = ALL_CAPABILITIES


class BareTensor(NoRun):
    def run(self, batch):
        return batch.q.clone()


class TensorPair(NoRun):
    def run(self, batch):
        return BackendOutput(out=(batch.q, None))


CONTRACT = [
    ("NoCapabilities", "class NoCapabilities: `capabilities` has none; set it to a harness Capabilities"),
    ("CapabilitiesAsADict", "`capabilities` is a dict; set it to a harness Capabilities"),
    ("NoRun", "class NoRun does not implement run(batch), which must return a BackendOutput(out="),
]


@pytest.mark.parametrize(("plugin", "message"), CONTRACT, ids=[p for p, _ in CONTRACT])
@pytest.mark.parametrize(
    "command", [["list"], ["repro", json.dumps(EXTEND)], ["check"]], ids=["list", "repro", "check"]
)
def test_a_plugin_that_breaks_the_contract_is_one_line_naming_what_it_wants(
    capsys, no_run, command, plugin, message
):
    spec = f"{THIS}:{plugin}"
    one_line_error(capsys, [*command, "--backend", spec], f"backend {spec!r}", message, "docs/backends.md")


def install_plugin(monkeypatch, tmp_path, value: str) -> None:
    """A distribution myattn-engine 2.3.1 on sys.path whose entry point `myattn` in the backends'
    group is `value`; beside it raises_on_import, a module whose import raises."""
    info = tmp_path / "myattn_engine-2.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myattn-engine\nVersion: 2.3.1\n")
    (info / "entry_points.txt").write_text(f"[attn_harness.backends]\nmyattn = {value}\n")
    broken = 'raise OSError("libmyattn.so: cannot open shared object")\n'
    (tmp_path / "raises_on_import.py").write_text(broken)
    monkeypatch.syspath_prepend(str(tmp_path))


ENTRY = (
    "backend plugin 'myattn' (entry point myattn = {} in attn_harness.backends, registered by "
    "myattn-engine 2.3.1)"
)
BROKEN_PLUGINS = [
    (
        "raises_on_import:make",
        "cannot load " + ENTRY.format("raises_on_import:make"),
        "OSError: libmyattn.so: cannot open shared object (it must name an importable module:factory that "
        "returns a harness Backend",
    ),
    (
        f"{THIS}:NoRun",
        ENTRY.format(f"{THIS}:NoRun") + ": class NoRun does not implement run(batch)",
        f'which must return a {RETURNS} (docs/backends.md, "The contract")',
    ),
]


@pytest.mark.parametrize(("value", "named", "wants"), BROKEN_PLUGINS, ids=["import-raises", "no-run"])
@pytest.mark.parametrize("command", [["check"], ["check", "--backend", "myattn"], ["list"]])
def test_a_broken_entry_point_plugin_stops_a_check_that_does_not_name_it_in_one_line(
    capsys, monkeypatch, tmp_path, no_run, command, value, named, wants
):
    """A plain check (no --backend) checks every registered backend: an installed plugin whose import
    raises or that breaks the contract stops it before running, exit 2, in the line --backend and `list`
    give (the plugin, its entry point, what the contract wants), not a traceback from the collection."""
    install_plugin(monkeypatch, tmp_path, value)
    monkeypatch.chdir(tmp_path)  # a check's reports/ would be made here
    one_line_error(capsys, command, named, wants)
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize(("value", "named", "wants"), BROKEN_PLUGINS, ids=["import-raises", "no-run"])
def test_a_broken_entry_point_plugin_stops_pytest_cases_in_one_line(
    monkeypatch, tmp_path, value, named, wants
):
    """`pytest cases` without `check` collects every registered backend too: a broken plugin is a
    usage error (exit 4) in the same line, not a collection traceback."""
    install_plugin(monkeypatch, tmp_path, value)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    argv = [sys.executable, "-m", "pytest", str(ROOT / "cases"), "--collect-only", "-q"]
    argv += ["-p", "no:cacheprovider", "-p", "harness.run.pytest_plugin", f"--rootdir={ROOT}"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert "Traceback" not in out and named in out and wants in out, out[-3000:]


def test_a_plugin_that_loads_is_checked_by_a_plain_check(monkeypatch, tmp_path, no_run):
    """The other side: a plugin that meets the contract is among the backends a plain check runs."""
    install_plugin(monkeypatch, tmp_path, f"{THIS}:Zeros")
    job = _prepare(reports=tmp_path)
    assert "myattn" in job.names and "torch_native" in job.names


@pytest.mark.parametrize(
    ("plugin", "got"), [("BareTensor", "a Tensor"), ("TensorPair", "BackendOutput(out=tuple")]
)
def test_a_run_that_returns_the_wrong_thing_is_a_crash_saying_what_run_must_return(capsys, plugin, got):
    spec = f"{THIS}:{plugin}"
    assert main(["repro", json.dumps(EXTEND), "--backend", spec, "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "run() returned" in line)
    assert f"backend {spec!r}: run() returned {got}" in line
    assert f"it must return a {RETURNS}" in line


def test_an_unimplemented_run_called_directly_says_what_it_must_return():
    """The base class's run() (a backend built outside the registry) names the class and contract."""
    with pytest.raises(
        NotImplementedError, match="NoRun.run\\(batch\\) is not implemented: it must return a BackendOutput"
    ):
        NoRun().run(None)


class Zeros(NoRun):
    def run(self, batch):
        return BackendOutput(out=torch.zeros_like(batch.q))


def test_a_plugin_that_meets_the_contract_loads_and_is_judged(capsys):
    """The contract checks refuse only broken plugins: one that meets it runs and gets a verdict."""
    spec = f"{THIS}:Zeros"
    assert main(["list", "--backend", spec]) == 0
    assert main(["repro", json.dumps(EXTEND), "--backend", spec, "--device", "cpu"]) == 1
    assert "FAIL" in capsys.readouterr().out


# --- settings: flags and ATTN_HARNESS_* variables ---


@pytest.fixture
def env_profile(monkeypatch):
    """Set $ATTN_HARNESS_PROFILE for this test; the settings are read anew, before and after."""

    def setting(value):
        monkeypatch.setenv(settings.PROFILE_ENV, value)
        settings.reset()

    yield setting
    monkeypatch.delenv(settings.PROFILE_ENV, raising=False)
    settings.reset()


@pytest.mark.parametrize(
    ("flag", "variable", "used"), [(None, "dev", "dev"), ("ci", "dev", "ci"), (None, "", "ci")]
)
def test_check_honours_the_profile_variable_and_the_flag_beats_it(
    env_profile, tmp_path, flag, variable, used
):
    env_profile(variable)
    job = _prepare(profile=flag, reports=tmp_path)
    assert job.profile == used
    assert job.env[settings.PROFILE_ENV] == used


def test_check_refuses_an_unknown_profile_variable_in_one_line(capsys, env_profile, no_run, reports):
    env_profile("nonsense")
    argv = ["check", "--device", "cpu", "--reports", str(reports)]
    one_line_error(capsys, argv, "unknown profile 'nonsense' ($ATTN_HARNESS_PROFILE); known: ci")
    one_line_error(capsys, [*argv, "--profile", "nope"], "unknown profile 'nope' (--profile)")
    _untouched(reports)


@pytest.fixture
def requests_made(monkeypatch):
    """The CheckRequests `check` builds, run by nothing."""
    made = []

    def run_check(request, say):
        made.append(request)
        return check.RunResult(exit_status=0, run_dir=Path("run"), latest=Path("latest"))

    monkeypatch.setattr(check, "run_check", run_check)
    return made


def test_a_backend_named_twice_is_checked_once(requests_made, monkeypatch):
    from harness.backends import BACKENDS_ENV, selected

    twice = ["--backend", "torch_native", "--backend", "flex_eager", "--backend", "torch_native"]
    assert main(["check", *twice]) == 0
    assert requests_made[0].backends == ("torch_native", "flex_eager")
    monkeypatch.setenv(BACKENDS_ENV, "torch_native,flex_eager,torch_native")
    assert selected() == ["torch_native", "flex_eager"]  # what the suite parametrizes over


def test_the_graph_family_selects_the_replay_tests(tmp_path):
    assert check.families(["graph", "decode", "graph"], []) == ["graph", "decode"]
    job = _prepare(families=("graph",), reports=tmp_path)
    marker = job.cmd[len(job.cmd) - 1 - job.cmd[::-1].index("-m") + 1]  # pytest's -m, not python's
    assert marker.startswith("(graph)"), marker
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "cases"]
    argv += ["-m", marker]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    selected = [line for line in out.stdout.splitlines() if "::" in line]
    assert selected and all(line.startswith("cases/test_graph.py::") for line in selected), out.stdout[-2000:]
    with pytest.raises(check.RequestError, match="unknown family 'graphs'; known: .*encoder, graph"):
        check.families(["graphs"], [])


def pytest_run(*args, env=None):
    """pytest in a fresh process on one small test file: (exit status, stdout + stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "tests/test_modes.py"]
    argv += ["-k", "family"]
    env = {**clean, **(env or {})}
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout + out.stderr


UNKNOWN_PROFILES = [
    (["--hypothesis-profile", "nonsense"], {}, "--hypothesis-profile 'nonsense' is not a registered profile"),
    ([], {"ATTN_HARNESS_PROFILE": "nonsense"}, "$ATTN_HARNESS_PROFILE='nonsense' is not a profile"),
]


@pytest.mark.parametrize(("args", "env", "message"), UNKNOWN_PROFILES, ids=["option", "variable"])
def test_pytest_with_an_unknown_profile_is_a_usage_error_not_a_traceback(args, env, message):
    status, text = pytest_run(*args, env=env)
    assert status == 4, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: {message}"), text


def test_pytest_with_a_known_profile_runs():
    status, text = pytest_run("--hypothesis-profile", "dev", env={"ATTN_HARNESS_PROFILE": "dev"})
    assert status == 0, text


# --- a check that cannot fail is refused, not passed ---

FP8 = {**EXTEND, "kv_dtype": "float8_e4m3fn"}


@pytest.mark.parametrize("backend", ["torch_native", f"{THIS}:Zeros"])
def test_scales_that_leave_the_reference_all_zero_are_refused_not_passed(capsys, backend):
    """k_scale = v_scale = 1e30 rounds every cached value to code 0: the reference is all 0, its budget
    0, and an output of zeros (attending to nothing) met it: "err 0 <= budget 0"."""
    vacuous = json.dumps({**FP8, "k_scale": 1e30, "v_scale": 1e30})
    assert main(["repro", vacuous, "--backend", backend, "--device", "cpu"]) == 3  # nothing checked
    out = capsys.readouterr().out
    assert "PASS" not in out and "every element of the exact reference is 0" in out, out


def test_scales_that_keep_the_values_are_judged(capsys):
    """The other side: FP8 scales that keep the values are judged: a right backend passes, one that
    attends to nothing fails."""
    judged = json.dumps({**FP8, "k_scale": 0.5, "v_scale": 3.7})
    assert main(["repro", judged, "--backend", "torch_native", "--device", "cpu"]) == 0
    assert main(["repro", judged, "--backend", f"{THIS}:Zeros", "--device", "cpu"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_refusal_condition_at_its_edges():
    from harness.core.compare import uninformative

    constant = torch.full((4, 2, 8), 0.25, dtype=torch.float64)
    assert "every element of the exact reference is 0.25" in uninformative(constant)
    assert "every element of the exact reference is 0 " in uninformative(torch.zeros(3, 2, 8))
    one_off = constant.clone()
    one_off[3, 1, 7] = 0.25 + 2**-40  # one element apart: an output must match it, so it is judged
    assert uninformative(one_off) is None
    for bad in (float("nan"), float("inf")):
        broken = one_off.clone()
        broken[0, 0, 0] = bad
        assert "not finite" in uninformative(broken)
    assert uninformative(torch.zeros(0, 2, 8)) is None  # no rows: nothing that could pass


# --- every bound of a Case, on both sides ---

LOGIT_LIMIT_SCALE = case_module.FLOAT32_MAX / 2 / (1000 * 64 * case_module.DRAW_BOUND**2)
BOUNDS = [  # (fields, the last value accepted, the first refused, what the refusal names)
    (
        {"sm_scale": "{}", "q_amplitude": 1000},
        LOGIT_LIMIT_SCALE * (1 - 1e-9),
        LOGIT_LIMIT_SCALE * (1 + 1e-9),
        "logits can reach",
    ),
    ({"q_amplitude": "{}"}, 1000, 1000.000001, "q_amplitude="),
    ({"head_dim": "{}"}, 512, 520, "head_dim="),
    ({"window_left": "{}"}, -1, -2, "window_left="),
    ({"seed": "{}"}, 2**63 - 1, 2**63, "seed="),
    ({"kv_dtype": "float8_e4m3fn", "k_scale": "{}"}, 1e30, 1.0000001e30, "k_scale="),
    ({"kv_dtype": "float8_e4m3fn", "v_scale": "{}"}, 1e-30, 0.9999999e-30, "v_scale="),
]


@pytest.mark.parametrize(("fields", "inside", "outside", "named"), BOUNDS, ids=[b[-1] for b in BOUNDS])
def test_each_bound_accepts_its_edge_and_refuses_just_past_it(fields, inside, outside, named):
    """A bound tested only far past it could move unseen: each is tested at its last accepted value
    and its first refused one."""

    def with_value(value):
        return {**EXTEND, **{k: (value if v == "{}" else v) for k, v in fields.items()}}

    Case.from_dict(with_value(inside))
    with pytest.raises(CaseError, match=re.escape(named)):
        Case.from_dict(with_value(outside))


@pytest.mark.parametrize(("field", "inside", "outside"), [("prefix_len", 0, -1), ("extend_len", 1, 0)])
def test_each_request_bound_accepts_its_edge_and_refuses_just_past_it(field, inside, outside):
    def with_value(value):
        return {**EXTEND, "requests": [{**EXTEND["requests"][0], field: value}]}

    Case.from_dict(with_value(inside))
    with pytest.raises(CaseError, match=f"{field}={outside} must be >= {inside}"):
        Case.from_dict(with_value(outside))
