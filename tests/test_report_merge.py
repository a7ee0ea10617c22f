"""The merge of a split check's shares, and tonight's verdicts against the last run's."""

import json

import pytest

from harness.report import merge, results_json, trend


def _record(status: str, test: str, backend: str = "torch_native") -> dict:
    return {
        "status": status,
        "backend": backend,
        "device": "cpu",
        "family": "decode",
        "mode": "DECODE",
        "features": [],
        "reason": None,
        "test_id": test,
    }


def _share(tmp_path, index: int, count: int, records: list, *, key: str = "k1", code: int = 0, env=None):
    run = {"id": f"run{index}", "started": f"2026-11-28T0{index}:00:00+0000", "elapsed_s": 10.0 * index}
    run |= {"profile": "ci", "command": "check", "exit_status": code}
    run["shard"] = {"index": index, "count": count, "key": key}
    doc = results_json.build(records, run, env or {"gpu": "H200", "flashinfer": "0.7.2"})
    path = tmp_path / f"share{index}-{key}.json"
    results_json.dump(path, doc)
    return path


def _read(*paths):
    return [merge.read_share(p) for p in paths]


def test_all_shares_merge_in_order_with_one_verdict(tmp_path):
    b = _share(tmp_path, 2, 2, [_record("fail", "t2")], code=1, env={"gpu": "H100", "flashinfer": "0.7.2"})
    a = _share(tmp_path, 1, 2, [_record("pass", "t1")])
    doc = merge.merge(_read(b, a), "attn-harness report merge")
    assert [r["test_id"] for r in doc["results"]] == ["t1", "t2"]
    assert doc["run"]["exit_status"] == 1 and doc["run"]["incomplete"] == []
    assert [s["index"] for s in doc["run"]["shares"]] == [1, 2]
    assert doc["run"]["shares"][1]["environment"]["gpu"] == "H100"
    assert doc["environment"]["flashinfer"] == "0.7.2"
    assert doc["environment"]["gpu"] == "share 1: H200; share 2: H100"
    results_json.validate(json.loads(results_json.dumps(doc)))


def test_green_shares_merge_green(tmp_path):
    doc = merge.merge(_read(_share(tmp_path, 1, 1, [_record("pass", "t1")])), "m")
    assert doc["run"]["exit_status"] == 0


def test_a_missing_share_makes_the_merge_incomplete_and_not_green(tmp_path):
    doc = merge.merge(_read(_share(tmp_path, 1, 3, [_record("pass", "t1")])), "m")
    assert doc["run"]["incomplete"] == [2, 3]
    assert doc["run"]["exit_status"] == merge.INCOMPLETE_STATUS != 0


def test_a_failing_share_keeps_its_status_when_others_are_missing(tmp_path):
    doc = merge.merge(_read(_share(tmp_path, 1, 2, [_record("fail", "t1")], code=1)), "m")
    assert doc["run"]["exit_status"] == 1


def test_a_share_given_twice_is_refused_in_one_line(tmp_path):
    a = _share(tmp_path, 1, 2, [])
    copy = tmp_path / "copy.json"
    copy.write_text(a.read_text())
    with pytest.raises(merge.MergeError, match=r"share 1/2 given twice") as e:
        merge.merge(_read(a, copy), "m")
    assert "\n" not in str(e.value)


def test_shares_of_another_check_are_refused(tmp_path):
    a = _share(tmp_path, 1, 2, [])
    other = _share(tmp_path, 2, 2, [], key="k2")
    with pytest.raises(merge.MergeError, match="share of another check"):
        merge.merge(_read(a, other), "m")


def test_shares_of_another_split_are_refused(tmp_path):
    a = _share(tmp_path, 1, 2, [])
    other = _share(tmp_path, 2, 3, [])
    with pytest.raises(merge.MergeError, match="splits into 3 shares"):
        merge.merge(_read(a, other), "m")


def test_a_results_file_of_an_unsplit_check_is_not_a_share(tmp_path):
    path = tmp_path / "plain.json"
    results_json.dump(path, results_json.build([], {"id": "x"}, {}))
    with pytest.raises(merge.MergeError, match="not a share of a split check"):
        merge.read_share(path)


@pytest.mark.parametrize("index,count", [(0, 2), (3, 2), ("1", 2)])
def test_a_share_index_out_of_range_is_refused(tmp_path, index, count):
    path = _share(tmp_path, 1, 2, [])
    doc = json.loads(path.read_text())
    doc["run"]["shard"] |= {"index": index, "count": count}
    path.write_text(json.dumps(doc))
    with pytest.raises(merge.MergeError, match="is not 1 <= I <= N"):
        merge.read_share(path)


def _doc(*records):
    return results_json.build(list(records), {}, {})


def test_trend_sorts_tests_into_new_fixed_and_still_failing():
    last = _doc(_record("pass", "a"), _record("fail", "b"), _record("crash", "c"), _record("pass", "gone"))
    tonight = _doc(_record("fail", "a"), _record("pass", "b"), _record("pass", "c"), _record("hang", "c"))
    tonight["results"].append(_record("fail", "new"))
    t = trend.compare(tonight, last)
    assert t.new_failures == ["torch_native@cpu a"]
    assert t.fixed == ["torch_native@cpu b"]
    assert t.still_failing == ["torch_native@cpu c"]
    assert (t.only_tonight, t.only_last) == (1, 1)
    assert t.line().startswith("against the last run: REGRESSED: 1 new failures, 1 fixed, 1 still failing")


def test_trend_without_new_failures_says_so():
    t = trend.compare(_doc(_record("pass", "a")), _doc(_record("fail", "a")))
    assert "no new failures" in t.line() and t.fixed == ["torch_native@cpu a"]


@pytest.mark.parametrize("status", ["fail", "error", "crash", "hang"])
def test_every_failing_status_counts_as_failing(status):
    assert trend.verdicts_by_test(_doc(_record(status, "a"))) == {"torch_native@cpu a": True}


@pytest.mark.parametrize("status", ["pass", "xfail", "skip", "refused"])
def test_statuses_that_are_not_failures_do_not_count(status):
    assert trend.verdicts_by_test(_doc(_record(status, "a"))) == {"torch_native@cpu a": False}


def test_a_share_with_nothing_to_check_is_not_a_failure(tmp_path):
    empty = _share(tmp_path, 2, 2, [], code=merge.NO_TESTS)
    doc = merge.merge(_read(_share(tmp_path, 1, 2, [_record("pass", "t1")]), empty), "m")
    assert doc["run"]["exit_status"] == 0


def test_a_share_that_collected_nothing_but_has_records_keeps_its_status(tmp_path):
    odd = _share(tmp_path, 1, 1, [_record("skip", "t1")], code=merge.NO_TESTS)
    assert merge.merge(_read(odd), "m")["run"]["exit_status"] == merge.NO_TESTS
