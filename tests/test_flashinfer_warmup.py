"""The warm-up's probes: every JIT variant the gpu profile and the pinned cases need, one module each.

Phase 1 of `python -m harness.tools.flashinfer_warmup` learns which module a probe needs by stopping it
at its first module load, so each probe must need exactly one module and must be a case its
adapter runs. Checked here on the recording fake; the device run builds them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness import backends
from harness.core.batch import build_batch, make_inputs
from harness.tools.flashinfer_warmup import (
    GPU_VARIANT,
    coverage_cases,
    install_prebuilt,
    module_probes,
    pinned_cases,
)
from tests import flashinfer_fake as fake

PROBES = [p for p in module_probes() if p.backend]


def test_the_gpu_profile_variants_are_all_probed():
    labels = {p.label for p in module_probes()}
    tag = ",".join(map(str, GPU_VARIANT))
    for swa in (False, True):
        assert f"sink[{tag},swa={swa}]" in labels
        for cap in (False, True):
            assert {f"prefill[{tag},swa={swa},cap={cap}]", f"decode_cc[{tag},swa={swa},cap={cap}]"} <= labels
    assert {"cascade", "packbits"} <= labels
    for kv in ("float8_e4m3fn", "float8_e5m2"):  # an FP8 cache: the same variants over FP8 K/V
        fp8 = f"{tag},kv={kv}"
        assert {f"sink[{fp8},swa=True]", f"prefill[{fp8},swa=True,cap=True]"} <= labels
        assert f"decode_cc[{fp8},swa=False,cap=True]" in labels


def test_pinned_cases_get_probes_for_their_own_dtype_and_head_dim():
    pins = pinned_cases()
    assert pins, "harness/search/pinned.py pins cases that the FlashInfer adapters run"
    for _, case in pins:
        assert any(p.case.head_dim == case.head_dim and p.case.dtype == case.dtype for p in PROBES), case


@pytest.mark.parametrize("probe", PROBES, ids=[p.label for p in PROBES])
def test_each_probe_runs_and_needs_one_module(monkeypatch, probe):
    fake.install(monkeypatch)
    backend = fake.on_cpu(backends.load(probe.backend))
    assert backend.supports(probe.case) is None
    backend.run(build_batch(probe.case, make_inputs(probe.case), "cpu"))
    inits = [(w, a) for w, a in fake.CALLS if w.endswith(".init")]
    plans = [(w, a) for w, a in fake.CALLS if w.endswith(".plan")]
    assert len(inits) == len(plans) == 1 and not fake.calls("merge_state"), fake.CALLS
    (what, args), (_, plan) = inits[0], plans[0]
    assert plan.get("custom_mask") is None  # no mask: the mask packer is a module of its own
    if probe.label.startswith("decode_cc"):
        assert what == "decode.init" and not args["use_tensor_cores"]
    elif probe.label.startswith("sink"):
        assert "head_dim_qk" in args  # the AttentionSink wrapper
    else:
        assert what == "paged.init" and "head_dim_qk" not in args
    assert plan["kv_data_type"] == getattr(torch, probe.case.kv_dtype or probe.case.dtype)


def test_coverage_runs_only_supported_cases_and_every_mode():
    cases = coverage_cases()
    assert all(backends.load(n).supports(c) is None for n, c in cases)
    assert {(n, str(c.mode)) for n, c in cases} >= {
        ("flashinfer_ragged", "EXTEND"),
        ("flashinfer_paged", "TARGET_VERIFY"),
        ("flashinfer_dec_cc", "DECODE"),
        ("flashinfer_dec_tc", "DRAFT_EXTEND_V2"),
        ("flashinfer_enc", "CROSS"),
    }


def _spec(tmp_path, name, built=True, is_aot=False):
    jit = tmp_path / "jit" / name / f"{name}.so"
    if built:
        jit.parent.mkdir(parents=True)
        jit.write_bytes(name.encode())
    aot = tmp_path / "aot" / name / f"{name}.so"
    return SimpleNamespace(name=name, jit_library_path=jit, aot_path=aot, is_aot=is_aot)


def test_built_modules_are_installed_where_flashinfer_loads_prebuilt_ones(tmp_path):
    """Each module the batch build made is copied to its prebuilt path (so its first use loads it
    rather than building it again); prebuilt ones are left alone; a module that was not built, or a
    directory that cannot be written, is reported by name, and the rest are still installed."""
    specs = [
        _spec(tmp_path, "a"),
        _spec(tmp_path, "b", built=False),
        _spec(tmp_path, "c", is_aot=True),
        _spec(tmp_path, "d"),
    ]
    installed, problems = install_prebuilt(specs)
    assert installed == ["a", "d"]
    assert specs[0].aot_path.read_bytes() == b"a" and specs[3].aot_path.read_bytes() == b"d"
    assert not specs[2].aot_path.exists()
    assert len(problems) == 1 and problems[0].startswith("b: ") and "was not built" in problems[0]

    blocked = _spec(tmp_path, "e")
    blocked.aot_path.parent.parent.mkdir(parents=True, exist_ok=True)
    blocked.aot_path.parent.write_text("a file where the module's directory should be")
    installed, problems = install_prebuilt([blocked, _spec(tmp_path, "f")])
    assert installed == ["f"] and len(problems) == 1 and problems[0].startswith("e: cannot write")
