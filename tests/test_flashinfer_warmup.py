"""The warm-up's probes: every JIT variant the gpu profile and the pinned cases need, one module each.

Phase 1 of `python -m harness.run.speed.warmup.flashinfer` learns which module a probe needs by stopping it
at its first module load, so each probe must need exactly one module and must be a case its
adapter runs. Checked here on the recording fake; the device run builds them.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from harness import backends
from harness.core.batch import build_batch, make_inputs
from harness.run.speed.warmup import flashinfer as flashinfer_warmup
from harness.run.speed.warmup.flashinfer import GPU_VARIANT, coverage_cases, module_probes, pinned_cases
from harness.run.speed.warmup.ninja import Module
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


def test_the_plan_writes_each_modules_build_file_and_leaves_prebuilt_ones(monkeypatch, tmp_path):
    """ninja_plan (run in the warm-up's worker): each module found gets its build.ninja written and
    its paths resolved (its outputs are resolved paths); a prebuilt one is left to FlashInfer; a
    module that ninja does not build is an error naming it."""
    written: list[str] = []
    jit = tmp_path / "jit"
    (tmp_path / "link").symlink_to(tmp_path)

    def spec(name, is_aot=False):  # FlashInfer's JitSpecNvcc, as far as the plan reads it
        build_dir = tmp_path / "link" / "jit" / name
        return SimpleNamespace(
            name=name,
            is_aot=is_aot,
            write_ninja=lambda: written.append(name),
            ninja_path=build_dir / "build.ninja",
            build_dir=build_dir,
            jit_library_path=build_dir / f"{name}.so",
        )

    specs = {"b": spec("b"), "a": spec("a"), "pre": spec("pre", is_aot=True)}
    monkeypatch.setattr(flashinfer_warmup, "discover_specs", lambda probes: specs)
    monkeypatch.setitem(sys.modules, "flashinfer", ModuleType("flashinfer"))
    jit_env = SimpleNamespace(FLASHINFER_JIT_DIR=tmp_path / "link" / "jit")
    monkeypatch.setitem(sys.modules, "flashinfer.jit", SimpleNamespace(env=jit_env))
    plan = flashinfer_warmup.ninja_plan([])
    assert written == ["a", "b"] and plan.prebuilt == ("pre",)
    a = jit.resolve() / "a"
    assert plan.root == str(jit.resolve())
    assert plan.modules[0] == Module("a", str(a / "build.ninja"), str(a), str(a / "a.so"))
    specs["cute"] = SimpleNamespace(name="cute")
    with pytest.raises(TypeError, match="module cute is a SimpleNamespace, not built by ninja"):
        flashinfer_warmup.ninja_plan([])
