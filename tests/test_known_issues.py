"""A known library bug is an expected failure on the versions it names, and only there.

sglang's FlashInferAttnBackend: a soft cap given to forward() only, a ragged prefill planned without
its window, and a cached FP8 prefix read without its scales, are expected failures of sglang_flashinfer
on the release they were seen on, where FlashInfer called as sglang calls it is wrong on the case too
(the FlashInfer fake computes what plan() compiled). The cases are those sglang_flashinfer failed on an
H200 (sglang 0.5.17, flashinfer-python 0.6.18.post1), as their repro lines give them;
tests/test_flashinfer_gpu.py judges them with FlashInfer itself."""

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

from harness.backends import load
from harness.backends.torch_native import TorchNative
from harness.checks import engine_confirm, known_issues
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.core.results import summary_table
from harness.mutants import by_name
from harness.report import junit
from harness.run import isolation
from tests import flashinfer_fake as fake

LONG_WINDOWED = Case(mode="ENCODER_ONLY", requests=(Request(0, 300),), window_left=4, dtype="float32")


def wrong_as(name: str):
    """A backend that gets encoder cases wrong (run with the causal mask), under a FlashInfer name."""
    backend = by_name("torch_native~encoder_causal").make()
    backend.name = name
    return backend


def reached_by_paged(monkeypatch) -> None:
    """The sink entry as it stood before the glue worked around it (reached by flashinfer_paged's sink
    cases, and confirmed on each: a library wrong on every one): a stand-in for the hooks' tests below."""
    stand_in = [
        dataclasses.replace(
            i, backends=frozenset({"flashinfer_paged"}), worked_around="", confirm=lambda case, device: True
        )
        if i.id == "flashinfer-sink-module-name"
        else i
        for i in known_issues.KNOWN_ISSUES
    ]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))


@pytest.fixture
def version(monkeypatch):
    def installed(v):
        monkeypatch.setattr(known_issues, "distribution_version", lambda dist: v)
        monkeypatch.setattr(known_issues, "_CONFIRMED", {})

    return installed


def windowless_past_256(run):
    """The ragged fake's run() with the library's bug put in: a non-causal window dropped once a
    request has more than 256 keys (what known_issues/flashinfer_noncausal_window.py shows)."""

    def buggy(self, q, k, v, *args, **rest):
        longest = max(b - a for a, b in zip(self._kv, self._kv[1:]))
        if not self._causal and self._window_left >= 0 and longest > 256:
            self._window_left = -1
        return run(self, q, k, v, *args, **rest)

    return buggy


@pytest.fixture
def flashinfer_with_bug(monkeypatch):
    """The FlashInfer fake, installed, with the non-causal window bug in its ragged wrapper."""
    fake.install(monkeypatch)
    ragged = fake.BatchPrefillWithRaggedKVCacheWrapper
    monkeypatch.setattr(ragged, "run", windowless_past_256(ragged.run))


def test_a_failure_the_known_issue_reaches_and_confirms_is_xfail_on_its_version(version, flashinfer_with_bug):
    version("0.7.2.post1")
    res = check_case(wrong_as("flashinfer_ragged"), LONG_WINDOWED)
    assert res.status == "xfail", res.reason
    assert res.reason.startswith("known issue flashinfer-noncausal-window (flashinfer-python 0.7.2.post1, ")
    assert "known_issues/flashinfer_noncausal_window.py" in res.reason and "err " in res.reason
    assert "confirmed: the library called directly on this case is wrong too" in res.reason


def test_without_the_library_a_failure_the_known_issue_reaches_counts(version):
    """Nothing confirms the issue where FlashInfer is not installed: the failure is a failure."""
    version("0.7.2.post1")
    res = check_case(wrong_as("flashinfer_ragged"), LONG_WINDOWED)
    assert res.status == "fail"
    assert "not known issue flashinfer-noncausal-window (flashinfer-python 0.7.2.post1)" in res.reason


def posing(mutant: str):
    """A FlashInfer mutant on the CPU (the fake serves it) under its adapter's name, as the suite
    would run that adapter with the bug in its glue."""
    backend = fake.on_cpu(by_name(mutant).make())
    backend.name = mutant.split("~")[0]
    return backend


ENCODER_IN_REACH = Case(
    mode="ENCODER_ONLY", requests=(Request(0, 300), Request(0, 40)), window_left=4, head_dim=64
)


@pytest.mark.parametrize("mutant", ["flashinfer_ragged~encoder_causal", "flashinfer_ragged~no_window"])
def test_a_glue_bug_inside_the_issues_reach_fails_where_the_library_is_right(version, monkeypatch, mutant):
    """On the CPU with the FlashInfer fake (right where the real kernel is, e.g. 4096 tokens with
    window 64): an encoder glue bug of flashinfer_ragged on a case the entry's predicate reaches, on
    a release it names (where the predicate alone made it an xfail), is a FAIL."""
    fake.install(monkeypatch)
    version("0.7.2.post1")
    assert known_issues.reaching_issue("flashinfer_ragged", ENCODER_IN_REACH) is not None
    assert check_case(fake.on_cpu(load("flashinfer_ragged")), ENCODER_IN_REACH).status == "pass"
    res = check_case(posing(mutant), ENCODER_IN_REACH)
    assert res.status == "fail", res.reason
    assert "not known issue flashinfer-noncausal-window" in res.reason
    assert "the failure is the glue's" in res.reason


def test_the_same_glue_bug_is_excused_where_the_library_is_wrong_too(version, flashinfer_with_bug):
    version("0.7.2.post1")
    res = check_case(posing("flashinfer_ragged~encoder_causal"), ENCODER_IN_REACH)
    assert res.status == "xfail", res.reason
    version("0.7.1")  # another release: the entry does not reach it, whatever the library does
    res = check_case(posing("flashinfer_ragged~encoder_causal"), ENCODER_IN_REACH)
    assert res.status == "fail" and "known issue" not in res.reason


