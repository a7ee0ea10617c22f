"""references/masks.py against hand-computed tables."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from references.masks import hf_bidirectional_window, hf_window_left, padded_visible, request_mask


def rows(mask):
    return ["".join("x" if v else "." for v in row) for row in mask.dense().tolist()]


def test_causal_with_prefix():
    # P=2, E=3: queries at positions 2, 3, 4 over keys 0..4
    assert rows(request_mask("EXTEND", 2, 3, -1)) == ["xxx..", "xxxx.", "xxxxx"]


def test_window_keeps_w_plus_one_keys():
    # W=1: itself and one before
    assert rows(request_mask("EXTEND", 2, 3, 1)) == [".xx..", "..xx.", "...xx"]
    assert rows(request_mask("EXTEND", 0, 4, 1)) == ["x...", "xx..", ".xx.", "..xx"]
    assert rows(request_mask("EXTEND", 0, 4, 0)) == ["x...", ".x..", "..x.", "...x"]


def test_window_binding_on_the_prefix_only():
    # P=6, E=2, W=2: query at 6 sees 4..6, query at 7 sees 5..7
    assert rows(request_mask("EXTEND", 6, 2, 2)) == ["....xxx.", ".....xxx"]


def test_decode_is_one_query_at_the_end():
    assert rows(request_mask("DECODE", 4, 1, 2)) == ["..xxx"]


def test_tree_verify_by_ancestry_and_depth():
    # P=2, tree: 0 root; 1,2 children of 0; 3 child of 1. depths 0,1,1,2 -> positions 2,3,3,4
    tree = (-1, 0, 0, 1)
    m = request_mask("TARGET_VERIFY", 2, 4, -1, tree=tree)
    assert m.query_pos.tolist() == [2, 3, 3, 4]
    assert rows(m) == ["xxx...", "xxxx..", "xxx.x.", "xxxx.x"]
    # W=1 by depth: node 3 (position 4) keeps positions 3..4: its parent (node 1) and itself only
    m = request_mask("TARGET_VERIFY", 2, 4, 1, tree=tree)
    assert rows(m) == [".xx...", "..xx..", "..x.x.", "...x.x"]


def test_tree_window_uses_depth_not_flattened_index():
    # A wide tree: 5 children of the root. Flattened index 5 sits at depth 1 (position P+1).
    tree = (-1, 0, 0, 0, 0, 0)
    m = request_mask("TARGET_VERIFY", 3, 6, 1, tree=tree)
    # node 5 at position 4 keeps positions 3..4 = the root (key 3) and itself (key 8)
    assert rows(m)[5] == "...x....x"


def test_cross_sees_every_encoder_key():
    m = request_mask("CROSS", 4, 2, -1, encoder_len=3)
    assert rows(m) == ["xxx", "xxx"]


def test_encoder_only_sees_its_own_tokens_both_ways():
    assert rows(request_mask("ENCODER_ONLY", 0, 4, -1)) == ["xxxx"] * 4


def test_encoder_left_window_bounds_only_the_left():
    # W=1: keys p - 1 .. the end of the request
    assert rows(request_mask("ENCODER_ONLY", 0, 5, 1)) == ["xxxxx", "xxxxx", ".xxxx", "..xxx", "...xx"]


def test_encoder_two_sided_window_bounds_both_sides():
    # (L, R) = (1, 1): keys p - 1 .. p + 1; (2, 0): a causal-looking band; (0, 2): its mirror image
    assert rows(request_mask("ENCODER_ONLY", 0, 5, 1, window_right=1)) == [
        "xx...",
        "xxx..",
        ".xxx.",
        "..xxx",
        "...xx",
    ]
    assert rows(request_mask("ENCODER_ONLY", 0, 4, 2, window_right=0)) == ["x...", "xx..", "xxx.", ".xxx"]
    assert rows(request_mask("ENCODER_ONLY", 0, 4, 0, window_right=2)) == ["xxx.", ".xxx", "..xx", "...x"]


def test_hf_bidirectional_sliding_window_is_s_on_both_sides():
    assert hf_bidirectional_window(3) == (3, 3)
    assert hf_bidirectional_window(None) == (-1, -1)


def test_hf_sliding_window_admits_s_keys():
    assert hf_window_left(4) == 3
    assert hf_window_left(None) == -1


@given(
    p=st.integers(0, 60),
    e=st.integers(1, 40),
    w=st.integers(-1, 30),
    q0=st.integers(0, 39),
    n=st.integers(1, 40),
)
def test_key_range_contains_every_visible_key(p, e, w, q0, n):
    m = request_mask("EXTEND", p, e, w)
    _assert_key_range_covers(m, q0, n)


@given(
    e=st.integers(1, 60),
    w=st.integers(-1, 30),
    r=st.integers(-1, 30),
    q0=st.integers(0, 59),
    n=st.integers(1, 60),
)
def test_encoder_key_range_contains_every_visible_key(e, w, r, q0, n):
    m = request_mask("ENCODER_ONLY", 0, e, w, window_right=r if w >= 0 else -1)
    _assert_key_range_covers(m, q0, n)


def _assert_key_range_covers(m, q0, n):
    e = m.num_queries
    q0 = min(q0, e - 1)
    q1 = min(e, q0 + n)
    lo, hi = m.key_range(q0, q1)
    vis = m.block(q0, q1, 0, m.num_keys)
    cols = torch.nonzero(vis.any(0)).flatten()
    assert cols.numel() > 0 and int(cols.min()) >= lo and int(cols.max()) < hi


def _mask(mode, p, e, w, data, encoder_len):
    """A request's mask for the property tests: windows drawn where the mode has them (the right edge
    only in ENCODER_ONLY, whose P is 0), a random tree in verify."""
    e = 1 if mode == "DECODE" else e
    tree = tuple(data.draw(st.integers(-1, j - 1)) for j in range(e)) if mode == "TARGET_VERIFY" else None
    right = data.draw(st.integers(-1, 20)) if mode == "ENCODER_ONLY" and w >= 0 else -1
    p = 0 if mode == "ENCODER_ONLY" else p
    return request_mask(mode, p, e, -1 if mode == "CROSS" else w, encoder_len, tree, right)


MODES = ["EXTEND", "DECODE", "TARGET_VERIFY", "CROSS", "ENCODER_ONLY"]


def _near(data, lo: int, hi: int, edges: set[int]) -> int:
    """An integer in [lo, hi]: anywhere, or one of `edges` or a neighbour of one."""
    near = sorted({x + d for x in edges for d in (-1, 0, 1)} & set(range(lo, hi + 1)))
    anywhere = st.integers(lo, hi)
    return data.draw(anywhere | st.sampled_from(near) if near else anywhere)


def _block(m, data) -> tuple[int, int, int, int]:
    """A block (q0, q1, k0, k1) of the mask whose key range starts or ends anywhere, or at a bound of
    the rule for its queries (the causal edge, either window edge) or one key either side: a search
    of random blocks meets an edge too rarely to see it moved by one."""
    q0 = data.draw(st.integers(0, m.num_queries - 1))
    q1 = data.draw(st.integers(q0 + 1, m.num_queries))
    pmin, pmax = int(m.query_pos[q0:q1].min()), int(m.query_pos[q0:q1].max())
    edges = {pmax - m.window_left, pmin + 1, pmin + m.window_right + 1}  # first key in, first key out
    k0 = _near(data, 0, m.num_keys - 1, edges)
    return q0, q1, k0, _near(data, k0 + 1, m.num_keys, edges)


# The rule's own search size, whatever the profile: at the ci profile's 12 examples a window bound in
# fully_visible moved by one key passed the tests below; at these it fails them.
RULE_SEARCH = settings(max_examples=300, derandomize=True, database=None)


@RULE_SEARCH
@given(st.sampled_from(MODES), st.integers(0, 40), st.integers(1, 12), st.integers(-1, 20), st.data())
def test_fully_visible_only_where_the_whole_block_is_visible(mode, p, e, w, data):
    """The reference skips masking the blocks `fully_visible` admits: it must never admit a block
    with a hidden key, and it admits every all-visible block outside verify's draft keys."""
    m = _mask(mode, p, e, w, data, p + 3)
    q0, q1, k0, k1 = _block(m, data)
    whole = bool(m.block(q0, q1, k0, k1).all())
    if m.fully_visible(q0, q1, k0, k1):
        assert whole
    elif mode != "TARGET_VERIFY" or k1 <= m.num_prefix:
        assert not whole


