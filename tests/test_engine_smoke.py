"""The GPU smoke scripts' first step: an adapter made ready, or one line (and no exception) saying why not."""

from __future__ import annotations

from types import SimpleNamespace

from harness.backends import BackendBroken
from harness.tools import engine_smoke
from harness.tools.engine_smoke import ready_adapter


def test_an_available_adapter_is_returned_under_its_heading_with_its_release(monkeypatch, capsys):
    engine = SimpleNamespace(
        library="sglang",
        available=lambda device: None,
        release=lambda: "0.5.17",
        supported=SimpleNamespace(status=lambda release: f"in range ({release})"),
    )
    monkeypatch.setattr(engine_smoke, "load", lambda name: engine)
    assert ready_adapter("sglang_fa3", "cuda") is engine
    assert capsys.readouterr().out == "== sglang_fa3\n   sglang 0.5.17 (in range (0.5.17))\n"


def test_a_broken_adapter_is_none_with_its_traceback(monkeypatch, capsys):
    def broken(name):
        raise BackendBroken("sglang 0.4.0 is not supported")

    monkeypatch.setattr(engine_smoke, "load", broken)
    assert ready_adapter("sglang_fa3", "cuda") is None
    captured = capsys.readouterr()
    assert "   broken: sglang 0.4.0 is not supported" in captured.out and "Traceback" in captured.err


def test_an_unavailable_adapter_is_none_and_says_why(capsys):
    assert ready_adapter("vllm_flash_attn", "cpu") is None
    out = capsys.readouterr().out
    assert out.startswith("== vllm_flash_attn\n") and "   unavailable: " in out


def test_a_step_that_raises_is_named_with_its_traceback_and_the_next_one_runs(capsys):
    def fails():
        raise RuntimeError("no kernel image")

    assert engine_smoke.step("capture size 2", fails) == (False, None)
    assert engine_smoke.step("capture size 1", lambda: 7) == (True, 7)
    captured = capsys.readouterr()
    assert "   capture size 2: raised" in captured.out and "RuntimeError: no kernel image" in captured.err
    assert captured.out.index("capture size 2: raised") < captured.out.index("capture size 1 ...")


def test_a_result_shows_its_error_budget_and_the_backends_traceback(capsys):
    from harness.core.case import Case, Request
    from harness.core.compare import Verdict
    from harness.core.results import CaseResult

    case = Case(mode="DECODE", requests=(Request(3, 1),))
    verdict = Verdict(
        passed=False,
        err=0.5,
        budget=0.01,
        ratio=50.0,
        worst=None,
        frac_over=1.0,
        nonfinite=0,
        reason="err 0.5 > budget 0.01",
    )
    failed = CaseResult(
        status="fail",
        backend="sglang_fa3",
        device="cuda",
        case=case,
        verdict=verdict,
        reason="err 0.5 > budget 0.01",
        extra={"traceback": "Traceback: boom"},
    )
    skipped = CaseResult(status="skip", backend="sglang_fa3", device="cuda", case=case, reason="no window")
    engine_smoke.show("decode", failed)
    engine_smoke.show("extend", skipped)
    assert capsys.readouterr().out == (
        "   decode: fail, error 0.5 (budget 0.01): err 0.5 > budget 0.01\nTraceback: boom\n"
        "   extend: skip: no window\n"
    )
