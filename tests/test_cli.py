"""The command line: exit codes and one-line errors for bad input."""

import json

from harness.cli import main

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
    spec = "harness.mutants.torch_native:_WindowShort"
    assert main(["repro", GOOD, "--backend", spec]) == 1
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


def test_check_runs_a_family_and_prints_the_summary(capsys):
    assert main(["check", "--family", "cross", "--device", "cpu", "--profile", "ci"]) == 0
    out = capsys.readouterr().out
    assert "torch_native@cpu" in out and "cross" in out
