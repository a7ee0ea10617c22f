"""Not installed is a skip; installed but broken, or at an unsupported version, is an error.

A broken install is a fake package at the front of sys.path that raises when imported (as a kernel
library built against another torch does); this CPU machine is the host without CUDA. Adapters are
declared runnable on the CPU (`fa2` below is one for `module:factory` specs) so that their library is
probed here, in this process or in the pytest process a `check` starts.

Supported release ranges (harness/backends/versions.py): which FlashInfer and flash-attn-4 releases
the glue takes, that a release outside is broken (an error) and one inside available, that the
adapters pass no keyword a supported release lacks, and that `list` and the report say where the
installed release stands."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness import backends
from harness.backends import BackendBroken, flashinfer_versions
from harness.backends.flash_attn_fa2 import FA2
from harness.backends.flash_attn_fa3 import FA3
from harness.backends.flash_attn_fa4 import FA4
from harness.backends.flash_attn_versions import FA4_RANGE
from harness.backends.flashinfer_versions import DIFFERENCES, RANGE
from harness.backends.versions import SupportedRange, import_library, module_version
from harness.checks.numeric import check_case
from harness.cli import main
from harness.core.case import Case, Request
from harness.report import environment
from harness.run import check, repro
from harness.run.speed import settings
from tests import flashinfer_fake as fake

ROOT = Path(__file__).resolve().parent.parent
FLEX_MODULE = "torch.nn.attention.flex_attention"
REQUIRE_ENV = "ATTN_HARNESS_REQUIRE"
UNDEFINED = "undefined symbol: _ZN3c104cuda9SetDeviceEi"  # an extension built against another torch
BROKEN = f"raise ImportError({UNDEFINED!r})\n"
GOOD = '{"mode": "EXTEND", "requests": [{"prefix_len": 3, "extend_len": 4}], "window_left": 2}'


@pytest.fixture
def site(tmp_path, monkeypatch):
    """install(module, code): a package at the front of sys.path whose __init__ runs `code`, hiding any
    real package of that name and its imported modules (on a GPU machine the real ones are there)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(module: str, code: str = "") -> None:
        top = module.partition(".")[0]
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            monkeypatch.delitem(sys.modules, name)
        path = tmp_path.joinpath(*module.split("."))
        path.mkdir(parents=True, exist_ok=True)
        (path / "__init__.py").write_text(code)
        importlib.invalidate_caches()

    install.path = tmp_path
    return install


def on_cpu(backend):
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}))
    return backend


def fa2() -> backends.Backend:
    return on_cpu(backends.load("fa2"))


# --- the library probe ----------------------------------------------------------------------------


def test_absent_present_and_broken_are_three_answers(site):
    assert import_library("no_such_kernel_lib") == (None, "no_such_kernel_lib is not installed here")
    site("kernel_ok", "__version__ = '1.2'\n")
    supported = SupportedRange(
        distribution="kernel-ok",
        module="kernel_ok",
        lowest="1.1",
        below="1.3",
        tested=("1.2",),
        why_lowest="-",
    )
    mod, why = import_library("kernel_ok", supported)
    assert why is None and mod.__version__ == "1.2"
    site("kernel_broken", BROKEN)
    with pytest.raises(BackendBroken, match="kernel_broken is installed but does not import: ImportError"):
        import_library("kernel_broken")
    with pytest.raises(BackendBroken, match=r"kernel_ok 1.2 is installed; this glue supports kernel-ok>=1\."):
        import_library(
            "kernel_ok",
            SupportedRange(
                distribution="kernel-ok",
                module="kernel_ok",
                lowest="1.3",
                below="2",
                tested=("1.3",),
                why_lowest="-",
            ),
        )


