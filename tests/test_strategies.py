"""The strategies reach the shapes where bugs live, and draw the coincidences between dimensions
(where kernels take special paths) often."""

import importlib.util
import sys
from functools import cache

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from harness.backends import load
from harness.core.batch import kv_len
from harness.core.case import Case
from harness.core.logits import PATTERNS
from harness.core.modes import FAMILIES, Mode, tree_depths
from harness.search.profiles import SIZES
from harness.search.strategies import cases, tile_edges
from references.masks import case_masks

CAPS = load("torch_native").capabilities
S = SIZES["ci"]
FIND = settings(max_examples=2000, database=None, deadline=None)


def reach(family, windowed, cond):
    return find(cases(family, windowed, CAPS, S), cond, settings=FIND)


def binds(c: Case, length) -> bool:
    """A real window (W >= 0) that some request's `length` exceeds by more than its W + 1 keys."""
    return c.window_left >= 0 and any(length(r) > c.window_left + 1 for r in c.requests)


def test_window_binds_inside_a_fresh_extend():
    reach("prefill", True, lambda c: binds(c, lambda r: r.extend_len))


def test_window_binds_on_the_prefix():
    reach("prefix", True, lambda c: binds(c, lambda r: r.prefix_len))
    reach("decode", True, lambda c: binds(c, lambda r: r.prefix_len))


def test_page_boundary_lengths():
    reach(
        "prefix",
        False,
        lambda c: (
            c.page_size > 1
            and any(
                (r.prefix_len + r.extend_len) % c.page_size in (0, 1, c.page_size - 1) for r in c.requests
            )
        ),
    )


@pytest.mark.parametrize("family", ["prefix", "decode", "draft_extend_v2", "verify"])
def test_empty_prefix_and_single_requests(family):
    reach(family, False, lambda c: c.batch_size == 1)
    reach(family, False, lambda c: any(r.prefix_len == 0 for r in c.requests) and c.batch_size > 1)


def test_trees_with_topk_above_one():
    def branching(c):
        return any(len(r.tree) != len(set(p for p in r.tree if p >= 0)) + 1 for r in c.requests)

    c = reach("verify", True, lambda c: branching(c) and max(tree_depths(c.requests[0].tree)) >= 2)
    assert c.mode == Mode.TARGET_VERIFY


