"""The warm-up (harness/tools/warmup/): which variants each profile plans per library, that a second
run with a warm cache compiles nothing (a fake library in real worker processes), how each real
library tells a compile from a cache hit (against stand-ins), and the Makefile's wiring."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness import cli
from harness.run import cache_dir
from harness.search.profiles import SIZES
from harness.tools import warmup
from harness.tools.warmup import libraries
from harness.tools.warmup.libraries import FA4, FLASHINFER, FLEX, LIBRARIES
from tests import warmup_fake

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache directory for this test (restored afterwards)."""
    for name in (cache_dir.ENV, cache_dir.OWNED_ENV, *(v for _, v, _ in cache_dir.LIBRARIES)):
        monkeypatch.delenv(name, raising=False)
    cache_dir.apply(str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- planning ----------------------------------------------------------------------------------


def test_flashinfer_plans_the_profiles_dtypes_and_head_dims():
    gpu = {v.task.case.head_dim for v in FLASHINFER.variants("gpu") if v.task.case}
    ci = [v.task.case for v in FLASHINFER.variants("ci") if v.task.case]
    assert gpu == {64, 128}  # 64: the pins, which run in every profile
    assert {c.head_dim for c in ci} == {64}  # FlashInfer has no head_dim 32 (the ci profile's other)
    assert {c.dtype for c in ci} == {"bfloat16", "float16"}
    labels = [v.label for v in FLASHINFER.variants("gpu")]
    assert "cascade" in labels and "packbits" in labels and len(labels) == len(set(labels))
    for kv in ("float8_e4m3fn", "float8_e5m2"):
        assert f"prefill[bfloat16,128,kv={kv},swa=True,cap=True]" in labels


def test_fa4_plans_each_profiles_heads_and_head_dims():
    gpu = [v.task for v in FA4.variants("gpu")]
    assert {(c.num_q_heads, c.num_kv_heads) for c in gpu if c.head_dim == 128} == set(SIZES["gpu"].heads)
    assert {c.dtype for c in gpu} == {"bfloat16"}
    ci = [v.task for v in FA4.variants("ci")]
    model = [c for c in ci if c.soft_cap == 4.0]  # the model check's Gemma2-like cap, at its own shape
    assert model and {c.head_dim for c in model} == {128}
    assert {c.head_dim for c in ci if c.soft_cap != 4.0} == {32, 64}
    ci_heads = {(c.num_q_heads, c.num_kv_heads) for c in ci if c.head_dim == 32}
    assert ci_heads == set(SIZES["ci"].heads)
    assert {c.dtype for c in ci} == {"bfloat16", "float16"}
    assert len({v.label for v in FA4.variants("gpu")}) == len(gpu)  # one label per variant


def test_flex_plans_one_variant_per_dtype_head_dim_and_heads_with_every_mode():
    gpu = {v.label for v in FLEX.variants("gpu")}
    assert {f"bfloat16,d=128,heads={q}/{k}" for q, k in SIZES["gpu"].heads} <= gpu
    for v in FLEX.variants("gpu"):
        assert {c.mode for c in v.task} == {
            "EXTEND",
            "DECODE",
            "DRAFT_EXTEND_V2",
            "TARGET_VERIFY",
            "CROSS",
            "ENCODER_ONLY",
        }
    ci = {v.label.split(",d=")[0] for v in FLEX.variants("ci")}
    assert ci == {"bfloat16", "float16"}


def test_only_the_libraries_of_the_chosen_backends():
    assert warmup.select(LIBRARIES, None) == list(LIBRARIES)
    assert warmup.select(LIBRARIES, ["torch_native", "flex_eager"]) == []
    chosen = warmup.select(LIBRARIES, ["fa4", "flashinfer_dec_cc"])
    assert [lib.name for lib in chosen] == ["flashinfer", "fa4"]


# --- running -----------------------------------------------------------------------------------


def test_a_second_run_with_a_warm_cache_compiles_nothing_and_says_so(cache):
    fake = warmup_fake.library(["a", "b", "c"])
    lines: list[str] = []
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    (first,) = warmup.run([fake], "gpu", 2, lines.append)  # the same again: all cached
    assert warmup_fake.asked(cache) and sorted(warmup_fake.asked(cache)) == sorted(["a", "b", "c"] * 2)
    assert (first.variants, first.compiled, first.cached, first.failed) == (3, 0, 3, [])
    assert any("[3/3] fake gpu:" in line for line in lines)
    assert "warmup: 3 variants compiled into" in "\n".join(lines)
    lines.clear()
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    assert f"warmup: nothing compiled: every variant was already in the cache ({cache})" in lines


def test_a_failed_variant_fails_the_run_and_an_unavailable_library_is_skipped(cache):
    fake = warmup_fake.library(["a", "broken"])
    missing = warmup_fake.library(["x"], why_not="fake is not installed")
    missing.name = "missing"
    lines: list[str] = []
    assert warmup.main([fake, missing], "gpu", None, 2, True, str(cache), lines.append) == 1
    text = "\n".join(lines)
    assert "fake failed: gpu:broken: RuntimeError: the fake compiler cannot compile 'broken'" in text
    assert "missing        skipped: fake is not installed" in text
    assert warmup_fake.asked(cache) == ["a"]  # "broken" raised before it was logged


def test_a_broken_library_fails_the_run(cache):
    broken = warmup_fake.library(["a"])

    def raises() -> str:
        raise RuntimeError("flashinfer 0.1 is too old")

    broken.unavailable = raises
    lines: list[str] = []
    assert warmup.main([broken], "gpu", None, 2, True, str(cache), lines.append) == 1
    assert "skipped: broken: flashinfer 0.1 is too old" in "\n".join(lines)
    assert warmup_fake.asked(cache) == []


def test_without_cuda_there_is_nothing_to_compile(cache, capsys):
    assert cli.main(["warmup", "--profile", "ci"]) == 0
    assert "no CUDA device here: nothing to compile" in capsys.readouterr().out


def test_bad_warmup_input_is_one_line_exit_2(cache, capsys):
    for argv, needle in (
        (["warmup", "--profile", "fast"], "unknown profile 'fast'"),
        (["warmup", "--backend", "nope"], "unknown backend 'nope'"),
        (["warmup", "--jobs", "0"], "--jobs must be at least 1"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err


# --- how each library tells a compile from a cache hit ---------------------------------------


def test_flashinfer_counts_a_module_as_compiled_only_when_its_library_was_built(monkeypatch, tmp_path):
    so = tmp_path / "mod" / "mod.so"

    class Spec:  # FlashInfer's JitSpecNvcc: build() runs ninja, which relinks only what changed
        name, jit_library_path = "mod", so

        def build(self) -> None:
            if not so.exists():
                so.parent.mkdir(exist_ok=True)
                so.write_text("built")

    core = types.SimpleNamespace(JitSpecNvcc=Spec, JitSpec=Spec)
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.jit", types.SimpleNamespace(core=core))
    monkeypatch.setattr(libraries, "_run_on_gpu", lambda backend, case: Spec().build())
    monkeypatch.setattr(libraries, "_backend", lambda name: None)
    probe = FLASHINFER.variants("gpu")[0].task
    assert libraries.compile_flashinfer(probe) == warmup.COMPILED
    assert libraries.compile_flashinfer(probe) == warmup.CACHED
    assert Spec.build.__name__ == "build" and Spec.build.__qualname__.startswith("test_")  # restored


def test_fa4_counts_a_variant_as_compiled_when_cute_compile_ran(monkeypatch):
    case = FA4.variants("gpu")[0].task
    disk: set[str] = set()
    cute = types.SimpleNamespace(compile=lambda key: disk.add(key))

    def run(backend, case) -> None:  # noqa: ANN001 - FA4: compile unless in its disk cache
        key = libraries._describe(case)
        if key not in disk:
            cute.compile(key)

    monkeypatch.setitem(sys.modules, "cutlass", types.SimpleNamespace(cute=cute))
    monkeypatch.setitem(sys.modules, "cutlass.cute", cute)
    monkeypatch.setattr(libraries, "_run_on_gpu", run)
    monkeypatch.setattr(libraries, "_backend", lambda name: None)
    assert libraries.compile_fa4(case) == warmup.COMPILED
    assert libraries.compile_fa4(case) == warmup.CACHED
    assert disk == {libraries._describe(case)}


def test_flex_counts_a_variant_as_compiled_when_inductors_cache_missed(monkeypatch):
    from torch._dynamo.utils import counters

    cases = FLEX.variants("gpu")[0].task
    graphs: set[str] = set()

    def run(backend, case) -> None:  # noqa: ANN001 - inductor: a miss compiles, then hits
        hit = case.mode in graphs
        counters["inductor"]["fxgraph_cache_hit" if hit else "fxgraph_cache_miss"] += 1
        graphs.add(case.mode)

    monkeypatch.setattr(libraries, "_run_on_gpu", run)
    monkeypatch.setattr(libraries, "_backend", lambda name: None)
    assert libraries.compile_flex(cases) == warmup.COMPILED
    assert libraries.compile_flex(cases) == warmup.CACHED


# --- make --------------------------------------------------------------------------------------


def make_n(*args: str) -> list[str]:
    res = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args, "INSTALL=no", "PYTHON=py"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return [line.strip() for line in res.stdout.splitlines() if line.startswith("py ")]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_check_warms_up_first_with_the_same_profile():
    assert make_n("check") == ["py -m harness warmup", "py -m harness check"]
    assert make_n("check", "PROFILE=dev", "ARGS=--jobs 3") == [
        "py -m harness warmup --profile dev",
        "py -m harness check --profile dev --jobs 3",
    ]
    assert make_n("check", "WARMUP=no") == ["py -m harness check"]
    assert make_n("warmup") == ["py -m harness warmup"]
    narrowed = make_n("check", "WARMUP_ARGS=--backend fa4")[0]
    assert narrowed.split() == ["py", "-m", "harness", "warmup", "--backend", "fa4"]
