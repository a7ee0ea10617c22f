"""`--harness-shard I/N`: N pytest processes split one suite; every test runs in exactly one of them."""

import re

import pytest

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