def test_a_confirmation_runs_once_per_case_and_device(version, monkeypatch):
    version("0.7.2.post1")
    asked = []
    issue = known_issues.KNOWN_ISSUES[0]
    stand_in = [
        dataclasses.replace(i, confirm=lambda c, d: asked.append(d) or True) if i.id == issue.id else i
        for i in known_issues.KNOWN_ISSUES
    ]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))
    for _ in range(3):
        assert known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cpu")[0]
    assert known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cuda")[0]
    assert asked == ["cpu", "cuda"]


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
        "flashinfer-graph-capture-unsplit": {"0.6.18.post1"},  # measured on the H200
        # the suite's records on the H200: 0.7.2.post1 right on the same cases (docs/known-issues.md)
        "flashinfer-prefill-far-negative-logits": {"0.6.18.post1"},
        "flashinfer-fa3-prefill-far-negative-logits": {"0.6.18.post1"},  # the script with --backend fa3
        # the suite's vllm_flashinfer FP8 prefill under a cap on the H200; the source of the fa3 FP8 run
        "flashinfer-fa3-fp8-prefill-soft-cap": {"0.6.18.post1"},
        "vllm-flashinfer-e5m2-query": {"0.26.0"},  # the suite's e5m2 prefix case on the H200 (a crash)
        "vllm-cpu-fp8-e4m3-bf16-subnormals": {"0.28.0", "0.32.0"},
        "vllm-cpu-fp8-write-truncates": {"0.28.0", "0.32.0"},
        "vllm-cpu-amx-permission": {"0.28.0", "0.32.0"},
        "vllm-cpu-sinks-bf16-only": {"0.28.0"},  # measured on the CPU (docs/engines.md)
        "vllm-cpu-softcap-nan": {"0.28.0", "0.32.0"},  # measured on the CPU (docs/engines.md)
        "sglang-window-zero": {
            "0.5.23",
            "0.5.17",
            "0.5.13.post1",
        },  # its script, on the CPU (docs/engines.md)
        "vllm-fa3-graph-window-metadata": {"0.26.0"},  # the suite's graph failures on the H200
        # the code of both releases read (docs/known-issues.md); the H200's cross cases on 0.5.17
        "sglang-fa3-cross-page-table": {"0.5.23", "0.5.17"},
        # the code of both releases read; their own plan raises on the CPU (tests/test_engines_sglang.py)
        "sglang-fa3-cross-text-table": {"0.5.23", "0.5.17"},
        # the suite's sglang_flashinfer records on the H200 (docs/engines.md); 0.5.23 reads the same
        "sglang-flashinfer-soft-cap": {"0.5.17"},
        "sglang-flashinfer-soft-cap-replay": {"0.5.17"},  # the same code path, planned for a graph
        "sglang-flashinfer-ragged-window": {"0.5.17"},
        # the suite's FP8 prefix case on the H200; the call passes the scales from 0.5.18 on (the wheels read)
        "sglang-flashinfer-fp8-prefix-scales": {"0.5.17"},
    }


def test_every_known_issue_names_releases_inside_the_supported_range():
    """A key outside the range would never match a release the glue runs on (one outside is broken)."""
    from harness.backends.engines.sglang.engine import SGLANG
    from harness.backends.engines.vllm import CPU_RANGE, GPU_RANGE
    from harness.backends.flashinfer_versions import RANGE

    ranges = {r.distribution: r for r in (RANGE, SGLANG.supported, CPU_RANGE, GPU_RANGE)}
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
        assert issue.confirm or not issue.backends, issue.id  # an issue a backend reaches can confirm itself


def test_an_issue_that_cannot_confirm_excuses_nothing(version, monkeypatch):
    """Where the library is not there to call (or has no way to confirm), a failure counts."""
    version("0.7.2.post1")
    stand_in = [dataclasses.replace(i, confirm=None) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))
    assert known_issues.reaching_issue("flashinfer_ragged", LONG_WINDOWED)
    assert known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cpu") == (
        False,
        "err; not known issue flashinfer-noncausal-window (flashinfer-python 0.7.2.post1): the library "
        "called directly on this case is right, or could not run it, so the failure is the glue's",
    )


def test_a_confirmation_that_raises_confirms_nothing(version, monkeypatch):
    version("0.7.2.post1")

    def refuses(case, device):
        raise ValueError("the library refused the case")

    stand_in = [dataclasses.replace(i, confirm=refuses) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stand_in))
    assert not known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cpu")[0]


def test_the_engine_and_graph_confirmations_confirm_nothing_without_their_library():
    """No vLLM, sglang, FlashInfer or CUDA here: each confirmation says so by confirming nothing."""
    from harness.checks import engine_confirm, flashinfer_graph_confirm
    from harness.core.graph_case import GraphCase

    fp8 = Case(mode="DECODE", requests=(Request(9, 1),), kv_dtype="float8_e4m3fn", k_scale=0.3)
    assert not engine_confirm.vllm_fp8_write_truncates(fp8, "cpu")
    assert not engine_confirm.vllm_fp8_e4m3_subnormals(fp8, "cpu")
    plain = fp8.replace(window_left=0, kv_dtype=None, k_scale=1.0)
    assert not engine_confirm.sglang_window_zero(plain, "cpu")
    cross = Case(mode="CROSS", requests=(Request(0, 1, 20),))
    assert not engine_confirm.sglang_fa3_cross_page_table(cross, "cpu")
    longer_text = Case(mode="CROSS", requests=(Request(0, 13, 33), Request(0, 18, 18)))
    assert not engine_confirm.sglang_fa3_cross_text_table(longer_text, "cuda")
    g = GraphCase((Case(mode="DECODE", requests=(Request(9, 1),), deterministic=True, window_left=3),), 1, 16)
    assert not flashinfer_graph_confirm.graph_unsplit_plan(g, "cpu")
    assert not flashinfer_graph_confirm.graph_unsplit_plan(g, "cuda")


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


def test_xfail_is_counted_in_the_summary_and_is_a_skip_in_junit(version, flashinfer_with_bug):
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


class _Stream:
    def wait_stream(self, other) -> None:
        pass


class _Replayed:
    """A stand-in CUDA graph: a replay runs the captured forward again into the captured output."""

    def __init__(self, forward, out) -> None:
        self.forward, self.out = forward, out

    def replay(self) -> None:
        self.out.copy_(self.forward())


@pytest.fixture
def graph_driver_on_the_cpu(monkeypatch):
    """The graph confirmation's driver on the CPU: the FlashInfer fake as the library, torch.cuda's
    stream calls as no-ops, a capture that replays by running its forward again."""
    import contextlib

    import torch

    from harness.checks import flashinfer_graph_confirm as driver

    fake.install(monkeypatch)
    for name, stub in {
        "synchronize": lambda *a: None,
        "Stream": _Stream,
        "current_stream": _Stream,
        "stream": lambda s: contextlib.nullcontext(),
        "graph_pool_handle": lambda: None,
    }.items():
        monkeypatch.setattr(torch.cuda, name, stub)

    def capture(forward, mempool):
        out = forward()
        return _Replayed(forward, out), out

    monkeypatch.setattr(driver, "capture", capture)
    return driver


def test_the_graph_confirmations_driver_is_right_where_the_library_is_and_says_where_it_is_not(
    graph_driver_on_the_cpu, monkeypatch
):
    """Its tables, pages and comparison on the fake (right on every graph): every replay right; with
    the fake's decode run dropping the last request's output, the replay is reported wrong."""
    driver = graph_driver_on_the_cpu
    layer = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, deterministic=True, dtype="bfloat16")
    batches = (
        Case(mode="TARGET_VERIFY", requests=(Request(300, 3, tree=(-1, 0, 1)),) * 2, window_left=40, **layer),
        Case(mode="TARGET_VERIFY", requests=(Request(17, 3, tree=(-1, 0, 1)),) * 3, window_left=40, **layer),
    )
    g = GraphCase(batches, 3, 400)
    assert driver.drive(g, "cpu", driver.Step()).startswith("RIGHT")
    run = fake.BatchDecodeWithPagedKVCacheWrapper.run

    def last_row_lost(self, q, *args, **kw):
        out = run(self, q, *args, **kw)
        out = out[0] if isinstance(out, tuple) else out
        out[-3:] = 0
        return out

    monkeypatch.setattr(fake.BatchDecodeWithPagedKVCacheWrapper, "run", last_row_lost)
    assert driver.drive(g, "cpu", driver.Step()).startswith("REPRODUCED: batch 0 replayed at size 2")


