"""The strategies reach the shapes where bugs live."""

import pytest
from hypothesis import find, settings

from harness.backends import load
from harness.core.modes import FAMILIES, Mode, tree_depths
from harness.search.profiles import SIZES
from harness.search.strategies import cases

CAPS = load("torch_native").capabilities
S = SIZES["ci"]
FIND = settings(max_examples=2000, database=None, deadline=None)


def reach(family, windowed, cond):
    return find(cases(family, windowed, CAPS, S), cond, settings=FIND)


def test_window_binds_inside_a_fresh_extend():
    c = reach("prefill", True, lambda c: any(r.extend_len > c.window_left + 1 for r in c.requests))
    assert c.window_left >= 0


def test_window_binds_on_the_prefix():
    reach("prefix", True, lambda c: any(r.prefix_len > c.window_left + 1 for r in c.requests))
    reach("decode", True, lambda c: any(r.prefix_len > c.window_left + 1 for r in c.requests))


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
