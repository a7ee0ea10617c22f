"""Supported release ranges (harness/backends/versions.py): which FlashInfer and flash-attn-4 releases
the glue takes, that a release outside is broken (an error) and one inside available, that the
adapters pass no keyword a supported release lacks, and that `list` and the report say where the
installed release stands."""

import dataclasses
import sys
import types

import pytest

from harness import backends
from harness.backends import BackendBroken, flashinfer_versions
from harness.backends.flash_attn_fa4 import FA4
from harness.backends.flash_attn_versions import FA4_RANGE
from harness.backends.flashinfer_versions import DIFFERENCES, RANGE
from harness.backends.versions import module_version
from harness.checks.numeric import check_case
from harness.cli import main
from harness.core.case import Case, Request
from harness.report import environment
from tests import flashinfer_fake as fake

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
