"""`check --shard I/N`: the deal of tests to CI runners."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.run import ci_shards
from harness.run.speed.costs import DEFAULT_SECONDS


@pytest.mark.parametrize("text,want", [("1/1", (1, 1)), ("3/4", (3, 4)), ("4/4", (4, 4))])
def test_parse_counts_from_one(text, want):
    assert ci_shards.parse(text) == want


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "a/b", "1", "1/2/3", ""])
def test_parse_refuses_a_malformed_share_in_one_line(text):
    with pytest.raises(ci_shards.ShareError, match="expected I/N with integers 1 <= I <= N"):
        ci_shards.parse(text)


tests_st = st.lists(
    st.tuples(st.text("abcdef", min_size=1, max_size=6), st.sampled_from([None, "torch_native", "fa4", "x"])),
    unique_by=lambda t: t[0],
    max_size=40,
)


@given(tests=tests_st, count=st.integers(1, 9))
def test_every_test_lands_in_exactly_one_share(tests, count):
    dealt = ci_shards.deal(ci_shards.item_costs(tests), count)
    assert set(dealt) == {t for t, _ in tests}
    assert all(1 <= s <= count for s in dealt.values())


@given(tests=tests_st, count=st.integers(1, 9))
def test_the_deal_does_not_depend_on_the_order_tests_were_collected(tests, count):
    forward = ci_shards.deal(ci_shards.item_costs(tests), count)
    backward = ci_shards.deal(ci_shards.item_costs(list(reversed(tests))), count)
    assert forward == backward


@given(costs=st.dictionaries(st.text("xyz", min_size=1, max_size=5), st.floats(0, 100), max_size=30),
       count=st.integers(1, 6))
def test_shares_differ_by_at_most_the_costliest_test(costs, count):
    dealt = ci_shards.deal(costs, count)
    loads = [sum(c for t, c in costs.items() if dealt[t] == s) for s in range(1, count + 1)]
    assert max(loads) - min(loads) <= max(costs.values(), default=0) + 1e-9


def test_a_backend_costs_its_shipped_seconds_spread_over_its_tests():
    tests = [("a", "torch_native"), ("b", "torch_native"), ("c", None), ("d", "nobody")]
    costs = ci_shards.item_costs(tests)
    assert costs["a"] == costs["b"] == DEFAULT_SECONDS["torch_native"] / 2
    assert costs["c"] == 1.0 and costs["d"] == ci_shards.UNKNOWN_SECONDS


def test_a_measured_table_wins_per_test_then_per_backend():
    tests = [("a", "torch_native"), ("b", "torch_native")]
    costs = ci_shards.item_costs(tests, {"a": 7.0, "torch_native": 10.0})
    assert costs == {"a": 7.0, "b": 5.0}


def test_costs_read_from_a_results_file_or_a_plain_table(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"run": {"test_s": {"t1": 2.5}}, "results": []}))
    assert ci_shards.load_costs(results) == {"t1": 2.5}
    plain = tmp_path / "costs.json"
    plain.write_text(json.dumps({"fa4": 30}))
    assert ci_shards.load_costs(plain) == {"fa4": 30.0}


@pytest.mark.parametrize("text", ["[1, 2]", '{"a": "slow"}', '{"a": -1}', '{"a": true}', "{"])
def test_a_bad_cost_table_is_one_line(tmp_path, text):
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(ci_shards.ShareError, match=r"--costs .*costs.json"):
        ci_shards.load_costs(path)


def test_the_key_names_the_profile_and_the_selection_not_its_order():
    assert ci_shards.key(["a", "b"], "gpu") == ci_shards.key(["b", "a"], "gpu")
    assert ci_shards.key(["a", "b"], "gpu") != ci_shards.key(["a", "b"], "ci")
    assert ci_shards.key(["a", "b"], "gpu") != ci_shards.key(["a"], "gpu")
    assert ci_shards.key(["ab"], "gpu") != ci_shards.key(["a", "b"], "gpu")