def test_a_failure_two_issues_reach_is_excused_by_the_one_that_confirms(version, monkeypatch):
    """Two entries can reach one case (an FP8 case both vLLM cache entries reach): the failure is the
    library's when any of them confirms, not only when the first does."""
    version("0.7.2.post1")
    first = dataclasses.replace(known_issues.KNOWN_ISSUES[0], id="first", confirm=lambda c, d: False)
    second = dataclasses.replace(known_issues.KNOWN_ISSUES[0], id="second", confirm=lambda c, d: True)
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", (first, second))
    excused, reason = known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cpu")
    assert excused and reason.startswith("known issue second ")
    version("0.7.2.post1")  # confirmations are kept per issue and case within a process
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", (first, dataclasses.replace(second, confirm=None)))
    assert known_issues.excuse("flashinfer_ragged", LONG_WINDOWED, "err", "cpu")[1].startswith(
        "err; not known issue first (flashinfer-python 0.7.2.post1), second (flashinfer-python 0.7.2.post1)"
    )


FAR_NEGATIVE = Case(
    mode="EXTEND",
    requests=(Request(10, 6),),
    logits="dominant",
    logit_offset=-3e4,
    head_dim=64,
    dtype="bfloat16",
)


@pytest.fixture
def flashinfer_far_negative_bug(monkeypatch):
    """The FlashInfer fake with the 0.6.18.post1 prefill bug put in its ragged wrapper: a row carried
    by logits far below zero (a query component as large as the pattern writes) comes back zero."""
    far_negative_bug_on(monkeypatch, {"fa2", "fa3", "auto"})


def far_negative_bug_on(monkeypatch, kernels: set[str]) -> None:
    """The FlashInfer fake, installed, with the far-negative bug in the ragged wrapper of these kernel
    backends: a row carried by logits far below zero comes back zero."""
    fake.install(monkeypatch)
    ragged = fake.BatchPrefillWithRaggedKVCacheWrapper
    run = ragged.run

    def buggy(self, q, k, v, *args, **rest):
        out = run(self, q, k, v, *args, **rest)
        return out * 0 if self._backend in kernels and float(q.float().abs().max()) > 256 else out

    monkeypatch.setattr(ragged, "run", buggy)


def test_the_far_negative_prefill_issue_reaches_prefill_rows_far_below_zero_only():
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == "flashinfer-prefill-far-negative-logits"]
    assert issue.reaches(FAR_NEGATIVE)
    assert not issue.reaches(FAR_NEGATIVE.replace(logit_offset=-1000.0))  # the script sees it right there
    assert not issue.reaches(FAR_NEGATIVE.replace(logit_offset=-9999.0))  # not shown wrong by the script
    assert issue.reaches(FAR_NEGATIVE.replace(logit_offset=-10000.0))  # the script's first wrong offset
    assert not issue.reaches(FAR_NEGATIVE.replace(mode="DECODE", requests=(Request(10, 1),)))
    assert not issue.reaches(
        FAR_NEGATIVE.replace(mode="TARGET_VERIFY", requests=(Request(10, 3, tree=(-1, 0, 0)),))
    )
    assert issue.reaches(
        FAR_NEGATIVE.replace(mode="TARGET_VERIFY", requests=(Request(10, 3, tree=(-1, 0, 1)),))
    )


def test_the_far_negative_confirmation_is_right_where_the_library_is_and_says_where_it_is_not(
    monkeypatch, flashinfer_far_negative_bug
):
    from harness.checks.flashinfer_confirm import far_negative_logits

    assert far_negative_logits(FAR_NEGATIVE, "cpu")
    assert not far_negative_logits(FAR_NEGATIVE.replace(logits="plain", logit_offset=0.0), "cpu")


@pytest.mark.parametrize("name", ["flashinfer_paged", "sglang_flashinfer", "vllm_flashinfer"])
def test_a_far_negative_failure_is_xfail_on_its_release_only_where_the_library_is_wrong_too(
    version, monkeypatch, flashinfer_far_negative_bug, name
):
    version("0.6.18.post1")
    backend = wrong_as(name)
    case = FAR_NEGATIVE.replace(mode="ENCODER_ONLY", requests=(Request(0, 12),))
    res = check_case(backend, case)
    assert res.status == "xfail", res.reason
    entry = "flashinfer-fa3-prefill" if name == "vllm_flashinfer" else "flashinfer-prefill"  # its kernel's
    assert f"known issue {entry}-far-negative-logits" in res.reason
    version("0.7.2.post1")
    assert check_case(backend, case).status == "fail"


@pytest.mark.parametrize(
    ("wrong_kernels", "excused"),
    [  # "auto" stands for Hopper's pick, fa3, as vLLM's prefill wrapper asks for it
        ({"fa3", "auto"}, {"vllm_flashinfer": "flashinfer-fa3-prefill"}),
        ({"fa2"}, {"flashinfer_paged": "flashinfer-prefill", "sglang_flashinfer": "flashinfer-prefill"}),
        (  # as on an H200 with 0.6.18.post1
            {"fa2", "fa3", "auto"},
            {
                "flashinfer_paged": "flashinfer-prefill",
                "sglang_flashinfer": "flashinfer-prefill",
                "vllm_flashinfer": "flashinfer-fa3-prefill",
            },
        ),
    ],
)
def test_each_far_negative_entry_confirms_on_the_kernel_its_backends_prefill_with(
    version, monkeypatch, wrong_kernels, excused
):
    """The bug on some kernel backends only. fa2's entry excuses the backends that prefill on fa2;
    fa3's excuses vllm_flashinfer where the kernel vLLM's "auto" picks is wrong (fa3 on Hopper, fa2
    elsewhere), so a right fa3 beside a wrong fa2 excuses nothing of vLLM's on Hopper."""
    far_negative_bug_on(monkeypatch, wrong_kernels)
    version("0.6.18.post1")
    case = FAR_NEGATIVE.replace(mode="ENCODER_ONLY", requests=(Request(0, 12),))
    for name in ("flashinfer_paged", "sglang_flashinfer", "vllm_flashinfer"):
        res = check_case(wrong_as(name), case)
        assert res.status == ("xfail" if name in excused else "fail"), (name, res.status)
        if name in excused:
            assert res.reason.startswith(f"known issue {excused[name]}-far-negative-logits"), res.reason


def test_a_far_negative_failure_counts_where_the_library_is_right(version, monkeypatch):
    fake.install(monkeypatch)
    version("0.6.18.post1")
    res = check_case(
        wrong_as("flashinfer_paged"), FAR_NEGATIVE.replace(mode="ENCODER_ONLY", requests=(Request(0, 12),))
    )
    assert res.status == "fail", res.reason
    assert "not known issue flashinfer-prefill-far-negative-logits" in res.reason


def test_the_graph_confirmation_says_what_its_child_found(monkeypatch, capsys):
    """A failure it does not excuse shows why in its log: the child's exit and last line."""
    import subprocess

    from harness.checks import flashinfer_graph_confirm as driver

    monkeypatch.setattr(driver, "library", lambda name: object())
    done = subprocess.CompletedProcess([], driver.CANNOT, stdout="draw the inputs\nCANNOT: no CUDA\n")
    monkeypatch.setattr(driver.subprocess, "run", lambda *a, **kw: done)
    g = GraphCase((Case(mode="DECODE", requests=(Request(5, 1),), deterministic=True),), 1, 8)
    assert not driver.graph_unsplit_plan(g, "cuda")
    assert "graph confirmation: exit 2: CANNOT: no CUDA" in capsys.readouterr().err


