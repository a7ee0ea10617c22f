"""Variant shards (harness/run/speed/variant_shards.py): the shards of a backend with variant keys run every
search test, draw the same cases, and between them check each case exactly once; in a profile whose
draws depend on what was measured they split the tests instead.
KeyedNative is torch_native keyed by dtype and batch size (both vary in every profile), so its shards
split by variant as flex_compiled's do on a GPU; `tests.test_variant_shards:native` is its spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from harness import backends
from harness.backends.torch_native import TorchNative
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.results import CaseResult
from harness.run import cache_dir, check, isolation, parallel, suite
from harness.run.speed import variant_shards
from harness.run.speed.settings import ISOLATE_ENV
from harness.run.suite import Target, judge, run_family
from harness.search import profiles
from harness.search.refusals import TooManyRefusals
from tests.helpers import case

ROOT = Path(__file__).resolve().parent.parent
KEYED = "tests.test_variant_shards:native"


class KeyedNative(TorchNative):
    def variant_key(self, case: Case | GraphCase) -> tuple:
        layer = case.layer if isinstance(case, GraphCase) else case
        return (layer.dtype, len(layer.requests))


def native() -> KeyedNative:
    return KeyedNative()


@pytest.fixture
def shard():  # noqa: ANN201 - a function setting this process's shard
    yield variant_shards.configure
    variant_shards.configure(0, 1)


@pytest.fixture
def gpu_draws():  # noqa: ANN201
    """The gpu profile's phases and derandomization over the ci profile's sizes (fast on the CPU)."""
    gpu = settings.get_profile("gpu")
    settings.register_profile("variant-shards-test", settings(settings.default, phases=gpu.phases))
    settings.load_profile("variant-shards-test")
    yield
    profiles.load("ci")


def test_a_variants_owner_is_the_same_in_every_process_and_the_keys_spread():
    keys = [
        ("bfloat16", 128, h, 2, 0.088, d, one, short)
        for h in (2, 4, 8, 16)
        for d in (0, 1)
        for one in (0, 1)
        for short in (0, 1)
    ]
    here = [variant_shards.owner(k, 4) for k in keys]
    code = (
        "import sys\n"
        "from harness.run.speed.variant_shards import owner\n"
        "print([owner(k, 4) for k in eval(sys.argv[1])])"
    )
    for seed in ("0", "12345"):  # Python salts str hashes per process: an owner must not use them
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, repr(keys)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(out.stdout) == here
    assert set(here) == {0, 1, 2, 3} and max(here.count(i) for i in range(4)) <= len(keys) // 2


def test_shards_split_by_variant_where_they_draw_alike(shard, gpu_draws):
    assert not variant_shards.splits()  # not a shard
    shard(1, 2)
    assert variant_shards.splits()
    profiles.load("ci")  # derandomized, but its target phase steers by what each shard measured
    assert not variant_shards.splits()
    with pytest.raises(ValueError, match="shard 2/2"):
        variant_shards.configure(2, 2)


def test_a_backend_that_compiles_nothing_per_case_makes_each_case_its_own_variant(shard, gpu_draws):
    """torch_native: its two shards split even cases that a keyed backend keeps together."""
    plain, keyed = TorchNative(), KeyedNative()
    cases = [case("DECODE", ((n, 1),)) for n in range(5, 45)]
    assert plain.variant_key(cases[0]) == cases[0].to_json()
    assert len({keyed.variant_key(c) for c in cases}) == 1
    shard(0, 2)
    assert len({variant_shards.elsewhere(plain, c) for c in cases}) == 2  # some here, some there
    assert len({variant_shards.elsewhere(keyed, c) for c in cases}) == 1


def _suite(tmp_path: Path, name: str, *args: str) -> list[dict]:
    """The decode and verify families of the keyed backend on the CPU under the gpu profile, with the
    cache directory in tmp_path: the records of results.json."""
    results = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", "-k", "decode or verify"]
    env = {**os.environ, "ATTN_HARNESS_BACKENDS": KEYED, "ATTN_HARNESS_PROFILE": "gpu"}
    env[cache_dir.ENV] = str(tmp_path / "cache")
    out = subprocess.run(
        [*cmd, *args, "--harness-results", str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return json.loads(results.read_text())["results"]


def _cases(records: list[dict]) -> list[str]:
    return sorted(
        json.dumps([r["test_id"], r["case"], r["status"]], sort_keys=True) for r in records if r["case"]
    )


def test_two_variant_shards_check_exactly_the_cases_of_one_unsharded_run(tmp_path):
    """Under the gpu profile (the sizes of the device's runs): every search test runs in both shards,
    each checks its own variants (dealt from saved weights where they name one, else hashed), and
    together they checked and recorded each case once; the tests skipped as a whole say so in both,
    and the merged run says it once."""
    whole = _suite(tmp_path, "whole")
    keys = {("bfloat16", 1): 9.0, ("bfloat16", 2): 1.0, ("float16", 3): 2.0}  # the rest unnamed: hashed
    weights = {variant_shards.name(k): w for k, w in keys.items()}
    path = variant_shards.weights_path(KEYED, "gpu", tmp_path / "cache")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": variant_shards.FORMAT, "weights": weights}))
    shards = [_suite(tmp_path, f"shard{i}", "--harness-shard", f"{i}/2") for i in range(2)]
    assert len(_cases(whole)) >= 100
    assert all(_cases(s) for s in shards)  # both checked some
    assert _cases(whole) == sorted(_cases(shards[0]) + _cases(shards[1]))
    heaviest = [
        r
        for r in shards[0]
        if r["case"] and (r["case"]["dtype"], len(r["case"]["requests"])) == ("bfloat16", 1)
    ]
    assert heaviest  # dealt first, to shard 0
    skips = [r for r in whole if not r["case"]]
    assert skips and all(r["status"] == "skip" for r in skips)  # the cross family etc.: not drawn
    for s in shards:
        assert sorted(map(json.dumps, (r for r in s if not r["case"]))) == sorted(map(json.dumps, skips))
    parts = [
        parallel.Part(
            backend=KEYED, results=tmp_path / f"{i}.json", log=tmp_path / f"{i}.log", shard=i, shards=2
        )
        for i in range(2)
    ]
    for part, records in zip(parts, shards):
        part.records = records
    merged = parallel.merged_records(parts)
    assert _cases(merged) == _cases(whole)
    assert sorted(map(json.dumps, (r for r in merged if not r["case"]))) == sorted(map(json.dumps, skips))


def _collect(profile: str, *args: str, cache: Path | None = None) -> list[str]:
    env = {**os.environ, "ATTN_HARNESS_BACKENDS": KEYED, "ATTN_HARNESS_PROFILE": profile}
    env[cache_dir.ENV] = str(cache or ROOT / ".no-such-cache")
    cmd = [sys.executable, "-m", "pytest", "cases", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run([*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_collection_keeps_every_search_test_of_a_keyed_backend_and_the_model_checks_together():
    """Without weights, every shard runs every search test, and one (the hash's) all whole tests: the
    model checks and the catalogue's named batches."""
    every = _collect("gpu")
    whole = ("test_model_logprobs", "test_catalogue")
    searches = [i for i in every if not any(w in i for w in whole)]
    models = [i for i in every if any(w in i for w in whole)]
    assert searches and len(models) >= 2
    owner = variant_shards.owner(variant_shards.WHOLE_TESTS, 2)
    for index in range(2):
        ids = _collect("gpu", "--harness-shard", f"{index}/2")
        assert [i for i in ids if i in searches] == searches
        assert [i for i in ids if i in models] == (models if index == owner else [])


def test_the_weights_deal_the_whole_tests_as_one_unit(tmp_path):
    """The model checks' summed seconds weigh them like a variant: heavier than the one variant named,
    they go to shard 0 and the variant to shard 1; lighter, the other way round. A key of neither kind
    (an older file's per-test weight) is dropped on reading."""
    models = [i for i in _collect("gpu") if "test_model_logprobs" in i]
    path = variant_shards.weights_path(KEYED, "gpu", tmp_path)
    path.parent.mkdir(parents=True)
    for whole, variant, shard in ((50.0, 1.0, 0), (1.0, 50.0, 1)):
        weights = {variant_shards.WHOLE_TESTS: whole, "0123456789abcdef": variant, "test " + models[0]: 99.0}
        path.write_text(json.dumps({"format": variant_shards.FORMAT, "weights": weights}))
        assert sorted(variant_shards.read_weights(path)) == ["0123456789abcdef", variant_shards.WHOLE_TESTS]
        dealt = [
            [i for i in _collect("gpu", "--harness-shard", f"{n}/2", cache=tmp_path) if i in models]
            for n in (0, 1)
        ]
        assert dealt[shard] == models and dealt[1 - shard] == []


def test_shards_split_the_tests_when_the_profile_targets():
    """The ci profile's target phase steers each search by the err/budget it measured, so shards would
    draw apart: they split the tests as for any backend, every Nth from the Ith."""
    every = _collect("ci")
    assert [_collect("ci", "--harness-shard", f"{i}/2") for i in range(2)] == [every[0::2], every[1::2]]


def test_the_weights_deal_the_heaviest_variant_first_to_the_lightest_shard():
    weights = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 3.0, "e": 1.0}
    assert variant_shards.deal(weights, 2) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}  # 8 and 8
    assert variant_shards.deal(weights, 1) == dict.fromkeys(weights, 0)
    assert variant_shards.deal({}, 3) == {}


