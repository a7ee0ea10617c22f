"""A check split over CI runners: `check --shard I/N` run one share after another, then `merge`,
gives exactly the records of one unsharded check over the same selection. Its parts: the deal of
tests to CI runners (`check --shard I/N`); `--harness-shard I/N`, N pytest processes splitting one
suite so that every test runs in exactly one of them; the merge of a split check's shares, and
tonight's verdicts against the last run's (trend). The CI templates under examples/ci/ parse, and
every harness command in them is a valid invocation of this command line (parsed by its own parser,
with the CI's variables filled in)."""

import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness import cli
from harness.report import merge, results_json, trend
from harness.run import ci_shards
from harness.run.speed.costs import DEFAULT_SECONDS
from tests.report_helpers import ROOT

SELECTION = ["--backend", "torch_native", "--family", "decode", "--device", "cpu"]
SHARES = 4


def _harness(*args: str, cwd: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")} | (env_extra or {})
    cmd = [sys.executable, "-m", "harness", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=900)


@cache
def _runs(tmp: Path) -> dict:
    """One unsharded check, SHARES shares (the third from $ATTN_HARNESS_SHARD), and their merge."""
    common = [*SELECTION, "--no-progress", "--reports", str(tmp / "reports")]
    out = {"full": _harness("check", *common, "--results", str(tmp / "full.json"), cwd=tmp)}
    for i in range(1, SHARES + 1):
        how = {"env_extra": {"ATTN_HARNESS_SHARD": f"{i}/{SHARES}"}} if i == 3 else {}
        shard = [] if i == 3 else ["--shard", f"{i}/{SHARES}"]
        out[i] = _harness("check", *common, *shard, "--results", str(tmp / f"s{i}.json"), cwd=tmp, **how)
    shares = [str(tmp / f"s{i}.json") for i in range(1, SHARES + 1)]
    out["merge"] = _harness("merge", *shares, "--out", str(tmp / "merged"), cwd=tmp)
    out["partial"] = _harness("merge", *shares[:-1], "--out", str(tmp / "partial"), cwd=tmp)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    return tmp, _runs(tmp)


def _records(path: Path) -> Counter:
    data = json.loads(path.read_text())
    return Counter(
        (r["backend"], r["test_id"], json.dumps(r.get("case"), sort_keys=True), r["status"], r["reason"])
        for r in data["results"]
    )


def test_every_share_and_the_merge_exit_green(runs):
    _, out = runs
    for name, proc in out.items():
        if name != "partial":
            assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-2000:])


def test_the_merged_shares_hold_exactly_the_unsharded_check_s_records(runs):
    tmp, _ = runs
    full, merged = _records(tmp / "full.json"), _records(tmp / "merged" / "results.json")
    assert sum(full.values()) > 0
    assert merged == full


def test_each_test_is_checked_by_one_share_only(runs):
    tmp, _ = runs
    tests = [{r["test_id"] for r in json.loads((tmp / f"s{i}.json").read_text())["results"]}
             for i in range(1, SHARES + 1)]
    assert sum(len(t) for t in tests) == len(set().union(*tests))


def test_each_share_says_its_part_of_the_split(runs):
    tmp, out = runs
    keys = set()
    for i in range(1, SHARES + 1):
        shard = json.loads((tmp / f"s{i}.json").read_text())["run"]["shard"]
        assert (shard["index"], shard["count"]) == (i, SHARES)
        keys.add(shard["key"])
        assert f"share {i}/{SHARES}:" in out[i].stdout
    assert len(keys) == 1


def test_a_merge_missing_a_share_is_incomplete_and_not_green(runs):
    tmp, out = runs
    assert out["partial"].returncode == 3
    page = (tmp / "partial" / "index.html").read_text()
    assert "attn-harness report: INCOMPLETE" in page and f"shares missing: {SHARES}/{SHARES}" in page