def window_zero(*batches: tuple[int, ...], **fields) -> GraphCase:
    """A window-0 decode graph: one batch per tuple of request prefixes, each request one new token."""
    layer = Case(mode="DECODE", requests=(Request(0, 1),), window_left=0, **fields)
    cases = tuple(layer.replace(requests=tuple(Request(p, 1) for p in b)) for b in batches)
    return GraphCase(cases, max(len(b) for b in batches), 40)


def test_the_window_zero_issue_reaches_cases_and_graphs_where_a_query_has_a_key_besides_its_own():
    """sglang-window-zero changes an output only where a request holds two keys or more: eagerly, or in
    some replay of a graph (whose forward reads the same RadixAttention's window)."""
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == "sglang-window-zero"]
    assert issue.on_eager and issue.on_replay
    one_key = Case(mode="DECODE", requests=(Request(0, 1),), window_left=0)
    assert not issue.reaches(one_key)
    assert issue.reaches(one_key.replace(requests=(Request(0, 1), Request(1, 1))))
    assert issue.reaches(Case(mode="EXTEND", requests=(Request(0, 2),), window_left=0))
    assert not issue.reaches(one_key.replace(requests=(Request(5, 1),), window_left=1))
    assert issue.reaches(window_zero((0,), (1,)))  # the H200's failing graph: its second replay
    assert not issue.reaches(window_zero((0,), (0, 0)))
    assert not issue.reaches(window_zero((3,), (1,)).replace_layer(window_left=2))


def test_the_window_zero_issue_reaches_sglangs_graph_path_on_the_releases_it_names(version):
    g = window_zero((0,), (1,))
    version("0.5.17")
    for case in (g, g.batches[1]):  # the graph path, and the eager path on its second batch
        assert [i.id for i, _ in known_issues.reaching_issues("sglang_fa3", case)] == ["sglang-window-zero"]
    version("0.5.18")
    assert not known_issues.reaching_issues("sglang_fa3", g)


def test_the_window_zero_confirmation_asks_of_a_graphs_layer(monkeypatch):
    """A GraphCase is confirmed on its layer, as the eager case is: RadixAttention built with window 0
    (a stand-in RadixAttention with sglang's `sliding_window_size or -1`, and one that keeps 0)."""
    from types import SimpleNamespace

    from harness.checks import engine_confirm

    built = []

    def radix(keeps_zero: bool):
        def make(*args, sliding_window_size: int, **kw):
            built.append((args, sliding_window_size))
            stored = sliding_window_size if keeps_zero else sliding_window_size or -1
            return SimpleNamespace(sliding_window_size=stored)

        return SimpleNamespace(RadixAttention=make)

    g = window_zero((0,), (1,), num_q_heads=8, num_kv_heads=2, head_dim=64)
    monkeypatch.setattr(engine_confirm, "library", lambda name: radix(keeps_zero=False))
    assert engine_confirm.sglang_window_zero(g, "cpu")
    assert built[-1] == ((8, 64, g.layer.scale, 2), 0)
    monkeypatch.setattr(engine_confirm, "library", lambda name: radix(keeps_zero=True))
    assert not engine_confirm.sglang_window_zero(g, "cpu")
    assert not engine_confirm.sglang_window_zero(g.replace_layer(window_left=1), "cpu")


def test_the_vllm_graph_window_issue_reaches_windowed_one_query_graphs_with_a_replay_inside_the_window():
    """vllm-fa3-graph-window-metadata: where FA3 drops the window for a replay's plan (its longest request
    holds W + 1 keys or fewer) and then, with one query per request, the causal mask too (head size 64
    or less, or over 128); never a deterministic graph (no plan ahead) nor the eager path."""
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == "vllm-fa3-graph-window-metadata"]
    assert issue.on_replay and not issue.on_eager
    failing = window_zero((0,), (0,), head_dim=32)  # the H200's next_token-swa graph
    assert issue.reaches(failing)
    assert not issue.reaches(failing.replace_layer(head_dim=128))  # FA3 keeps causal there: same layout
    assert issue.reaches(failing.replace_layer(head_dim=256))
    assert not issue.reaches(failing.replace_layer(deterministic=True))
    assert not issue.reaches(failing.replace_layer(window_left=-1))
    assert not issue.reaches(window_zero((1,), (3, 0), head_dim=32))  # every replay past the window
    assert issue.reaches(window_zero((1,), (3, 0), head_dim=32).replace_layer(window_left=4))
    verify = GraphCase(
        (Case(mode="TARGET_VERIFY", requests=(Request(0, 1, tree=(-1,)),), window_left=0, head_dim=32),), 1, 2
    )
    assert issue.reaches(verify)  # a verify of one draft: one query per request
    five = Request(5, 5, tree=(-1, 0, 1, 2, 3))
    assert not issue.reaches(GraphCase((verify.layer.replace(requests=(five,), window_left=23),), 2, 127))
    assert not known_issues.reaching_issues("vllm_flash_attn", failing.layer)  # eager: not reached