def test_a_shard_follows_the_saved_weights_and_hashes_what_they_lack(shard, gpu_draws, tmp_path, monkeypatch):
    """A variant named in the weights file goes where the deal puts it, one it lacks (or every one,
    when the file is unreadable) where its hash does."""
    backend = KeyedNative()
    named = [case("DECODE", ((5, 1),) * n) for n in (1, 2, 3, 4)]
    other = case("DECODE", ((5, 1),) * 9)
    lines = [{"kind": "numeric", "case": c} for c in named for _ in range(len(c.requests))]
    lines.append({"kind": "invariance", "case": named[0]})
    path = variant_shards.save_weights(backend, profiles.current(), lines, tmp_path)
    weights = variant_shards.read_weights(path)
    assert weights[variant_shards.name(backend.variant_key(named[0]))] == 1.459  # numeric + invariance
    dealt = variant_shards.deal(weights, 3)
    monkeypatch.setenv(cache_dir.ENV, str(tmp_path))
    hashed = [variant_shards.owner(backend.variant_key(c), 3) for c in named]
    assert [
        dealt[variant_shards.name(backend.variant_key(c))] for c in named
    ] != hashed  # the test tells them apart
    shard(0, 3)
    assert [variant_shards.shard_of(backend, c, 3) for c in named] == [
        dealt[variant_shards.name(backend.variant_key(c))] for c in named
    ]
    assert variant_shards.shard_of(backend, other, 3) == variant_shards.owner(backend.variant_key(other), 3)
    path.write_text("{not json")
    shard(0, 3)  # the weights are read again
    assert [variant_shards.shard_of(backend, c, 3) for c in named] == hashed