@RULE_SEARCH
@given(st.integers(1, 40), st.integers(-1, 8), st.integers(-1, 8), st.data())
def test_fully_visible_with_an_encoder_window(e, w, r, data):
    """The same property on encoder windows, where a block may cross either edge."""
    m = request_mask("ENCODER_ONLY", 0, e, w, window_right=r if w >= 0 else -1)
    q0, q1, k0, k1 = _block(m, data)
    assert m.fully_visible(q0, q1, k0, k1) == bool(m.block(q0, q1, k0, k1).all())


@pytest.mark.parametrize("mode", ["EXTEND", "DECODE", "ENCODER_ONLY"])
def test_fully_visible_on_every_block_of_small_windowed_requests(mode):
    """Exhaustive where a window edge is one key away: every block of every request with P <= 6,
    E <= 4 and W <= 3 (and R <= 2 in ENCODER_ONLY), so any bound moved by one shows."""
    prefixes = range(1 if mode == "ENCODER_ONLY" else 7)
    extends = range(1, 2 if mode == "DECODE" else 5)
    for p, e, w in itertools.product(prefixes, extends, range(-1, 4)):
        for r in range(-1, 3) if mode == "ENCODER_ONLY" and w >= 0 else (-1,):
            m = request_mask(mode, p, e, w, window_right=r)
            dense = m.dense()
            for q0, k0 in itertools.product(range(m.num_queries), range(m.num_keys)):
                for q1, k1 in itertools.product(
                    range(q0 + 1, m.num_queries + 1), range(k0 + 1, m.num_keys + 1)
                ):
                    whole = bool(dense[q0:q1, k0:k1].all())
                    assert m.fully_visible(q0, q1, k0, k1) == whole, (p, e, w, r, q0, q1, k0, k1)


