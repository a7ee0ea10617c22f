"""The sglang adapters: the engine's window convention pinned from its own code, the release refusal,
the core harness without sglang, and every sglang mutant caught by the suite's search.

Tests that drive sglang skip where it is not installed (the core environment); `make test-sglang`
runs this file in .venv-sglang, where they run.
"""

import subprocess
import sys

import pytest

from harness.backends import BackendBroken, names
from harness.backends.engines.base import Engine, EngineAdapter
from harness.backends.engines.sglang.engine import SGLANG
from harness.backends.engines.sglang.flex import SglangFlex
from harness.backends.engines.sglang.torch_native import SglangTorchNative
from harness.backends.versions import SupportedRange, distribution_version
from harness.checks.known_issues import reaching_issue
from harness.mutants import catalogue, hunt
from harness.search import profiles

ADAPTERS = (SglangTorchNative, SglangFlex)
SGLANG_RELEASE = SGLANG.release()
needs_sglang = pytest.mark.skipif(SGLANG_RELEASE is None, reason="sglang is not installed here")
SGLANG_MUTANTS = [m for m in catalogue() if m.backend.startswith("sglang_")]


def test_registry_lists_the_adapters_without_importing_sglang():
    code = (
        "import sys, harness.backends as b; n = b.names(); "
        "print('sglang_native' in n and 'sglang_flex' in n, 'sglang' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


@pytest.mark.skipif(SGLANG_RELEASE is not None, reason="sglang is installed here")
@pytest.mark.parametrize("cls", ADAPTERS)
def test_unavailable_without_sglang_says_why(cls):
    why = cls().available("cpu")
    assert why is not None and "sglang is not installed" in why


def test_a_release_outside_the_range_is_refused_in_one_line():
    torch_release = distribution_version("torch")
    old_range = SupportedRange(
        distribution="torch", module="torch", lowest="0.0.1", below="0.0.2", tested=("0.0.1",),
        why_lowest="too old",
    )
    torch_engine = Engine("torch-engine", old_range)

    class Adapter(EngineAdapter):
        name = "refused"
        engine = torch_engine
        engine_backend = "torch:Tensor"
        capabilities = SglangTorchNative.capabilities

    with pytest.raises(BackendBroken) as e:
        Adapter().available("cpu")
    message = str(e.value)
    assert "\n" not in message and f"torch {torch_release} is installed" in message and "too old" in message


def test_each_adapter_names_its_engine_release():
    for cls in ADAPTERS:
        b = cls()
        assert b.library == "sglang" and b.supported.distribution == "sglang"
        assert b.release() == SGLANG_RELEASE
    assert {"sglang_native", "sglang_flex"} <= set(names())


@needs_sglang
@pytest.mark.parametrize("window", [0, 1, 3, 7])
def test_window_convention_is_read_from_sglangs_mask(window):
    """sglang's own mask (TorchNativeAttnBackend._make_sliding_window_mask) lets a decode query see
    W + 1 keys for sliding_window_size W: the harness's count, so the adapter passes W unchanged."""
    backend = SglangTorchNative().backend_class()
    kv_len = 12
    mask = backend._make_sliding_window_mask(
        q_len=1, kv_len=kv_len, sliding_window_size=window, device="cpu", query_offset=kv_len - 1
    )
    assert int(mask.sum()) == window + 1
    assert SglangTorchNative().engine_window(window) == window


@needs_sglang
@pytest.mark.parametrize("mutant", SGLANG_MUTANTS, ids=[m.name for m in SGLANG_MUTANTS])
def test_sglang_mutant_is_caught(mutant):
    profiles.load("ci")
    d = hunt(mutant, mutant.families[0], device="cpu")
    assert not d.skipped, d.skipped
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived: {d.reason}"
    assert reaching_issue(mutant.backend, d.shrunk) is None, "caught only where sglang itself is wrong"
    print(f"{mutant.name}: caught ({d.status}) after {d.examples} examples; shrunk to {d.shrunk.to_json()}")


def test_every_adapter_has_three_mutants():
    for cls in ADAPTERS:
        assert sum(m.backend == cls.name for m in SGLANG_MUTANTS) >= 3, cls.name