def test_a_missing_submodule_is_absent_and_a_missing_dependency_broken(site):
    """flash-attn-2 alone has no `flash_attn.cute` (fa4 is not installed); flash-attn-4 without its
    CuTe DSL is installed and broken."""
    site("flash_attn")
    mod, why = import_library("flash_attn.cute")
    assert mod is None and "flash_attn.cute is not installed here" in why
    site("flash_attn.cute", "import cutlass_dsl_absent_here\n")
    with pytest.raises(BackendBroken, match="No module named 'cutlass_dsl_absent_here'"):
        import_library("flash_attn.cute")


# --- every library-backed adapter -------------------------------------------------------------------


@pytest.mark.parametrize("adapter", [FA4, FA3, FA2], ids=lambda a: a.name)
def test_a_flash_attn_that_fails_to_import_is_broken_not_a_skip(site, adapter):
    backend = on_cpu(adapter())
    site(backend.entry[0], BROKEN)
    with pytest.raises(BackendBroken, match=UNDEFINED):
        backend.available("cpu")


def test_a_flash_attn_outside_its_glues_range_is_broken(site):
    site("flash_attn", "__version__ = '2.7.0'\ndef flash_attn_varlen_func(): pass\n")
    backend = on_cpu(FA2())
    assert backend.available("cpu") is None  # supported None: any version
    backend.supported = SupportedRange(
        distribution="flash-attn",
        module="flash_attn",
        lowest="2.8.0",
        below="3",
        tested=("2.8.3",),
        why_lowest="no seqused_k",
    )
    with pytest.raises(BackendBroken) as raised:
        backend.available("cpu")
    assert str(raised.value) == (
        "flash_attn 2.7.0 is installed; this glue supports flash-attn>=2.8.0,<3 (tested on 2.8.3); "
        "before 2.8.0: no seqused_k"
    )


@pytest.mark.parametrize("name", [n for n in backends.names() if n.startswith("flashinfer")])
def test_a_flashinfer_that_fails_to_import_is_broken_not_a_skip(site, name):
    site("flashinfer", BROKEN)
    with pytest.raises(BackendBroken, match=UNDEFINED):
        fake.on_cpu(backends.load(name)).available("cpu")


@pytest.mark.parametrize("name", ["flex_eager", "flex_compiled"])
def test_a_flex_attention_that_fails_to_import_is_broken_not_a_skip(site, monkeypatch, name):
    """torch.nn.attention.flex_attention shadowed by a module that raises (a broken torch install)."""
    package = importlib.import_module("torch.nn.attention")
    shadow = site.path / "shadow"
    shadow.mkdir()
    (shadow / "flex_attention.py").write_text(BROKEN)
    monkeypatch.setattr(package, "__path__", [str(shadow), *package.__path__])
    monkeypatch.delitem(sys.modules, FLEX_MODULE, raising=False)  # imported or not yet
    importlib.invalidate_caches()
    with pytest.raises(BackendBroken, match=UNDEFINED):
        backends.load(name).available("cpu")


def test_flex_without_flex_attention_in_torch_is_a_skip_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, FLEX_MODULE, None)
    why = backends.load("flex_eager").available("cpu")
    assert why and f"torch {torch.__version__} has no flex_attention" in why


def test_a_broken_backend_sends_no_model_check_to_the_shared_cuda_worker(site, monkeypatch):
    """Its model test raises before any job reaches the worker the other backends' checks share."""
    import cases.test_model as model_tests

    site("flash_attn", BROKEN)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sent = []
    monkeypatch.setattr(model_tests, "run_jobs", lambda jobs, *a, **k: sent.append(jobs))
    with pytest.raises(BackendBroken):
        model_tests.test_model_logprobs("fa2", "cuda", "gemma2", None, lambda res: None)
    assert sent == []


# --- the suite and the command line -----------------------------------------------------------------


