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
