"""Declared means accepted: every built-in backend's supports() takes each capability it declares
(CUDA-only backends included: supports() is pure Python), and a backend that refuses one is named."""

import pytest

from harness import backends
from harness.backends.base import Capabilities
from harness.backends.torch_native import TorchNative
from harness.checks.declarations import declared_variants, refused_declarations
from harness.core.modes import Mode


@pytest.mark.parametrize("name", list(backends.builtin()))
def test_every_declared_capability_is_accepted(name):
    backend = backends.load(name)
    assert refused_declarations(backend) == []


class _RefusesSoftCapInDecode(TorchNative):
    """Declares a soft cap (TorchNative does) but turns it down in DECODE."""

    def supports(self, case):
        if case.soft_cap > 0 and case.mode == Mode.DECODE:
            return "no soft cap in decode <sim>"
        return super().supports(case)


def test_a_refused_declaration_is_named_with_its_case_and_reason():
    problems = refused_declarations(_RefusesSoftCapInDecode())
    assert len(problems) == 1
    assert "declares feature soft_cap but supports() refuses" in problems[0]
    assert '"mode":"DECODE"' in problems[0].replace(" ", "") and "no soft cap in decode <sim>" in problems[0]


def test_every_kind_of_declaration_is_asked_for():
    caps = backends.load("flashinfer_paged").capabilities
    asked = {what for what, _ in declared_variants(caps)}
    assert {"mode EXTEND", "mode TARGET_VERIFY", "dtype float16", "head_dim 256", "page_size 1"} <= asked
    assert {"kv_layout HND", "feature sinks", "feature hybrid_pool", "tree (topk > 1)"} <= asked


def test_a_declared_exclusive_pair_is_not_asked_for_but_must_name_known_traits():
    caps = backends.load("flashinfer_paged").capabilities
    asked = [c.mode for what, c in declared_variants(caps) if what == "feature sinks"]
    assert Mode.EXTEND in asked and Mode.TARGET_VERIFY not in asked  # declared exclusive with sinks
    with pytest.raises(ValueError, match="unknown traits \\['sinkz'\\]"):
        Capabilities(modes=frozenset({Mode.EXTEND}), exclusive=frozenset({("sinkz", "EXTEND")}))


def test_a_declared_feature_no_mode_admits_is_named():
    class WindowOnlyInCross(TorchNative):
        capabilities = Capabilities.with_features("window", modes=frozenset({Mode.CROSS}))

    assert refused_declarations(WindowOnlyInCross()) == [
        "torch_native declares window but no declared mode admits a case with it"
    ]