def test_a_bad_share_is_one_line_before_anything_runs(tmp_path):
    for args, needle in (
        (["--shard", "0/4"], "expected I/N with integers 1 <= I <= N"),
        (["--costs", str(tmp_path / "none.json")], "cannot read a JSON cost table"),
    ):
        proc = _harness("check", *SELECTION, *args, "--reports", str(tmp_path / "r"), cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


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


pytest_plugins = ["pytester"]

TESTS = """
import pytest

@pytest.mark.parametrize("n", range(7))
def test_a(n):
    pass

def test_b():
    pass

@pytest.mark.parametrize("n", range(3))
def test_c(n):
    pass
"""


def _collect(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest --collect-only on the generated file with the harness's plugin, in this process."""
    pytester.makepyfile(test_generated=TESTS)
    return pytester.runpytest("--collect-only", "-q", "-p", "harness.run.pytest_plugin", *args)


def _ids(result: pytest.RunResult) -> list[str]:
    assert result.ret == 0, result.outlines + result.errlines
    return [line for line in result.outlines if "::" in line]


@pytest.mark.parametrize("count", [1, 3])
def test_the_shards_of_n_partition_the_tests_and_report_the_rest_deselected(pytester, count):
    every = _ids(_collect(pytester))
    assert len(every) == 11
    shards = []
    for index in range(count):
        result = _collect(pytester, "--harness-shard", f"{index}/{count}")
        shards.append(_ids(result))
        assert shards[-1] == every[index::count]  # every Nth in collection order, from the Ith
        dropped = len(every) - len(shards[-1])
        summary = f"{len(shards[-1])}/11 tests collected ({dropped} deselected)" if dropped else "11 tests"
        assert summary in result.stdout.str()
    assert sorted(i for s in shards for i in s) == sorted(every)  # each test in exactly one shard


def test_a_shard_splits_what_k_selected(pytester):
    """After -k: the selected b, c[0], c[1], c[2] split in two, not the 11 collected ones."""
    ids = _ids(_collect(pytester, "-k", "not test_a", "--harness-shard", "1/2"))
    assert ids == ["test_generated.py::test_c[0]", "test_generated.py::test_c[2]"]


@pytest.mark.parametrize("bad", ["2", "a/2", "1/0", "2/2", "-1/2", "0/1/2", "/"])
def test_a_malformed_shard_is_a_usage_error_naming_it(pytester, bad):
    result = _collect(pytester, f"--harness-shard={bad}")
    assert result.ret == 4, result.outlines + result.errlines
    assert re.search(
        rf"ERROR: --harness-shard '{re.escape(bad)}': expected I/N .*0 <= I < N", result.stderr.str()
    )


def test_a_run_inside_this_one_leaves_no_shard_set(pytester):
    """pytester runs pytest in this process: the variant shard the inner run set must not outlive it."""
    from harness.run.speed import variant_shards

    _ids(_collect(pytester, "--harness-shard", "1/2"))
    assert variant_shards.current() == (0, 1)


MODEL_TESTS = """
import pytest

def test_a():
    pass

@pytest.mark.parametrize("model", ["gemma", "mistral"])
def test_m(model):
    pass

@pytest.mark.parametrize("n", range(2))
def test_z(n):
    pass
"""


def test_model_checks_come_first_in_each_shard_in_their_order(pytester):
    """A model check imports transformers, which re-keys dynamo's guards of every graph traced before
    it (the plugin's `_models_first`): each shard runs its model checks before its other tests."""
    pytester.makepyfile(test_generated=MODEL_TESTS)

    def names(*args: str) -> list[str]:
        ids = _ids(pytester.runpytest("--collect-only", "-q", "-p", "harness.run.pytest_plugin", *args))
        return [i.split("::")[1] for i in ids]

    assert names() == ["test_m[gemma]", "test_m[mistral]", "test_a", "test_z[0]", "test_z[1]"]
    assert names("--harness-shard=0/2") == ["test_m[mistral]", "test_a", "test_z[1]"]  # collected a, m, z


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


GITHUB = ROOT / "examples" / "ci" / "github-actions.yml"
BUILDKITE = ROOT / "examples" / "ci" / "buildkite.yml"
# The CI systems' own variables, as a runner would fill them in.
FILLED = {
    r"\$\{\{ *matrix\.shard *\}\}": "2",
    r"\$\{\{ *env\.SHARDS *\}\}": "4",
    r"\{\{ *matrix\.shard *\}\}": "2",
    r"\{\{ *matrix\.flashinfer *\}\}": "0.7.2.post1",
    r"\{\{ *matrix *\}\}": "0.7.2.post1",
    r"\$\$SHARDS": "4",
    r'"\$\$?profile"|"\$PROFILE"': "gpu",
    r"\$\$?previous": "--previous last/results.json",
    r'"\$\$last"': "last.json",
    r"\$\$?pins": "--pins attn-harness-pins.json",
}


def harness_commands(script: str) -> list[list[str]]:
    """Each `attn-harness ...` command of a shell script, its variables filled in, as argv."""
    out = []
    for line in script.splitlines():
        match = re.search(r"(?:^|\s|/)attn-harness (.*)$", line)
        if not match:
            continue
        text = match.group(1)
        for pattern, value in FILLED.items():
            text = re.sub(pattern, value, text)
        assert "$" not in text and "{{" not in text, f"unfilled variable in: {line.strip()}"
        out.append(shlex.split(text))
    return out


def github_scripts() -> list[str]:
    data = yaml.safe_load(GITHUB.read_text())
    return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def buildkite_scripts() -> list[str]:
    return [step["command"] for step in yaml.safe_load(BUILDKITE.read_text())["steps"] if "command" in step]


@pytest.mark.parametrize("scripts", [github_scripts, buildkite_scripts], ids=["github", "buildkite"])
def test_every_harness_command_parses(scripts):
    commands = [argv for script in scripts() for argv in harness_commands(script)]
    assert {argv[0] for argv in commands} == {"check", "merge"}
    for argv in commands:
        args = cli.parser().parse_args(argv)
        if args.command == "check":
            assert args.shard == "2/4" and args.results
        else:
            assert args.out and args.shares


def test_a_broken_command_would_be_caught():
    with pytest.raises(cli.UsageError):
        cli.parser().parse_args(harness_commands("attn-harness check --shrad 2/4")[0])


def test_the_github_workflow_splits_caches_uploads_and_merges():
    data = yaml.safe_load(GITHUB.read_text())
    check, merge = data["jobs"]["check"], data["jobs"]["merge"]
    assert len(check["strategy"]["matrix"]["shard"]) == int(data["env"]["SHARDS"])
    assert check["strategy"]["fail-fast"] is False
    cache = next(s for s in check["steps"] if str(s.get("uses", "")).startswith("actions/cache"))
    for part in ("steps.gpu.outputs.kind", "matrix.flashinfer", "env.PROFILE"):
        assert part in cache["with"]["key"]
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact") for s in check["steps"])
    assert merge["needs"] == "check" and merge["if"] == "always()"
    assert "thorough" in data["env"]["PROFILE"] and "schedule" in str(data[True])


def test_the_buildkite_pipeline_waits_for_every_share_then_merges():
    steps = yaml.safe_load(BUILDKITE.read_text())["steps"]
    check, wait, merge = steps
    assert check["matrix"]["setup"]["shard"] == ["1", "2", "3", "4"]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert "attn-harness merge" in merge["command"] and "artifact download" in merge["command"]


@pytest.mark.parametrize(
    "scripts,template",
    [(github_scripts, GITHUB), (buildkite_scripts, BUILDKITE)],
    ids=["github", "buildkite"],
)
def test_every_run_replays_the_pins_file_and_the_nightly_adds_its_failures_to_it(scripts, template):
    """docs/ci.md: every check replays the pins file first; the nightly is seeded (new draws, the
    same on every share) and keeps every failing case of its merged results in the pins file."""
    commands = [argv for script in scripts() for argv in harness_commands(script)]
    checks = [cli.parser().parse_args(argv) for argv in commands if argv[0] == "check"]
    assert checks and all(args.pins == "attn-harness-pins.json" for args in checks)
    lines = [line for script in scripts() for line in script.splitlines()]
    keeps = [line for line in lines if "-m harness.search.kept" in line]
    assert keeps and all("merged" in line and "results.json" in line for line in keeps)
    assert "ATTN_HARNESS_SEED" in template.read_text()
