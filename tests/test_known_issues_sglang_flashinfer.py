"""sglang's FlashInferAttnBackend: a soft cap given to forward() only, a ragged prefill planned without
its window, and a cached FP8 prefix read without its scales, are expected failures of sglang_flashinfer
on the release they were seen on, where FlashInfer called as sglang calls it is wrong on the case too
(the FlashInfer fake computes what plan() compiled). The cases are those sglang_flashinfer failed on an
H200 (sglang 0.5.17, flashinfer-python 0.6.18.post1), as their repro lines give them;
tests/test_flashinfer_gpu.py judges them with FlashInfer itself."""

import pytest

from harness.checks import engine_confirm, known_issues
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase
from harness.mutants import by_name
from tests import flashinfer_fake as fake

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
def version(monkeypatch):
    def installed(v):
        monkeypatch.setattr(known_issues, "distribution_version", lambda dist: v)
        monkeypatch.setattr(known_issues, "_CONFIRMED", {})

    return installed


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
