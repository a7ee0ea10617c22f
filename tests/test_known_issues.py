"""A known library bug is an expected failure on the versions it names, and only there."""

import dataclasses

import pytest

from harness.backends import load
from harness.checks import known_issues
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.core.results import summary_table
from harness.mutants import by_name
from harness.report import junit
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
        # the suite's sglang_flashinfer records on the H200 (docs/engines.md); 0.5.23 reads the same
        "sglang-flashinfer-soft-cap": {"0.5.17"},
        "sglang-flashinfer-soft-cap-replay": {"0.5.17"},  # the same code path, planned for a graph
        "sglang-flashinfer-ragged-window": {"0.5.17"},
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
    fake.install(monkeypatch)
    ragged = fake.BatchPrefillWithRaggedKVCacheWrapper
    run = ragged.run

    def buggy(self, q, k, v, *args, **rest):
        out = run(self, q, k, v, *args, **rest)
        return out * 0 if float(q.float().abs().max()) > 256 else out

    monkeypatch.setattr(ragged, "run", buggy)


def test_the_far_negative_prefill_issue_reaches_prefill_rows_far_below_zero_only():
    (issue,) = [i for i in known_issues.KNOWN_ISSUES if i.id == "flashinfer-prefill-far-negative-logits"]
    assert issue.reaches(FAR_NEGATIVE)
    assert not issue.reaches(FAR_NEGATIVE.replace(logit_offset=-120.0))  # every release is right there
    assert issue.reaches(FAR_NEGATIVE.replace(logit_offset=-121.0))  # just past it
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


def test_a_far_negative_failure_is_xfail_on_its_release_only_where_the_library_is_wrong_too(
    version, monkeypatch, flashinfer_far_negative_bug
):
    version("0.6.18.post1")
    backend = wrong_as("flashinfer_paged")
    case = FAR_NEGATIVE.replace(mode="ENCODER_ONLY", requests=(Request(0, 12),))
    res = check_case(backend, case)
    assert res.status == "xfail", res.reason
    assert "known issue flashinfer-prefill-far-negative-logits" in res.reason
    version("0.7.2.post1")
    assert check_case(backend, case).status == "fail"


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