def _refusing(req_count: int) -> KeyedNative:
    """A keyed backend that refuses every batch of more than `req_count` requests (most draws)."""

    class Refusing(KeyedNative):
        name = "refusing"

        def supports(self, c):  # noqa: ANN001, ANN202
            return "too many requests" if len(c.requests) > req_count else super().supports(c)

    return Refusing()


def test_another_shards_case_is_neither_recorded_nor_checked_and_its_refusal_is_rejected(
    shard, gpu_draws, monkeypatch
):
    backend = _refusing(1)
    taken, refused = case("DECODE", ((5, 1),)), case("DECODE", ((5, 1), (3, 1)))
    records: list[CaseResult] = []
    assumed: list[bool] = []
    monkeypatch.setattr(suite, "assume", assumed.append)  # hypothesis's, outside a search
    shard(1 - variant_shards.owner(backend.variant_key(taken), 2), 2)
    search = isolation.Search(backend, "cpu")
    judge(search(taken), search, records.append)  # passed over: no record, no failure
    assert records == [] and assumed == [True] and variant_shards.is_elsewhere(search.seen[taken.to_json()])
    shard(1 - variant_shards.owner(backend.variant_key(refused), 2), 2)
    search = isolation.Search(backend, "cpu")
    judge(search(refused), search, records.append)
    assert records == [] and assumed == [True, False]  # rejected, as its owner rejects it
    assert search.seen[refused.to_json()].status == "skip"


def test_every_shard_judges_refusals_over_the_whole_draw(shard, gpu_draws, monkeypatch):
    """A backend refusing most draws fails the search in each shard with the same counts (the merged
    run keeps that record once), though each shard checked only its own share."""
    monkeypatch.setenv(ISOLATE_ENV, "0")
    texts = []
    for index in range(2):
        shard(index, 2)
        monkeypatch.setattr(backends, "load", lambda name: _refusing(1))
        with pytest.raises(TooManyRefusals) as e:
            run_family(Target("refusing", "cpu", "decode", "full"))
        texts.append(str(e.value))
    assert texts[0] == texts[1] and "refused" in texts[0]