def test_extreme_logits_and_features():
    reach("prefix", True, lambda c: c.q_amplitude >= 30)
    reach("prefix", True, lambda c: c.hybrid_swa_pool and c.sinks and c.soft_cap > 0)
    reach("prefix", False, lambda c: c.deterministic and c.kv_layout == "HND")
    reach("cross", False, lambda c: c.requests[0].prefix_len == 0 and c.requests[0].extend_len > 1)
    reach("cross", False, lambda c: c.requests[0].extend_len == 1 and c.requests[0].prefix_len > 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_cases_respect_capabilities(family):
    from harness.backends.base import Capabilities

    narrow = Capabilities(
        modes=frozenset(Mode),
        dtypes=frozenset({"float16"}),
        page_sizes=frozenset({32}),
        head_dims=frozenset({64}),
    )

    @settings(max_examples=30, database=None, deadline=None)
    def check(c):
        assert c.dtype == "float16" and c.page_size == 32 and c.head_dim == 64
        assert not (c.sinks or c.soft_cap or c.hybrid_swa_pool or c.deterministic)
        assert c.kv_dtype is None and c.k_scale == c.v_scale == 1.0  # no FP8 cache declared

    from hypothesis import given

    given(cases(family, False, narrow, S))(check)()


def test_fp8_caches_with_their_own_scales_where_the_backend_reads_them():
    reach("decode", False, lambda c: c.kv_dtype == "float8_e5m2" and c.k_scale != c.v_scale)
    reach("prefix", True, lambda c: c.kv_dtype == "float8_e4m3fn" and 1.0 not in (c.k_scale, c.v_scale))


def test_unknown_family():
    with pytest.raises(ValueError, match="unknown family 'extend'"):
        find(cases("extend", False, CAPS, S), lambda c: True)


# --- coincidences between dimensions, measured over the suite's own draws -----------------------

N = 600  # cases per family, drawn as the suite draws them (hypothesis's generation, derandomized)
WITH_PREFIX = ["prefix", "decode", "draft_extend_v2", "verify"]  # keys = prefix + extend


@cache
def drawn(family: str) -> tuple[Case, ...]:
    got: list[Case] = []

    @settings(
        max_examples=N,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(family, family != "cross", CAPS, S))
    def collect(c):
        got.append(c)

    collect()
    assert len(got) == N
    return tuple(got)


def keys(c: Case) -> list[int]:
    return [kv_len(c, r) for r in range(c.batch_size)]


def rate(families, hits) -> float:
    """The fraction of True among hits(c) (one per request, pair or case) over the families' draws."""
    found = [h for f in families for c in drawn(f) for h in hits(c)]
    return sum(found) / len(found)


def square(c: Case) -> list[bool]:
    """Per request: as many queries as keys (no prefix; a CROSS decoder as long as its encoder)."""
    return [r.extend_len == k for r, k in zip(c.requests, keys(c), strict=True)]


def test_as_many_queries_as_keys_in_every_mode_that_has_both():
    """A square causal block and no paged pass (or a square cross block), a prefix as long as the
    extend, and a CROSS prefill as long as its encoder. Measured without the bias: 7%, 4% and 7% of
    requests, mostly hypothesis's own small values."""
    families = WITH_PREFIX + ["cross"]
    each = {f: round(rate([f], square), 3) for f in families}
    assert min(each.values()) >= 0.05 and rate(families, square) >= 0.13, each
    assert rate(WITH_PREFIX, lambda c: [r.prefix_len == r.extend_len for r in c.requests]) >= 0.10
    assert rate(["cross"], lambda c: [r.extend_len == r.encoder_len > 1 for r in c.requests]) >= 0.10


def test_requests_of_equal_lengths_side_by_side():
    """Neighbours in a batch with the same prefix, extend and encoder lengths: 10% without the bias."""

    def alike(c: Case) -> list[bool]:
        lengths = [(r.prefix_len, r.extend_len, r.encoder_len) for r in c.requests]
        return [a == b for a, b in zip(lengths, lengths[1:])]

    assert rate(FAMILIES, alike) >= 0.20


@pytest.mark.parametrize(("tile", "least"), [(32, 0.17), (64, 0.10), (128, 0.06)])
def test_key_counts_at_tile_multiples_and_one_either_side(tile, least):
    """Without the bias (the page-size anchors only): 8%, 3% and 2% of requests. The ci profile's
    extends and encoders stay under 64 keys, so only the prefix families reach 64 and 128."""
    families = FAMILIES if tile == 32 else WITH_PREFIX
    hi = S.max_prefix + S.max_extend
    assert rate(families, lambda c: [k in tile_edges(tile, tile - 1, hi) for k in keys(c)]) >= least


def test_a_window_at_least_as_long_as_the_context():
    """window_left >= every request's keys, where the context is longer than the profile's largest
    window: the window draw alone never reaches that (0 cases without the bias)."""

    def covers(c: Case) -> list[bool]:
        return [c.window_left >= max(keys(c)) > S.max_window]

    each = {f: round(rate([f], covers), 3) for f in WITH_PREFIX}
    assert min(each.values()) >= 0.015 and rate(WITH_PREFIX + ["prefill"], covers) >= 0.015, each


@pytest.mark.parametrize("profile", [*SIZES, "mutant"])
def test_profiles_leave_the_repro_to_the_harness(profile):
    """A failure prints its own repro command: no @reproduce_failure blob, and no explain phase (it
    reruns the failing case many times to point at harness lines that only a failure runs)."""
    chosen = settings.get_profile(profile)
    assert chosen.print_blob is False and Phase.explain not in chosen.phases
    assert Phase.generate in chosen.phases and Phase.shrink in chosen.phases


def test_a_modules_constants_do_not_change_the_draws(tmp_path, monkeypatch):
    """Hypothesis reads constants from the source of modules outside site-packages (a plugin, a
    checkout) and mixes them into its draws; a fixed-seed profile must draw the same cases with or
    without such a module loaded."""

    def first_cases() -> list[Case]:
        got: list[Case] = []

        @settings(max_examples=150, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
        @given(cases("prefix", True, CAPS, S))
        def collect(c):
            got.append(c)

        collect()
        return got

    without = first_cases()
    plugin = tmp_path / "constant_laden_plugin.py"
    plugin.write_text("".join(f"C{i} = {v}\n" for i, v in enumerate(range(3, 400, 7))))
    spec = importlib.util.spec_from_file_location("constant_laden_plugin", plugin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "constant_laden_plugin", module)  # loaded while drawing
    assert first_cases() == without


# --- the value space's extremes, measured over the suite's own draws ----------------------------


def test_each_logit_pattern_is_drawn():
    """Each pattern (harness/core/logits.py) in about one case of fourteen over every family (FP8
    cases stay plain): none without the draw, where every case was plain."""
    each = {p: round(rate(FAMILIES, lambda c, p=p: [c.logits == p]), 3) for p in PATTERNS if p != "plain"}
    assert min(each.values()) >= 0.05, each


def test_rows_far_above_and_far_below_zero():
    """Every logit of a row past exp's float32 range (above 88.7, below -103.3) in either direction,
    and below every finite mask sentinel (-1e4): none without the patterns (the ordinary logits of
    the ci profile stay within a few hundred of 0, and a row's spread with them)."""
    for sign in (-1, 1):
        far = rate(FAMILIES, lambda c, sign=sign: [c.logits != "plain" and sign * c.logit_offset > 103.3])
        assert far >= 0.04, (sign, far)
    assert rate(FAMILIES, lambda c: [c.logit_offset <= -1e4]) >= 0.015


def test_the_gpu_profile_draws_the_extremes_too():
    gpu = SIZES["gpu"]
    for cond in (
        lambda c: c.logits == "dominant" and c.logit_offset <= -1e4,
        lambda c: c.logits == "ties",
        lambda c: c.logits == "offset" and c.logit_offset < 0,
        lambda c: (c.sm_scale or 0) >= 2 and c.soft_cap > 0,
    ):
        find(cases("prefix", True, CAPS, gpu), cond, settings=FIND)


def test_rows_of_one_key():
    """A query that sees exactly one key, in every family: a fresh request's first token, an empty
    cache's decode step, a window of 0, a one-token encoder input. The lengths and windows draw them
    without a bias of their own: from 24% of cases (prefix, encoder) to all (prefill)."""

    def one_key(c: Case) -> list[bool]:
        return [any(bool((m.dense().sum(-1) == 1).any()) for m in case_masks(c))]

    each = {f: round(rate([f], one_key), 3) for f in FAMILIES}
    assert min(each.values()) >= 0.15, each


def test_a_large_softmax_scale_with_and_without_a_soft_cap():
    """sm_scale 2.0 (16 times the default's spread at head_dim 64), capped or not: none without it
    (the largest scale drawn was 0.3)."""
    for capped in (False, True):
        got = rate(FAMILIES, lambda c, capped=capped: [(c.sm_scale or 0) >= 2 and (c.soft_cap > 0) == capped])
        assert got >= 0.04, (capped, got)