def fa3_plan_size(**kw) -> torch.Tensor:
    """FA3's get_scheduler_metadata as hopper/flash_api.cpp sizes it: a window covering max_seqlen_k
    dropped, causal dropped too for one query with no window at a head size of 64 or less (or over
    128), then one vector of round_up(b, 4) for prepare_varlen, one for the dynamic split, one for
    the head swizzle (causal or local), and the semaphore."""
    b, q, k, d = kw["batch_size"], kw["max_seqlen_q"], kw["max_seqlen_k"], kw["headdim"]
    left, right = kw["window_size"]
    causal = kw["causal"]
    left, right = -1 if left >= k - 1 else left, -1 if right >= q - 1 else right
    if q == 1 and left == right == -1 and (d <= 64 or d > 128 or kw["page_size"] is None):
        causal = False
    right = 0 if causal else right
    is_causal = left < 0 and right == 0
    is_local = (left >= 0 or right >= 0) and not is_causal
    vectors = 1 + (b <= 992 and kw["num_splits"] > 1) + (is_causal or is_local)
    return torch.zeros(1 + -(-b // 4) * 4 * vectors, dtype=torch.int32)


@pytest.fixture
def fa3_planner(monkeypatch):
    """vLLM's FA3 modules as the confirmation reads them, with FA3's plan sizes (fa3_plan_size); the
    calls it made are kept."""
    from types import SimpleNamespace

    from harness.checks import engine_confirm

    calls = []

    def plan(**kw):
        calls.append(kw)
        return fa3_plan_size(**kw)

    modules = {
        "vllm.vllm_flash_attn": SimpleNamespace(get_scheduler_metadata=plan),
        "vllm.v1.attention.backends.fa_utils": SimpleNamespace(get_flash_attn_version=lambda head_size=0: 3),
        "vllm.config": SimpleNamespace(
            AttentionConfig=lambda: SimpleNamespace(flash_attn_max_num_splits_for_cuda_graph=32)
        ),
    }
    monkeypatch.setattr(engine_confirm, "library", modules.get)
    return calls


def test_the_vllm_graph_window_confirmation_compares_the_replays_plan_with_the_captures(fa3_planner):
    """The capture planned at max_model_len over requests of one query each, every replay at its
    longest request and padded to its captured size: confirmed where a replay's plan is laid out
    otherwise (the H200's graph), not where the layouts agree."""
    from harness.checks.engine_confirm import vllm_fa3_graph_window_metadata as confirm

    failing = window_zero((0,), (0,), head_dim=32)
    assert confirm(failing, "cpu")
    capture = [c for c in fa3_planner if c["max_seqlen_k"] == 4096]
    replay = [c for c in fa3_planner if c["max_seqlen_k"] == 1]
    assert capture and replay
    assert capture[0]["window_size"] == replay[0]["window_size"] == (0, 0) and replay[0]["causal"]
    assert capture[0]["num_splits"] == 32 and replay[0]["page_size"] == 16
    assert not confirm(failing.replace_layer(head_dim=128), "cpu")
    assert not confirm(window_zero((1,), (3, 0), head_dim=32), "cpu")
    padded = window_zero((0, 0, 0), head_dim=32)  # three requests replayed at size 4
    fa3_planner.clear()
    assert confirm(padded, "cpu")
    assert [c["cache_seqlens"].tolist() for c in fa3_planner] == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert fa3_planner[0]["cu_seqlens_q"].tolist() == [0, 1, 2, 3, 3]


@pytest.mark.parametrize("builder,kernel", [(3, 3), (3, 2), (2, 3), (4, 4)])
def test_the_vllm_graph_window_confirmation_confirms_only_where_both_plan_and_kernel_are_fa3(
    monkeypatch, builder, kernel
):
    """The builder plans ahead only on FA3 (get_flash_attn_version()), and only an FA3 kernel (the
    layer's get_flash_attn_version(head_size)) reads the plan; without vLLM's FA3 nothing confirms."""
    from types import SimpleNamespace

    from harness.checks import engine_confirm

    modules = {
        "vllm.vllm_flash_attn": SimpleNamespace(get_scheduler_metadata=fa3_plan_size),
        "vllm.v1.attention.backends.fa_utils": SimpleNamespace(
            get_flash_attn_version=lambda head_size=0: kernel if head_size else builder
        ),
        "vllm.config": SimpleNamespace(
            AttentionConfig=lambda: SimpleNamespace(flash_attn_max_num_splits_for_cuda_graph=32)
        ),
    }
    failing = window_zero((0,), head_dim=32)
    monkeypatch.setattr(engine_confirm, "library", modules.get)
    assert engine_confirm.vllm_fa3_graph_window_metadata(failing, "cpu") is (builder == kernel == 3)
    monkeypatch.setattr(engine_confirm, "library", lambda name: None)
    assert not engine_confirm.vllm_fa3_graph_window_metadata(failing, "cpu")


H200_CROSS = Case(  # the CROSS case that crashed sglang_fa3 on an H200: 33 + 18 columns, rows of 46
    mode="CROSS", requests=(Request(0, 13, 33), Request(0, 13, 33), Request(0, 13, 33), Request(0, 18, 18))
)
PAGES, TEXT = "sglang-fa3-cross-page-table", "sglang-fa3-cross-text-table"


@pytest.mark.parametrize(
    "issue_id,name,case,reached",
    [
        (PAGES, "sglang_fa3", Case(mode="CROSS", requests=(Request(0, 1, 20),)), True),  # pages of 16
        # pages of one token: a slot is its page
        (PAGES, "sglang_fa3", Case(mode="CROSS", requests=(Request(0, 1, 20),), page_size=1), False),
        (PAGES, "sglang_fa3", Case(mode="EXTEND", requests=(Request(20, 1),)), False),  # self-attention
        (PAGES, "sglang_flashinfer", Case(mode="CROSS", requests=(Request(0, 1, 20),)), False),  # not FA3's
        (TEXT, "sglang_fa3", H200_CROSS, True),
        (TEXT, "sglang_fa3", H200_CROSS.replace(page_size=1), True),  # a gather of token slots: any page size
        # a cached decoder text counts in max_seq_len_k as the new tokens do: 33 + (4 + 14) > 46
        (TEXT, "sglang_fa3", H200_CROSS.replace(requests=(Request(0, 13, 33), Request(4, 14, 18))), True),
        # exactly at the row: 33 + 13 = 46 reads column 45
        (TEXT, "sglang_fa3", H200_CROSS.replace(requests=(Request(0, 13, 33), Request(0, 13, 18))), False),
        # the longer text's request holds the longest encoder too: 33 + 18 = its own row of 51
        (TEXT, "sglang_fa3", H200_CROSS.replace(requests=(Request(0, 13, 18), Request(0, 18, 33))), False),
        (TEXT, "sglang_fa3", Case(mode="EXTEND", requests=(Request(0, 13), Request(0, 18))), False),
        (TEXT, "sglang_flashinfer", H200_CROSS, False),  # not FA3's plan
    ],
)
@pytest.mark.parametrize("release", ["0.5.17", "0.5.23"])
def test_fa3s_cross_issues_reach_their_cases(issue_id, name, case, reached, release, monkeypatch):
    """sglang-fa3-cross-page-table: FA3's cross cases on pages above one; sglang-fa3-cross-text-table:
    FA3's cross batches where a request's encoder plus the longest text passes the row."""
    monkeypatch.setattr(known_issues, "distribution_version", lambda dist: release)
    found = [issue.id for issue, _ in known_issues.reaching_issues(name, case)]
    assert (issue_id in found) == reached


def test_a_crash_of_a_cross_batch_past_its_row_is_the_text_table_entrys_alone(version, monkeypatch):
    """The H200's case reaches both FA3 cross entries (pages of 16): where both confirm, a wrong output
    is excused by the page-table entry (the first), a crash only by the text-table entry (it faults)."""
    version("0.5.17")
    found = [issue.id for issue, _ in known_issues.reaching_issues("sglang_fa3", H200_CROSS)]
    assert found == [PAGES, TEXT]
    both = [dataclasses.replace(i, confirm=lambda c, d: True) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(both))
    wrong = known_issues.excuse("sglang_fa3", H200_CROSS, "err", "cuda")
    crash = known_issues.excuse("sglang_fa3", H200_CROSS, "raised", "cuda", crashed=True)
    assert wrong[0] and "known issue sglang-fa3-cross-page-table" in wrong[1]
    assert crash[0] and "known issue sglang-fa3-cross-text-table" in crash[1]


def raising_as(name: str, error: Exception):
    """The CPU reference backend under an engine's name, its run raising `error`."""
    backend = load("torch_native")
    backend.name = name

    def run(batch):
        raise error

    backend.run = run
    return backend


@pytest.mark.parametrize("confirms", [True, False])
def test_an_eager_crash_is_excused_by_a_faulting_issue_that_confirms(version, monkeypatch, confirms):
    """The numeric check's crash on a case the text-table entry reaches is an xfail where it confirms
    (its traceback kept, so an isolated worker is still retired), a crash where it does not."""
    version("0.5.17")
    stubbed = [dataclasses.replace(i, confirm=lambda c, d: confirms) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stubbed))
    res = check_case(raising_as("sglang_fa3", RuntimeError("device-side assert triggered")), H200_CROSS)
    assert res.status == ("xfail" if confirms else "crash")
    if confirms:
        assert res.reason.startswith("known issue sglang-fa3-cross-text-table")
    else:
        assert "not known issue sglang-fa3-cross-text-table" in res.reason
    assert "device-side assert triggered" in res.reason and "traceback" in res.extra


def test_a_batch_invariance_crash_is_excused_alike(version, monkeypatch):
    """The invariance check's crash (a composition that raised) on a case the entry reaches and confirms
    is an xfail too, its traceback kept."""
    from harness.checks.invariance import invariance_result

    version("0.5.17")
    stubbed = [dataclasses.replace(i, confirm=lambda c, d: True) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stubbed))
    backend = raising_as("sglang_fa3", RuntimeError("device-side assert triggered"))
    res = invariance_result(backend, H200_CROSS.replace(deterministic=True), long_kv=64, long_q=16)
    assert res.status == "xfail" and res.reason.startswith("known issue sglang-fa3-cross-text-table")
    assert "traceback" in res.extra