@given(
    st.sampled_from(MODES),
    st.integers(-1, 20),
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 9)), min_size=1, max_size=5),
    st.data(),
)
def test_padded_visible_is_each_requests_dense_mask_and_hides_the_padding(mode, w, reqs, data):
    """The padded reference's mask, built on the device from positions, must be `dense()` of every
    request in its corner and hide everything else (padding queries see nothing, padding keys are
    seen by nobody): the one visibility rule in its batch form."""
    right = data.draw(st.integers(-1, 20)) if mode == "ENCODER_ONLY" and w >= 0 else -1
    masks = []
    for p, e in reqs:
        e = 1 if mode == "DECODE" else e
        tree = tuple(data.draw(st.integers(-1, j - 1)) for j in range(e)) if mode == "TARGET_VERIFY" else None
        w_mode = -1 if mode == "CROSS" else w
        masks.append(request_mask(mode, p, e, w_mode, encoder_len=p + 1, tree=tree, window_right=right))
    vis = padded_visible(masks, "cpu")
    assert vis.shape == (len(masks), max(m.num_queries for m in masks), max(m.num_keys for m in masks))
    for r, m in enumerate(masks):
        expected = torch.zeros(vis.shape[1:], dtype=torch.bool)
        expected[: m.num_queries, : m.num_keys] = m.dense()
        assert torch.equal(vis[r], expected), (r, mode, w)


def test_padded_visible_refuses_requests_with_different_windows():
    with pytest.raises(ValueError, match="share window_left"):
        padded_visible([request_mask("EXTEND", 2, 2, 1), request_mask("EXTEND", 2, 2, -1)], "cpu")
    with pytest.raises(ValueError, match="window_right"):
        one_sided, two_sided = (request_mask("ENCODER_ONLY", 0, 2, 1, window_right=r) for r in (-1, 1))
        padded_visible([one_sided, two_sided], "cpu")