def test_merged_records_keep_each_whole_test_record_once_and_every_case_record():
    def part(i: int, records: list[dict]) -> parallel.Part:
        p = parallel.Part(backend="b", results=Path(f"{i}.json"), log=Path(f"{i}.log"), shard=i, shards=2)
        p.records = records
        return p

    skip = {"status": "skip", "case": None, "test_id": "t", "reason": "no window"}
    other = {**skip, "test_id": "u"}
    c = {"status": "pass", "case": {"mode": "DECODE"}, "test_id": "t"}
    merged = parallel.merged_records([part(0, [skip, c, other]), part(1, [dict(skip), dict(c)])])
    assert merged == [skip, c, other, c]


def _record(c, seconds: float, backend: str = "torch_native", graph=None) -> dict:  # noqa: ANN001
    """A case's results.json record (a replay's when `graph`, a GraphCase, is given)."""
    extra = {"check": "graph", "graph_case": graph.to_dict()} if graph else {}
    return CaseResult(
        status="pass", backend=backend, device="cpu", case=c, seconds=seconds, extra=extra
    ).to_dict()


def test_a_check_measures_each_variants_seconds_and_keeps_the_unmeasured_weights(tmp_path):
    from harness.core.graph_case import GraphCase

    backend = KeyedNative()
    one, two = case("DECODE", ((5, 1),)), case("DECODE", ((5, 1), (3, 1)))
    replay = GraphCase((case("DECODE", ((5, 1),) * 3), two), max_batch=4, max_kv=64)
    kept = case("DECODE", ((5, 1),) * 5)
    variant_shards.save_weights(
        backend, "gpu", [{"kind": "numeric", "case": c} for c in (one, kept)], tmp_path
    )
    records = [_record(one, 2.0), _record(one, 0.5), _record(two, 1.25), _record(one, 9.0, graph=replay)]
    records += [_record(two, 7.0, backend="other"), {"backend": "torch_native", "case": None, "seconds": 3.0}]
    model = {"backend": "torch_native", "case": None, "seconds": 12.5, "test_id": "cases/t.py::m[x]"}
    records += [model, {**model, "test_id": "cases/t.py::m[y]", "seconds": 2.25}]
    records += [{**model, "test_id": "cases/t.py::skipped", "seconds": 0.0}]
    path = variant_shards.save_measured(backend, "gpu", records, tmp_path)
    key = backend.variant_key
    assert variant_shards.read_weights(path) == {
        variant_shards.name(key(one)): 2.5,
        variant_shards.name(key(two)): 1.25,
        variant_shards.name(
            key(replay)
        ): 9.0,  # a replay is weighed by its first batch's variant, as it is dealt
        variant_shards.name(key(kept)): 0.142,  # not run: its modelled weight stays
        variant_shards.WHOLE_TESTS: 14.75,  # the whole tests (model checks) run, their seconds summed
    }
    assert variant_shards.save_measured(backend, "gpu", [records[4], records[-1]], tmp_path) is None


class _CompiledGate:
    """A warm-up that compiled beside the check (harness/run/speed/warm_gate.py's interface)."""

    seconds = 1.0

    def ready(self, backend: str) -> bool:
        return True

    def nice(self) -> int:
        return 0

    def join(self) -> list[str]:
        return []

    def compiled(self) -> bool:
        return True


@pytest.mark.parametrize("compiled", [False, True])
def test_check_saves_the_measured_weights_unless_the_warm_up_compiled_beside_it(
    monkeypatch, tmp_path, compiled
):
    from tests.helpers import fresh_cache

    cache = fresh_cache(monkeypatch, tmp_path)
    cache.mkdir(parents=True)
    c = case("DECODE", ((5, 1),))

    def fake_run(cmd, env, backends_env, plan, parts_dir, cwd, **kwargs):  # noqa: ANN001, ANN003, ANN202
        out = []
        for i, p in enumerate(plan.parts):
            part = parallel.Part(
                backend=p.backend,
                results=parts_dir / f"{i}.json",
                log=parts_dir / f"{i}.log",
                shard=p.shard,
                shards=p.shards,
            )
            part.code, part.seconds, part.records = 0, 5.0, [_record(c, 4.0, backend=KEYED)]
            out.append(part)
        return out

    monkeypatch.setattr(parallel, "run", fake_run)
    job = check.Prepared(cmd=["pytest"], env={}, names=[KEYED], jobs=1, gpus=[], run_dir=tmp_path / "run",
                         profile="gpu", results=None, selection="sel", cwd=tmp_path, command_line="check")
    gate = _CompiledGate() if compiled else None
    assert check.run_parallel(job, gate) == 0
    weights = variant_shards.read_weights(variant_shards.weights_path(KEYED, "gpu", cache))
    assert weights == ({} if compiled else {variant_shards.name(KeyedNative().variant_key(c)): 4.0})