class ExitsAsFa3Does(TorchNative):
    """sglang_fa3 whose kernel launch ends the process (FA3's CHECK_CUDA calls exit(1) on a device
    assert, as on the H200's cross case)."""

    name = "sglang_fa3"

    def run(self, batch):
        os._exit(1)


@pytest.mark.parametrize("confirms", [True, False])
def test_a_worker_a_faulting_issue_took_down_is_an_xfail_where_it_confirms(version, monkeypatch, confirms):
    """An isolated case whose worker died on a case the text-table entry reaches: xfail where the entry
    confirms (asked in the parent, the worker being gone), a crash where it does not."""
    version("0.5.17")
    stubbed = [dataclasses.replace(i, confirm=lambda c, d: confirms) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stubbed))
    runner = isolation.IsolatedRunner(timeout=30, first_timeout=120)
    try:
        res = runner.run(check_case, ExitsAsFa3Does(), H200_CROSS, "cpu")
    finally:
        runner.close()
    assert res.status == ("xfail" if confirms else "crash")
    assert "the worker process died" in res.reason
    assert res.reason.startswith("known issue sglang-fa3-cross-text-table") == confirms


def test_an_eager_crash_is_not_excused_by_a_wrong_output_issue_nor_a_broken_protocol(version, monkeypatch):
    """A crash on a case only a non-faulting entry reaches stays a crash though it confirms, and so does
    a backend that broke the protocol (ContractError) on a case a faulting entry reaches."""
    from harness.backends.base import ContractError

    version("0.7.2.post1")
    stubbed = [dataclasses.replace(i, confirm=lambda c, d: True) for i in known_issues.KNOWN_ISSUES]
    monkeypatch.setattr(known_issues, "KNOWN_ISSUES", tuple(stubbed))
    res = check_case(raising_as("flashinfer_ragged", RuntimeError("boom")), LONG_WINDOWED)
    assert res.status == "crash" and "known issue" not in res.reason
    version("0.5.17")
    res = check_case(raising_as("sglang_fa3", ContractError("run returned no output")), H200_CROSS)
    assert res.status == "crash" and "known issue" not in res.reason


@pytest.mark.parametrize("issue", known_issues.KNOWN_ISSUES, ids=lambda i: i.id)
def test_every_issue_answers_on_the_paths_it_names(issue):
    """An entry's predicate takes a Case where it is on_eager and a GraphCase where it is on_replay: a
    graph-only predicate asked about an eager case (or the reverse) raises inside the check instead."""
    assert issue.on_eager or issue.on_replay
    soft = Case(mode="DECODE", requests=(Request(3, 1),), window_left=0, soft_cap=5.0)
    if issue.on_eager:
        assert issue.reaches(soft) in (True, False)
    if issue.on_replay:
        assert issue.reaches(GraphCase((soft, soft), 1, 8)) in (True, False)


# A soft cap of 30 at queries of amplitude 30 (float16), given to forward() only.
CAPPED_DECODE = Case(
    mode="DECODE",
    requests=(Request(62, 1),) * 3,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    dtype="float16",
    soft_cap=30.0,
    q_amplitude=30.0,
    page_size=16,
    page_layout="interleaved",
    seed=1179,
)
# The catalogue's chunk_over_window: a chunk of new tokens wider than the window, after a prefix.
CHUNK_OVER_WINDOW = Case(
    mode="EXTEND",
    requests=(Request(40, 30), Request(3, 20)),
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    window_left=7,
    page_size=16,
)
# The FP8 prefix case sglang_flashinfer failed (err 123 against 0.0425): one cached token, one new,
# V written at a scale of 0.0173 and read back unscaled.
FP8_PREFIX = Case(
    mode="EXTEND",
    requests=(Request(1, 1),),
    num_q_heads=4,
    num_kv_heads=4,
    head_dim=64,
    dtype="bfloat16",
    window_left=28,
    page_size=16,
    kv_dtype="float8_e4m3fn",
    k_scale=1.0,
    v_scale=0.0173,
)


def issue(issue_id: str) -> known_issues.KnownIssue:
    (found,) = [i for i in known_issues.KNOWN_ISSUES if i.id == issue_id]
    return found


@pytest.fixture
def forward_cap_applied(monkeypatch):
    """The FlashInfer fake, installed, as a FlashInfer would be whose forward() cap and window reach the
    kernel whatever plan() compiled: where sglang's calls are right."""
    fake.install(monkeypatch)
    monkeypatch.setattr(fake._Variant, "_run_cap", lambda self: self._logits_soft_cap)
    monkeypatch.setattr(
        fake._Variant, "_run_window", lambda self, w: self._window_left if self._window_left >= 0 else None
    )


def wrong_as_sglang_flashinfer(mutant: str):
    backend = by_name(mutant).make()
    backend.name = "sglang_flashinfer"
    return backend


def test_the_soft_cap_issue_reaches_soft_capped_forwards_of_every_mode_but_a_verify_tree():
    reaches = issue("sglang-flashinfer-soft-cap").reaches
    assert reaches(CAPPED_DECODE)
    assert not reaches(CAPPED_DECODE.replace(soft_cap=0.0))
    assert reaches(CAPPED_DECODE.replace(mode="EXTEND", requests=(Request(8, 6),)))
    chain, tree = Request(8, 3, tree=(-1, 0, 1)), Request(8, 3, tree=(-1, 0, 0))
    assert reaches(CAPPED_DECODE.replace(mode="TARGET_VERIFY", requests=(chain,)))
    assert not reaches(CAPPED_DECODE.replace(mode="TARGET_VERIFY", requests=(tree,)))


def test_the_ragged_window_issue_reaches_a_chunk_wider_than_the_window_off_the_deterministic_path():
    reaches = issue("sglang-flashinfer-ragged-window").reaches
    assert reaches(CHUNK_OVER_WINDOW)
    assert reaches(CHUNK_OVER_WINDOW.replace(requests=(Request(0, 9),)))  # W + 2 new tokens
    assert not reaches(CHUNK_OVER_WINDOW.replace(requests=(Request(40, 8),)))  # W + 1: all in the window
    assert not reaches(CHUNK_OVER_WINDOW.replace(deterministic=True))  # paged only, window planned
    assert not reaches(CHUNK_OVER_WINDOW.replace(window_left=-1))
    assert not reaches(CHUNK_OVER_WINDOW.replace(mode="DECODE", requests=(Request(40, 1),)))