def test_a_broken_install_fails_the_suite_instead_of_skipping_it(site, tmp_path):
    """`check` of an adapter whose library raises at import: its tests error with the message, exit 1
    (before: every test skipped with "does not import", exit 0)."""
    site("flash_attn", BROKEN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site.path), str(ROOT)])}
    argv = ["check", "--backend", "tests.test_availability:fa2", "--device", "cpu", "--family", "decode"]
    argv += ["--reports", str(tmp_path / "reports"), "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "BackendBroken" in proc.stdout and UNDEFINED in proc.stdout
    (tally,) = [line for line in proc.stdout.splitlines() if " deselected in " in line]
    assert tally.startswith("2 failed,") and "skipped" not in tally, tally


def test_list_shows_a_broken_backend_as_broken_and_exits_1(site, capsys):
    site("flash_attn", BROKEN)
    assert main(["list", "--backend", "tests.test_availability:fa2"]) == 1
    out = capsys.readouterr().out
    assert f"  cpu: broken: flash_attn is installed but does not import: ImportError: {UNDEFINED}" in out


@pytest.fixture
def suite_run(monkeypatch):
    """`check`'s pytest subprocess replaced by a recorder: whether the suite would have started."""
    started = []

    def fake_run(cmd, cwd, env):
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(check, "run_pytest", fake_run)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    return started


def test_check_require_names_each_unavailable_backend_and_runs_nothing(site, suite_run, capsys, tmp_path):
    site("flash_attn", BROKEN)
    argv = ["check", "--device", "cpu", "--reports", str(tmp_path), "--require"]
    assert main(argv + ["torch_native,fa3", "--require", "tests.test_availability:fa2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: required backend fa3 is unavailable on cpu: fa3 does not run on cpu",
        "error: required backend tests.test_availability:fa2 is broken on cpu: flash_attn is installed but "
        f"does not import: ImportError: {UNDEFINED}",
    ]
    assert not suite_run
    assert main(argv + ["torch_native"]) == 0 and len(suite_run) == 1


def test_check_require_from_the_environment(suite_run, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(REQUIRE_ENV, " flashinfer_paged , torch_native")
    assert main(["check", "--device", "cpu", "--reports", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: required backend flashinfer_paged is unavailable on cpu: flashinfer_paged does not run on cpu"
    )
    assert not suite_run
    monkeypatch.setenv(REQUIRE_ENV, "nope")
    settings.reset()  # a process reads its settings once
    assert main(["check", "--device", "cpu", "--reports", str(tmp_path)]) == 2
    assert "unknown backend 'nope'" in capsys.readouterr().err


def test_check_device_cuda_without_cuda_is_one_line_exit_2(suite_run, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(check, "default_device", lambda: "cpu")
    assert main(["check", "--device", "cuda", "--reports", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: --device cuda: no CUDA device here (torch.cuda.is_available() is False)"
    assert not suite_run


def test_repro_that_checked_nothing_exits_3_with_the_reason(capsys, monkeypatch):
    head_dim_8 = GOOD.replace("}], ", '}], "head_dim": 8, ')
    assert main(["repro", head_dim_8, "--backend", "flex_eager", "--device", "cpu"]) == 3
    assert "flex_eager on cpu: SKIP: flex_eager does not support head_dim 8" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["repro", GOOD, "--device", "cuda"]) == repro.NOTHING_CHECKED == 3
    assert "torch_native on cuda: SKIP: no CUDA device" in capsys.readouterr().out


def test_repro_on_a_broken_backend_exits_1_saying_broken(site, capsys):
    site("flash_attn", BROKEN)
    assert main(["repro", GOOD, "--backend", "tests.test_availability:fa2", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "tests.test_availability:fa2 on cpu: BROKEN: flash_attn is installed but does not import" in out


FLASHINFER = [n for n in backends.names() if n.startswith("flashinfer")]


def one(mode: str, request: Request, **fields) -> Case:
    return Case(mode=mode, requests=(request,), head_dim=64, **fields)


ONE_CASE = {  # one case each adapter runs, with every option that reaches plan() or run()
    "flashinfer_ragged": one("EXTEND", Request(20, 9), window_left=5, soft_cap=5.0),
    "flashinfer_paged": one("EXTEND", Request(20, 9), window_left=5, sinks=True),
    "flashinfer_dec_cc": one("DECODE", Request(20, 1), window_left=5),
    "flashinfer_dec_tc": one("DRAFT_EXTEND_V2", Request(20, 3), deterministic=True),
    "flashinfer_enc": one("CROSS", Request(0, 3, 9), kv_dtype="float8_e4m3fn", k_scale=0.5),
}


@pytest.mark.parametrize("version", ["0.6.16", "0.6.18.post1", "0.7.0", "0.7.2.post1"])
def test_flashinfer_releases_in_the_range(version):
    assert RANGE.contains(version) and RANGE.why_unsupported(version) is None


@pytest.mark.parametrize("version", ["0.5.3", "0.6.0", "0.6.15.post1", "0.8.0", "unknown"])
def test_flashinfer_releases_outside_the_range_say_why(version):
    why = RANGE.why_unsupported(version)
    supports = "this glue supports flashinfer-python>=0.6.16,<0.8"
    assert why.startswith(f"flashinfer {version} is installed; {supports}")
    assert "q_len_per_req" in why  # what the releases before the lowest lack


@pytest.mark.parametrize(
    "version,inside", [("4.0.0b25", False), ("4.0.0b26", True), ("4.0.0b36", True), ("4.0.0", False)]
)
def test_fa4_range_is_the_betas_from_b26(version, inside):
    assert FA4_RANGE.contains(version) is inside


def test_status_says_tested_in_range_or_outside():
    assert RANGE.status("0.6.18.post1") == "tested" and RANGE.status("0.7.2.post1") == "tested"
    assert RANGE.status("0.7.1") == "in range (untested)"
    assert RANGE.status("0.8.0") == "outside >=0.6.16,<0.8"


@pytest.mark.parametrize("name", FLASHINFER)
@pytest.mark.parametrize(
    "release,broken", [("0.6.18.post1", False), ("0.7.0", False), ("0.6.15", True), ("0.8.0", True)]
)
def test_a_flashinfer_release_outside_the_range_is_broken(monkeypatch, name, release, broken):
    fake.install(monkeypatch, release)
    backend = fake.on_cpu(backends.load(name))
    if broken:
        with pytest.raises(BackendBroken, match=f"flashinfer {release} is installed; this glue supports"):
            backend.available("cpu")
    else:
        assert backend.available("cpu") is None


def test_the_fake_posing_as_0_6_refuses_what_0_6_lacks(monkeypatch):
    """The fake's 0.6 pose can fail: a keyword from 0.7 is a TypeError there, accepted on 0.7.2.post1."""
    fake.install(monkeypatch, "0.6.18.post1")
    with pytest.raises(TypeError, match="unexpected keyword argument 'variant_owns_mask'"):
        fake.BatchPrefillWithPagedKVCacheWrapper(None, "NHD", variant_owns_mask=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lse_base'"):
        fake.BatchPrefillWithRaggedKVCacheWrapper(None).run(None, None, None, lse_base="ln")
    fake.install(monkeypatch, "0.7.2.post1")
    fake.BatchPrefillWithPagedKVCacheWrapper(None, "NHD", variant_owns_mask=False)


@pytest.mark.parametrize("name", FLASHINFER)
def test_the_adapters_pass_no_keyword_a_supported_release_lacks(monkeypatch, name):
    """Every plan/run/__init__ an adapter makes, recorded on 0.7.2.post1 (which takes them all): none
    of the keywords some supported release lacks. The 0.6.18.post1 runs (in test_flashinfer_glue)
    would raise on one; this names it."""
    fake.install(monkeypatch, "0.7.2.post1")
    res = check_case(fake.on_cpu(backends.load(name)), ONE_CASE[name], "cpu")
    assert res.status == "pass", res.failure_text()
    passed = {k for _, args in fake.CALLS for k in args}
    assert fake.CALLS and not passed & set(flashinfer_versions.KEYWORDS_SINCE)


def test_the_harness_and_the_fake_read_the_same_keyword_differences_from_the_wheels():
    assert flashinfer_versions.KEYWORDS_SINCE == fake.KEYWORDS_SINCE


def test_each_named_difference_is_inside_the_range_and_says_what_the_glue_does():
    for d in DIFFERENCES:
        assert RANGE.contains(d.since) and d.where and d.glue, d.name
    assert len({d.name for d in DIFFERENCES}) == len(DIFFERENCES)


def test_a_placeholder_module_version_is_read_from_the_distribution():
    """flash-attn-4's flash_attn.cute says 0.0.0 (it asks metadata for 'fa4'): the distribution's wins."""
    assert module_version(types.SimpleNamespace(__version__="0.0.0"), "pytest") == pytest.__version__
    assert module_version(types.SimpleNamespace(), "no-such-distribution-xyz") == "unknown"
    assert module_version(types.SimpleNamespace(__version__="0.7.2.post1"), "pytest") == "0.7.2.post1"


def test_a_distribution_version_is_read_from_its_metadata_once_per_process(monkeypatch):
    """FA4's glue asks for its version on every case: the metadata file is parsed once, not each time."""
    from harness.backends import versions

    reads = []

    def version(name: str) -> str:
        reads.append(name)
        return "4.0.0b36"

    monkeypatch.setattr(versions.metadata, "version", version)
    versions.distribution_version.cache_clear()
    try:
        placeholder = types.SimpleNamespace(__version__="0.0.0")
        found = [module_version(placeholder, "flash-attn-4") for _ in range(3)]
    finally:
        versions.distribution_version.cache_clear()
    assert found == ["4.0.0b36"] * 3
    assert reads == ["flash-attn-4"]


@pytest.mark.parametrize("release,broken", [("4.0.0b36", False), ("4.0.0b20", True)])
def test_fa4_outside_its_range_is_broken(monkeypatch, release, broken):
    cute = types.ModuleType("flash_attn.cute")
    cute.__version__ = release
    cute.flash_attn_varlen_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    fa4 = FA4()
    fa4.capabilities = dataclasses.replace(fa4.capabilities, devices=frozenset({"cpu"}))
    if broken:
        with pytest.raises(BackendBroken, match="learnable_sink must be bfloat16 before 4.0.0b26"):
            fa4.available("cpu")
    else:
        assert fa4.available("cpu") is None


@pytest.mark.parametrize(
    "release,line,rc",
    [
        ("0.6.18.post1", "release: flashinfer-python 0.6.18.post1 (tested)", 0),
        ("0.7.1", "release: flashinfer-python 0.7.1 (in range (untested))", 0),
        ("0.6.15", "release: flashinfer-python 0.6.15 (outside >=0.6.16,<0.8)", 1),
    ],
)
def test_list_shows_the_installed_release_against_the_range(monkeypatch, capsys, release, line, rc):
    fake.install(monkeypatch, release)
    load = backends.load
    monkeypatch.setattr(backends, "load", lambda name: fake.on_cpu(load(name)))  # cpu: where the fake runs
    assert main(["list", "--backend", "flashinfer_paged"]) == rc
    assert line in capsys.readouterr().out.splitlines()[1]


def test_the_report_environment_says_where_a_release_stands(monkeypatch):
    versions = {"flashinfer-python": "0.6.18.post1", "flash-attn-4": "4.0.0b20"}

    def version(name):
        if name not in versions:
            raise environment.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(environment.metadata, "version", version)
    assert environment.package_version(("flashinfer-python", "flashinfer")) == "0.6.18.post1 (tested)"
    assert environment.package_version(("flash-attn-4",)) == "4.0.0b20 (outside >=4.0.0b26,<4.0.0)"
    assert environment.package_version(("torch",)) == "not installed"
