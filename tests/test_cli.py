"""The command line: exit codes and one-line errors for bad input."""

import html
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys

import pytest

import harness
from harness.cli import main
from harness.report import results_json
from harness.run import check
from harness.run.speed import warm_gate
from tests.helpers import IdleGate
from tests.report_helpers import PINNED_QUERY_LINE, ROOT, WINDOW_IGNORED, mutant_run

SHORT = "harness.mutants.torch_native:_WindowShort"
IGNORED = WINDOW_IGNORED
GOOD = json.dumps({"mode": "EXTEND", "requests": [{"prefix_len": 3, "extend_len": 4}], "window_left": 2})


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "torch_native" in out and "cpu: available" in out


def test_repro_passes_from_a_literal_and_a_file(tmp_path, capsys):
    assert main(["repro", GOOD]) == 0
    p = tmp_path / "case.json"
    p.write_text(GOOD)
    assert main(["repro", str(p), "--backend", "torch_native", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and '"status": "pass"' in out


def test_repro_of_a_mutant_spec_fails(capsys):
    assert main(["repro", GOOD, "--backend", SHORT]) == 1
    assert "FAIL" in capsys.readouterr().out


def one_line_error(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_bad_input_is_one_line_exit_2(capsys, tmp_path):
    one_line_error(capsys, ["repro", "{oops"], "malformed JSON")
    one_line_error(capsys, ["repro", str(tmp_path / "missing.json")], "no such case file")
    one_line_error(
        capsys,
        ["repro", '{"mode": "EXTEND", "requests": [{"extend_len": 0}]}'],
        "requests[0].extend_len=0 must be >= 1",
    )
    one_line_error(capsys, ["repro", GOOD, "--backend", "nope"], "unknown backend 'nope'")
    one_line_error(capsys, ["repro", GOOD, "--backend", "no.such.module:f"], "cannot load backend")
    one_line_error(capsys, ["check", "--backend", "nope"], "unknown backend 'nope'")
    one_line_error(capsys, ["check", "--family", "extend"], "unknown family 'extend'")
    one_line_error(capsys, ["check", "--profile", "fast"], "unknown profile 'fast'")


def test_check_refuses_to_run_in_record_mode(capsys, monkeypatch, tmp_path):
    """Record mode answers every drawn case with an unchecked pass (the warm-up's own run): a check
    started with the variable set would pass without checking, so it stops before running."""
    monkeypatch.setenv("ATTN_HARNESS_RECORD", str(tmp_path / "cases.jsonl"))
    argv = ["check", "--backend", "torch_native", "--family", "decode"]
    one_line_error(capsys, argv, "ATTN_HARNESS_RECORD")
    assert not (tmp_path / "cases.jsonl").exists()


def test_check_runs_a_family_and_prints_the_summary(capfd, tmp_path):
    assert (
        main(
            [
                "check",
                "--backend",
                "torch_native",
                "--family",
                "cross",
                "--device",
                "cpu",
                "--reports",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "torch_native@cpu" in out and "cross" in out
    assert "1/1 tests |" in out and "0 failing" in out  # the progress line
    assert out.count("report: ") == 1  # check names the page once (the plugin's line is its own)
    run = (tmp_path / "latest").resolve()
    assert run.parent == tmp_path and {p.name for p in run.iterdir() if not p.name.startswith(".")} == {
        "index.html",
        "results.json",
        "junit.xml",
    }
    assert {p.name for p in run.iterdir() if p.name.startswith(".")} <= {".pytest_cache", ".hypothesis"}
    doc = results_json.load(run / "results.json")
    assert doc["run"]["id"] == run.name and doc["run"]["profile"] == "ci" and doc["run"]["exit_status"] == 0
    assert doc["results"] and {r["family"] for r in doc["results"]} == {"cross"}
    assert all(r["status"] == "pass" for r in doc["results"])
    typed = f"python -m harness check --backend torch_native --family cross --device cpu --reports {tmp_path}"
    assert doc["run"]["command"] == typed  # the user's command, not the pytest command it ran
    assert f"command: <code>{html.escape(typed)}</code>" in (run / "index.html").read_text()


def test_list_describes_a_module_factory_spec(capsys):
    assert main(["list", "--backend", SHORT]) == 0
    assert capsys.readouterr().out.startswith(f"{SHORT}  (torch)")


def test_repro_probe_names_the_wrongly_attended_keys(capsys):
    assert main(["repro", GOOD, "--backend", IGNORED, "--probe"]) == 1
    out = capsys.readouterr().out
    assert "request 0, query 0 (position 3) attended key 0, outside its window [1, 3] (all 8 heads)" in out
    assert "  +###" in out  # the picture: key 0 wrongly attended, keys 1..3 in the window


def test_bad_check_and_report_input_is_one_line_exit_2(capsys, tmp_path):
    one_line_error(capsys, ["check", "--mode", "prefill"], "unknown mode 'prefill'")
    one_line_error(capsys, ["report", str(tmp_path / "nope.json")], "no such results file")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    one_line_error(capsys, ["report", str(bad)], "malformed JSON")
    bad.write_text('{"format": "something else"}')
    one_line_error(capsys, ["report", str(bad)], "not an attn-harness results file")


def test_a_window_bug_run_reports_the_probe_picture_and_a_replayable_repro(capsys):
    """It must show: an injected window bug, run through `check`, gives a report whose failure
    section shows the probe's picture of the wrongly attended keys and whose repro replays it."""
    run, proc = mutant_run()
    assert proc.returncode == 1, proc.stdout[-2000:]
    doc = results_json.load(run / "results.json")
    (fail,) = [r for r in doc["results"] if r["status"] == "fail"]
    assert fail["backend"] == IGNORED and "window" in fail["features"]
    assert PINNED_QUERY_LINE + " (all 8 heads)" in fail["probe"]["lines"]
    assert any("+" in row for rp in fail["probe"]["requests"] for row in rp["grid"])
    assert fail["error_map"]["tokens"] == sum(r["extend_len"] for r in fail["case"]["requests"])
    page = (run / "index.html").read_text()
    section = page[page.index('id="failure-1"') :]
    section = section[: section.index("</section>")]
    assert PINNED_QUERY_LINE in section and 'class="picture probe"' in section
    assert 'class="picture heatmap"' in section and html.escape(fail["repro"]) in section
    argv = shlex.split(fail["repro"])
    assert argv[:4] == ["python", "-m", "harness", "repro"]
    capsys.readouterr()
    assert main(argv[3:] + ["--json"]) == 1
    out = capsys.readouterr().out
    replayed = json.loads(out[out.index("{") :])
    assert replayed["status"] == "fail" and replayed["verdict"] == fail["verdict"]


def test_report_rerenders_a_run_byte_for_byte(tmp_path, capsys):
    run, _ = mutant_run()
    assert main(["report", str(run / "results.json"), "--out", str(tmp_path)]) == 0
    assert str(tmp_path / "index.html") in capsys.readouterr().out
    for name in ("index.html", "junit.xml"):
        assert (tmp_path / name).read_bytes() == (run / name).read_bytes()


@pytest.mark.parametrize(
    ("device", "mark", "profile"), [(None, "gpu", "gpu"), ("cpu", "not gpu", "ci"), ("cuda", "gpu", "gpu")]
)
def test_check_on_a_cuda_machine_runs_the_cuda_backends_unless_told(
    monkeypatch, tmp_path, device, mark, profile
):
    """The CPU backends at the gpu profile's sizes would take hours: on CUDA, check selects the GPU ones."""

    seen = {}

    def fake_run(cmd, cwd, env):  # noqa: ANN001, ANN202
        seen.update(cmd=cmd, profile=env["ATTN_HARNESS_PROFILE"])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(check, "default_device", lambda: "cuda")
    monkeypatch.setattr(check.os, "cpu_count", lambda: 2)  # one pytest process (--jobs: test_parallel.py)
    monkeypatch.setattr(check, "run_pytest", fake_run)
    monkeypatch.setattr(warm_gate, "WarmGate", IdleGate)
    args = ["check", "--reports", str(tmp_path)] + (["--device", device] if device else [])
    assert main(args) == 0
    assert seen["cmd"][seen["cmd"].index("-m", 3) + 1] == mark and seen["profile"] == profile


def test_a_failing_search_prints_its_case_once_with_one_repro_and_no_hypothesis_noise(tmp_path):
    """A failure found by generation (not an @example): the verdict and one repro command per failing
    test; no traceback through the search, no hypothesis repr, explanation or @reproduce_failure blob."""
    backend = "harness.mutants.torch_native:_EncoderCausal"
    cmd = [sys.executable, "-m", "harness", "check", "--backend", backend, "--family", "encoder"]
    cmd += ["--device", "cpu", "--profile", "ci", "--reports", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    env["CI"] = "true"  # on CI pytest's short summary would repeat the whole failure text
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    failing = out.count(f"{backend} on cpu: FAIL: ")
    assert failing == 2  # the full and the swa test
    assert out.count("python -m harness repro '") == failing
    assert out.count('"mode": "ENCODER_ONLY"') == failing  # the Case only inside its repro command
    for noise in ("Failing test case", "Explanation", "reproduce_failure", "Highest target score", "Case("):
        assert noise not in out, noise


def test_pytest_last_failed_reruns_the_failures_of_a_check(tmp_path):
    """`check` leaves pytest's cache in its run directory, so `pytest --lf -o cache_dir=<run>/.pytest_cache`
    reruns exactly the tests it failed and `--sw` is accepted: the bisection flags work."""
    backend = "harness.mutants.torch_native:_EncoderCausal"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    cmd = [sys.executable, "-m", "harness", "check", "--backend", backend, "--family", "encoder"]
    cmd += ["--family", "cross", "--device", "cpu", "--profile", "ci", "--reports", str(tmp_path)]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 1 and "2 failed, 1 passed" in first.stdout, first.stdout[-2000:]
    env["ATTN_HARNESS_BACKENDS"] = backend
    for flag, last in (("--lf", "2 failed in"), ("--sw", "1 failed, 1 passed")):  # --sw: stops at the first
        again = [sys.executable, "-m", "pytest", "cases", "-q", flag, "-m", "(encoder or cross) and not gpu"]
        again += ["-o", f"cache_dir={tmp_path / 'latest' / '.pytest_cache'}"]
        proc = subprocess.run(again, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.stdout.splitlines()[-1].startswith(last), proc.stdout[-2000:] + proc.stderr[-2000:]


def test_every_subcommand_help_has_examples_that_parse():
    from harness.cli import COMMANDS, parser

    top = parser()
    subs = next(a for a in top._actions if a.dest == "command").choices
    assert set(subs) == set(COMMANDS)
    for name, sub in [(None, top), *subs.items()]:
        text = sub.format_help()
        epilog = text.split("examples:\n", 1)[1].splitlines()
        examples = [line for line in epilog if line.startswith("  python")]
        assert len(examples) >= (len(COMMANDS) if name is None else 2), text
        for line in examples:
            argv = shlex.split(line, comments=True)
            assert argv[:3] == ["python", "-m", "harness"] and (name is None or argv[3] == name), line
            top.parse_args(argv[3:])  # a usage error would raise


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"attn-harness {harness.__version__}"
    assert harness.__version__ == importlib.metadata.version("attn-harness")