def test_the_soft_cap_confirmation_is_right_where_flashinfer_is_and_says_where_it_is_not(monkeypatch):
    fake.install(monkeypatch)
    assert engine_confirm.sglang_flashinfer_soft_cap(CAPPED_DECODE, "cpu")
    assert fake.calls("ragged.init")[-1]["backend"] == "fa2"  # sglang's decode wrappers' backend
    assert engine_confirm.sglang_flashinfer_soft_cap(CAPPED_DECODE.replace(mode="EXTEND"), "cpu")
    assert fake.calls("ragged.init")[-1]["backend"] == "auto"  # its ragged wrapper's
    assert not engine_confirm.sglang_flashinfer_soft_cap(CAPPED_DECODE.replace(soft_cap=0.0), "cpu")
    fp8 = CAPPED_DECODE.replace(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=0.0173)
    assert engine_confirm.sglang_flashinfer_soft_cap(fp8, "cpu")  # judged on its model-dtype twin


def test_the_soft_cap_confirmation_confirms_nothing_where_a_forward_cap_is_applied(forward_cap_applied):
    assert not engine_confirm.sglang_flashinfer_soft_cap(CAPPED_DECODE, "cpu")


def test_the_ragged_window_confirmation_is_right_where_flashinfer_is_and_says_where_it_is_not(monkeypatch):
    fake.install(monkeypatch)
    assert engine_confirm.sglang_flashinfer_ragged_window(CHUNK_OVER_WINDOW, "cpu")
    no_prefix = CHUNK_OVER_WINDOW.replace(requests=(Request(0, 30),))  # forward() given no window at all
    assert engine_confirm.sglang_flashinfer_ragged_window(no_prefix, "cpu")
    drafts = CHUNK_OVER_WINDOW.replace(mode="DRAFT_EXTEND_V2", requests=(Request(40, 4),), window_left=1)
    assert engine_confirm.sglang_flashinfer_ragged_window(drafts, "cpu")
    inside = CHUNK_OVER_WINDOW.replace(requests=(Request(40, 8), Request(3, 5)))
    assert not engine_confirm.sglang_flashinfer_ragged_window(inside, "cpu")


def test_the_ragged_window_confirmation_confirms_nothing_where_a_forward_window_applies(forward_cap_applied):
    assert not engine_confirm.sglang_flashinfer_ragged_window(CHUNK_OVER_WINDOW, "cpu")


def test_under_a_graph_the_soft_cap_issue_reaches_and_confirms_on_a_replayed_batch(monkeypatch):
    fake.install(monkeypatch)
    issue_ = issue("sglang-flashinfer-soft-cap-replay")
    g = GraphCase((CAPPED_DECODE, CAPPED_DECODE.replace(requests=(Request(30, 1),))), 4, 64)
    assert issue_.on_replay and issue_.reaches(g)
    assert engine_confirm.sglang_flashinfer_soft_cap_replay(g, "cpu")
    plain = GraphCase(tuple(c.replace(soft_cap=0.0) for c in g.batches), 4, 64)
    assert not issue_.reaches(plain)
    assert not engine_confirm.sglang_flashinfer_soft_cap_replay(plain, "cpu")


def test_the_fp8_prefix_issue_reaches_a_scaled_cache_under_an_extend_with_a_prefix_not_deterministic():
    reaches = issue("sglang-flashinfer-fp8-prefix-scales").reaches
    assert reaches(FP8_PREFIX)
    assert reaches(FP8_PREFIX.replace(mode="DRAFT_EXTEND_V2", k_scale=0.5, v_scale=1.0))
    assert not reaches(FP8_PREFIX.replace(v_scale=1.0))  # scales of 1: leaving them out changes nothing
    assert not reaches(FP8_PREFIX.replace(requests=(Request(0, 2),)))  # no prefix: the ragged pass alone
    assert not reaches(FP8_PREFIX.replace(deterministic=True))  # the paged-only extend passes the scales
    assert not reaches(FP8_PREFIX.replace(kv_dtype=None, v_scale=1.0))
    assert not reaches(FP8_PREFIX.replace(mode="DECODE"))


def test_the_fp8_prefix_confirmation_is_right_where_flashinfer_is_and_says_where_it_is_not(monkeypatch):
    fake.install(monkeypatch)
    assert engine_confirm.sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX, "cpu")
    (unscaled, scaled) = [c for c in fake.calls("paged.run")]
    assert unscaled["k_scale"] is None and unscaled["v_scale"] is None  # as sglang 0.5.17 calls it
    assert (scaled["k_scale"], scaled["v_scale"]) == (1.0, 0.0173)  # the control, as 0.5.18 on
    assert fake.calls("ragged.init")[-1]["backend"] == "auto"
    assert fake.calls("paged.init")[-1]["backend"] == "fa2"
    two = FP8_PREFIX.replace(requests=(Request(20, 3), Request(0, 4)), k_scale=0.5, v_scale=1.0)
    assert engine_confirm.sglang_flashinfer_fp8_prefix_scales(two, "cpu")  # K's scale alone; a prefix of 0
    assert not engine_confirm.sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX.replace(v_scale=1.0), "cpu")


def test_the_fp8_prefix_confirmation_confirms_nothing_where_the_control_is_wrong_too(monkeypatch):
    """Scales that FlashInfer dropped everywhere: the passes given the scales are wrong as well, so the
    entry's mechanism is not what is shown and nothing is confirmed."""
    fake.install(monkeypatch)
    monkeypatch.setattr(fake._Variant, "_v_scaled", staticmethod(lambda out, v_scale: out))
    assert not engine_confirm.sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX, "cpu")


def test_without_flashinfer_no_confirmation_confirms():
    assert not engine_confirm.sglang_flashinfer_soft_cap(CAPPED_DECODE, "cpu")
    assert not engine_confirm.sglang_flashinfer_ragged_window(CHUNK_OVER_WINDOW, "cpu")
    assert not engine_confirm.sglang_flashinfer_fp8_prefix_scales(FP8_PREFIX, "cpu")


@pytest.mark.parametrize(
    "mutant,case,issue_id",
    [
        ("torch_native~soft_cap_missing", CAPPED_DECODE, "sglang-flashinfer-soft-cap"),
        ("torch_native~window_ignored", CHUNK_OVER_WINDOW, "sglang-flashinfer-ragged-window"),
        ("torch_native~fp8_k_scale_for_v", FP8_PREFIX, "sglang-flashinfer-fp8-prefix-scales"),
    ],
)
def test_a_failure_is_xfail_on_the_release_it_was_seen_on_only(version, monkeypatch, mutant, case, issue_id):
    fake.install(monkeypatch)
    backend = wrong_as_sglang_flashinfer(mutant)
    version("0.5.17")
    res = check_case(backend, case)
    assert res.status == "xfail", res.reason
    assert f"known issue {issue_id}" in res.reason
    version("0.5.23")  # the same code, not yet seen on a GPU: a failure there counts
    assert check_case(backend, case).status == "fail"


def test_a_glue_failure_the_issue_reaches_counts_where_flashinfer_is_right(version, forward_cap_applied):
    version("0.5.17")
    res = check_case(wrong_as_sglang_flashinfer("torch_native~soft_cap_missing"), CAPPED_DECODE)
    assert res.status == "fail", res.reason
    assert "not known issue sglang-flashinfer-soft-cap" in res.reason


# The cases vllm_flashinfer failed and crashed on an H200 (vllm 0.26.0, flashinfer-python 0.6.18.post1),
# as their repro lines give them.
FP8_CAPPED = Case(
    mode="EXTEND",
    requests=(Request(0, 31),) * 3,
    num_q_heads=4,
    num_kv_heads=1,
    head_dim=64,
    dtype="float16",
    soft_cap=5.0,
    sm_scale=2.0,
    page_size=32,
    kv_layout="HND",
    q_amplitude=8.0,
    kv_dtype="float8_e4m3fn",
    k_scale=0.0173,
    v_scale=3.7,
    seed=34591,
)
E5M2_PREFIX = Case(
    mode="EXTEND",
    requests=(Request(89, 38),),
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    dtype="float16",
    page_size=32,
    q_amplitude=8.0,
    kv_dtype="float8_e5m2",
    k_scale=0.5,
    v_scale=3.7,
    seed=609178,
)


def test_the_vllm_fp8_prefill_entries_reach_the_requests_vllm_prefills_over_their_cache():
    """vLLM casts only its prefill requests' queries (one new token each is a decode, in the batch's
    order), so a batch of decodes reaches neither entry; the cap entry needs a cap, the e5m2 one e5m2."""
    cap, e5m2 = issue("flashinfer-fa3-fp8-prefill-soft-cap"), issue("vllm-flashinfer-e5m2-query")
    assert cap.reaches(FP8_CAPPED) and not cap.reaches(FP8_CAPPED.replace(soft_cap=0.0))
    assert not cap.reaches(FP8_CAPPED.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0))
    assert e5m2.reaches(E5M2_PREFIX) and not e5m2.reaches(E5M2_PREFIX.replace(kv_dtype="float8_e4m3fn"))
    decodes = (Request(5, 1), Request(9, 1))
    for entry, case in ((cap, FP8_CAPPED), (e5m2, E5M2_PREFIX)):
        assert not entry.reaches(case.replace(mode="DECODE", requests=decodes))
        assert not entry.reaches(case.replace(requests=decodes))  # an EXTEND of one-token requests
        assert entry.reaches(case.replace(requests=(Request(5, 1), Request(9, 3))))  # 9 + 3 is a prefill
        chain, tree = (-1, 0, 1), (-1, 0, 0)
        assert entry.reaches(case.replace(mode="TARGET_VERIFY", requests=(Request(5, 3, tree=chain),)))
        assert not entry.reaches(case.replace(mode="TARGET_VERIFY", requests=(Request(5, 3, tree=tree),)))


def fp8_cap_dropped(monkeypatch) -> None:
    """The FlashInfer fake with the fa3 FP8 prefill's bug: a paged run on FP8 queries ignores the cap
    plan() compiled."""
    paged = fake.BatchPrefillWithPagedKVCacheWrapper
    run = paged.run

    def buggy(self, q, *args, **rest):
        self._cap_module = self._cap_module and q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2)
        return run(self, q, *args, **rest)

    monkeypatch.setattr(paged, "run", buggy)


@pytest.mark.parametrize("dropped", [True, False])
def test_the_fp8_soft_cap_entry_confirms_only_where_flashinfer_drops_the_cap(version, monkeypatch, dropped):
    """Confirmed where the capped FP8 prefill returns the uncapped one; then a failure of vllm_flashinfer
    on the case is excused on 0.6.18.post1 only. With the cap applied nothing is confirmed, and off
    Hopper (where vLLM prefills unquantized queries) nothing is asked."""
    from harness.checks import flashinfer_confirm

    fake.install(monkeypatch)
    if dropped:
        fp8_cap_dropped(monkeypatch)
    monkeypatch.setattr(flashinfer_confirm, "hopper", lambda device: True)
    assert flashinfer_confirm.fa3_fp8_prefill_soft_cap(FP8_CAPPED, "cpu") is dropped
    # a cap far above every logit moves the attention less than the FP8 prefill's own error: not shown
    assert not flashinfer_confirm.fa3_fp8_prefill_soft_cap(FP8_CAPPED.replace(soft_cap=1e5), "cpu")
    version("0.6.18.post1")
    excused, reason = known_issues.excuse("vllm_flashinfer", FP8_CAPPED, "err", "cpu")
    assert excused is dropped and "flashinfer-fa3-fp8-prefill-soft-cap" in reason
    version("0.7.2.post1")
    assert not known_issues.excuse("vllm_flashinfer", FP8_CAPPED, "err", "cpu")[0]
    monkeypatch.setattr(flashinfer_confirm, "hopper", lambda device: False)
    assert not flashinfer_confirm.fa3_fp8_prefill_soft_cap(FP8_CAPPED, "cpu")


def vllm_flashinfer_module(cast: torch.dtype | None):
    """vLLM's FlashInfer backend module as far as the e5m2 confirmation reads it, on Hopper: the
    builder plans queries of the cache's dtype; the layer casts them to `cast` (0.26.0's
    scaled_fp8_quant: always e4m3), or to the planned dtype where `cast` is None."""

    class FlashInferMetadataBuilder:
        def get_q_data_type(self, is_prefill: bool) -> torch.dtype:
            assert is_prefill and not self.vllm_config.attention_config.disable_flashinfer_q_quantization
            return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[self.cache_dtype]

    class FlashInferImpl:
        def maybe_quant_query(self, query, q_data_type, scale):
            return query if query.dtype == q_data_type else query.to(cast or q_data_type)

    return SimpleNamespace(FlashInferMetadataBuilder=FlashInferMetadataBuilder, FlashInferImpl=FlashInferImpl)


@pytest.mark.parametrize("fixed", [False, True])
def test_an_e5m2_prefill_crash_is_excused_where_vllm_casts_its_queries_to_another_dtype(
    version, monkeypatch, fixed
):
    """vLLM 0.26.0's cast (e4m3 whatever the plan) confirms on the e5m2 case and not on its e4m3 twin,
    and the crash it causes is an xfail; with the cast to the planned dtype it is a crash."""
    module = vllm_flashinfer_module(None if fixed else torch.float8_e4m3fn)
    monkeypatch.setattr(engine_confirm, "library", lambda name: module)
    assert engine_confirm.vllm_flashinfer_e5m2_query(E5M2_PREFIX, "cpu") is not fixed
    assert not engine_confirm.vllm_flashinfer_e5m2_query(E5M2_PREFIX.replace(kv_dtype="float8_e4m3fn"), "cpu")
    version("0.26.0")
    refused = ValueError("The dtype of q torch.float8_e4m3fn does not match the q_data_type float8_e5m2")
    res = check_case(raising_as("vllm_flashinfer", refused), E5M2_PREFIX)
    assert res.status == ("crash" if fixed else "xfail"), res.reason
    assert ("not known issue" in res.reason) is fixed and "vllm-flashinfer-e5m2-query" in res.reason
