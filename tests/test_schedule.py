"""The check's schedule (harness/run/speed/schedule.py) and its costs (harness/run/speed/costs.py):
pure functions."""

import itertools
import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.run.speed import costs, schedule
from harness.run.speed.schedule import STARTUP_S


def test_the_longest_backends_start_first_and_ties_keep_their_order():
    plan = schedule.plan({"torch_native": 50, "flex_eager": 90, "fa4": 70, "torch_split": 50}, 2, [])
    assert [p.name for p in plan.parts] == ["flex_eager", "fa4", "torch_native", "torch_split"]
    assert [p.start for p in plan.parts] == [0, 0, 70, 90]  # each in the slot that frees first
    assert [p.slot for p in plan.parts] == [0, 1, 1, 0] and plan.makespan == 140


def test_a_backend_longer_than_the_share_is_split_into_enough_shards_to_fit():
    """Total 400 s over 4 slots: 100 s each. flex_eager (280 s) bounds the wall time alone: split into
    3 shards of 10 + 270 / 3 = 100 s; the others fit as they are."""
    plan = schedule.plan({"flex_eager": 280, "fa4": 60, "torch_native": 40, "torch_split": 20}, 4, [])
    assert plan.share == 100
    assert [(p.name, p.seconds) for p in plan.parts] == [
        ("flex_eager[0/3]", 100),
        ("flex_eager[1/3]", 100),
        ("flex_eager[2/3]", 100),
        ("fa4", 60),
        ("torch_native", 40),
        ("torch_split", 20),
    ]
    # fa4 takes the last free slot; torch_native the first to free (fa4's, at 60 s); torch_split the
    # lowest of the four that free at 100 s.
    assert [p.slot for p in plan.parts] == [0, 1, 2, 3, 3, 0] and plan.makespan == 120


def test_the_old_fixed_order_would_have_started_a_long_backend_last():
    """flex_eager is the longest here, but the old SLOW_FIRST list started flex_compiled and fa4 first."""
    plan = schedule.plan({"flex_compiled": 10, "fa4": 10, "flex_eager": 200}, 1, [])
    assert plan.parts[0].backend == "flex_eager"


def test_a_split_that_would_lengthen_the_run_is_not_made():
    """15 s and 6 s over 2 slots: the share is 10.5 s, but two shards of 15 s cost 12.5 s each (each
    pays the 10 s startup) and the run would take 18.5 s instead of 15 s."""
    plan = schedule.plan({"a": 15, "b": 6}, 2, [])
    assert [p.name for p in plan.parts] == ["a", "b"] and plan.makespan == 15


def test_the_number_of_shards_is_the_one_with_the_shortest_run():
    """60 s over 4 slots with a 10 s startup: 2 shards take 35 s, 3 take 26.7 s, 4 take 22.5 s."""
    plan = schedule.plan({"a": 60, "b": 0}, 4, [])
    assert plan.parts[0].shards == 4 and plan.makespan == 22.5


def test_every_shard_count_is_tried_not_only_one_more():
    """Over 3 slots, b (120 s) in 2 leaves a (110 s) the longest; a in 2 would make the run 120 s, so
    one more shard at a time would stop at 110 s; a in 3 makes it 108.3 s."""
    plan = schedule.plan({"a": 110, "b": 120}, 3, [])
    assert [p.name for p in plan.parts] == ["b[0/2]", "b[1/2]", "a[0/3]", "a[1/3]", "a[2/3]"]
    assert plan.makespan == pytest.approx(108.333, abs=1e-3)


def test_slots_go_round_the_gpus_so_the_longest_parts_land_on_different_gpus():
    plan = schedule.plan({"a": 40, "b": 39, "c": 38, "d": 37, "e": 10}, 4, ["0", "1"])
    assert plan.slot_gpus == ("0", "1", "0", "1")
    assert [plan.gpu(p) for p in plan.parts[:4]] == ["0", "1", "0", "1"]
    assert plan.gpu(plan.parts[4]) == "1"  # e follows d (37 s), the first to end, on slot 3


def test_fewer_parts_than_jobs_use_only_as_many_slots():
    plan = schedule.plan({"a": 1}, 8, ["0", "1"])
    assert len(plan.parts) == 1 and plan.jobs == 1


def test_bad_costs_and_jobs_are_one_line_errors():
    with pytest.raises(ValueError, match="jobs must be at least 1, got 0"):
        schedule.plan({"a": 1}, 0, [])
    with pytest.raises(ValueError, match="'a': nan"):
        schedule.plan({"a": float("nan")}, 2, [])


def _lpt_unsplit(costs_in: dict[str, float], jobs: int) -> float:
    """The wall time of the backends started longest first, none split (a second implementation)."""
    ends = [0.0] * min(jobs, len(costs_in))
    for cost in sorted(costs_in.values(), reverse=True):
        ends[ends.index(min(ends))] += cost
    return max(ends)


def _best(seconds: list[float], slots: int) -> float:
    """The shortest wall time of these parts over the slots, by trying every assignment."""
    return min(
        max(sum(s for s, k in zip(seconds, where) if k == slot) for slot in range(slots))
        for where in itertools.product(range(slots), repeat=len(seconds))
    )


@given(
    st.lists(st.floats(0, 1000), min_size=1, max_size=14),
    st.integers(1, 16),
    st.integers(0, 8),
)
def test_the_plan_starts_longest_first_and_splitting_never_lengthens_it(costs_list, jobs, gpu_count):
    costs_in = {f"b{i}": c for i, c in enumerate(costs_list)}
    gpus = [str(g) for g in range(gpu_count)]
    plan = schedule.plan(costs_in, jobs, gpus)
    seconds = [p.seconds for p in plan.parts]
    assert seconds == sorted(seconds, reverse=True)  # longest first
    starts = [p.start for p in plan.parts]
    assert starts == sorted(starts)  # a part never starts before one planned ahead of it
    for backend, cost in costs_in.items():  # every backend's shards, each once, covering its work
        mine = [p for p in plan.parts if p.backend == backend]
        assert sorted(p.shard for p in mine) == list(range(mine[0].shards)) and len(mine) <= jobs
        assert sum(p.seconds for p in mine) == pytest.approx(cost + (len(mine) - 1) * STARTUP_S)
        assert len(mine) == 1 or cost > plan.share  # only a backend longer than the share is split
    assert plan.makespan <= _lpt_unsplit(costs_in, jobs) + 1e-6  # splitting never lengthens the run
    # Graham's bound for list scheduling: the average load plus (1 - 1/m) of the longest part.
    m = plan.jobs
    assert plan.makespan <= sum(seconds) / m + (1 - 1 / m) * max(seconds) + 1e-6
    assert all(plan.gpu(p) == (gpus[p.slot % len(gpus)] if gpus else None) for p in plan.parts)
    assert {p.slot for p in plan.parts} == set(range(m))


@given(st.lists(st.floats(0, 100), min_size=1, max_size=7), st.integers(1, 3))
def test_longest_first_is_within_four_thirds_of_the_best_assignment(costs_list, jobs):
    """Graham's LPT bound, against every assignment of the plan's parts to the slots."""
    plan = schedule.plan({f"b{i}": c for i, c in enumerate(costs_list)}, jobs, [], startup=0.0)
    assume(len(plan.parts) <= 7)
    best = _best([p.seconds for p in plan.parts], plan.jobs)
    assert plan.makespan <= (4 / 3 - 1 / (3 * plan.jobs)) * best + 1e-6


def test_describe_names_each_backend_once_with_its_shards_and_source():
    plan = schedule.plan({"flex_eager": 280, "fa4": 60, "torch_native": 40, "torch_split": 20}, 4, ["0", "1"])
    lines = schedule.describe(plan, {"flex_eager": "measured", "fa4": "default"})
    assert len(lines) == 5 and "flex_eager" in lines[0] and "3 shards x 100 s (measured)" in lines[0]
    assert "fa4" in lines[1] and " 60 s (default)" in lines[1]
    assert "6 processes, 4 at once over GPU 0,1" in lines[-1]


def test_costs_come_from_the_last_run_of_the_same_selection_else_the_defaults(tmp_path):
    names = ["flex_eager", "torch_native", "mine:make"]
    got, sources, startups = costs.expected(names, "sel", tmp_path)  # no file yet
    assert startups == dict.fromkeys(names, STARTUP_S)
    default = costs.DEFAULT_SECONDS
    assert got == {"flex_eager": default["flex_eager"], "torch_native": default["torch_native"],
                   "mine:make": costs.UNKNOWN_SECONDS}
    assert sources == {"flex_eager": "default", "torch_native": "default", "mine:make": "unknown"}
    costs.save(tmp_path, "sel", {"torch_native": 12.5})
    costs.save(tmp_path, "other", {"flex_eager": 1.0})
    costs.save(tmp_path, "sel", {"mine:make": 3.0})  # merged with what the selection had
    got, sources, _ = costs.expected(names, "sel", tmp_path)
    assert got == {"flex_eager": default["flex_eager"], "torch_native": 12.5, "mine:make": 3.0}
    assert sources["torch_native"] == "measured" and sources["flex_eager"] == "default"


def test_a_backend_that_cannot_run_here_costs_its_start_unless_measured_or_in_the_table(tmp_path):
    """fa2 and fa3 without their libraries skip every test (3.4 s a part on an H100): planned at 60 s
    each they would hold two slots of a first run's plan. Only backends neither measured nor in the
    default table are asked, so a measured or default cost never costs an import."""
    asked = []

    def unavailable(name):  # noqa: ANN001, ANN202
        asked.append(name)
        return "flash_attn_interface is not installed here" if name == "fa3" else None

    names = ["fa3", "mine:make", "torch_native", "fa2"]
    costs.save(tmp_path, "sel", {"fa2": 7.0})
    got, sources, startups = costs.expected(names, "sel", tmp_path, unavailable)
    assert asked == ["fa3", "mine:make"]
    assert got == {
        "fa3": STARTUP_S,
        "mine:make": costs.UNKNOWN_SECONDS,
        "torch_native": costs.DEFAULT_SECONDS["torch_native"],
        "fa2": 7.0,
    }
    assert sources == {"fa3": "skips", "mine:make": "unknown", "torch_native": "default", "fa2": "measured"}
    assert startups["fa3"] == STARTUP_S


UNREADABLE = ["not json", "[]", '{"format": "x", "selections": {}}']
UNREADABLE += ['{"format": "attn-harness-timings", "shards": 3}']  # a known format with no entries


@pytest.mark.parametrize("text", UNREADABLE)
def test_an_unreadable_timings_file_means_the_defaults(tmp_path, text):
    (tmp_path / costs.TIMINGS).write_text(text)
    assert costs.expected(["fa4"], "sel", tmp_path)[0] == {"fa4": costs.DEFAULT_SECONDS["fa4"]}
    costs.save(tmp_path, "sel", {"fa4": 5.0})
    assert json.loads((tmp_path / costs.TIMINGS).read_text())["selections"] == {"sel": {"fa4": 5.0}}


def test_measured_cost_sums_the_shards_less_their_extra_startups_and_skips_unfinished_backends():
    parts = [("fa4", 0, 40.0), ("fa4", 1, 50.0), ("torch_native", 5, 8.0), ("flex", 0, 9.0), ("flex", 2, 3.0)]
    assert costs.measured(parts) == {"fa4": 90.0 - STARTUP_S, "torch_native": 8.0}
    assert costs.measured(parts, {"fa4": 20.0}) == {"fa4": 70.0, "torch_native": 8.0}  # its own fixed cost
    assert costs.shard_means(parts) == {"fa4": {"2": 45.0}, "torch_native": {"1": 8.0}}


def test_fit_finds_a_process_fixed_cost_from_two_shard_counts_or_none():
    """flex_compiled on two H100s (docs/bench.md): 108.4 s a part as one of 3, 80.8 s as one of 6."""
    fixed, work = costs.fit({3: 108.4, 6: 80.8})
    assert (round(fixed, 1), round(work, 1)) == (53.2, 165.6)
    fixed, work = costs.fit({1: 60.0, 2: 35.0, 4: 22.5})  # exactly 10 + 50 / n
    assert (fixed, work) == (pytest.approx(10.0), pytest.approx(50.0))
    assert costs.fit({3: 100.0}) is None  # one shard count: no fit
    assert costs.fit({5: 39.5, 6: 39.1}) is None  # counts too close: 2 x H200, 37 s "fixed" from noise
    assert costs.fit({5: 39.5, 6: 39.1, 1: 75.3}) is not None  # with one process beside them
    assert costs.fit({2: 50.0, 4: 60.0}) is None  # longer with more shards: no work to divide
    assert costs.fit({1: 100.0, 2: 40.0}) is None  # a fixed cost below zero


def test_a_backend_seen_at_two_shard_counts_is_planned_with_its_fitted_fixed_cost(tmp_path):
    costs.save(tmp_path, "sel", {"flex_compiled": 300.0, "fa4": 40.0}, {"flex_compiled": {"3": 108.4}})
    got, sources, startups = costs.expected(["flex_compiled", "fa4"], "sel", tmp_path)
    assert got == {"flex_compiled": 300.0, "fa4": 40.0}
    assert startups == {"flex_compiled": costs.DEFAULT_FIXED["flex_compiled"], "fa4": STARTUP_S}
    costs.save(tmp_path, "sel", {}, {"flex_compiled": {"6": 80.8}, "fa4": {"1": 40.0}})
    got, sources, startups = costs.expected(["flex_compiled", "fa4"], "sel", tmp_path)
    assert got == {"flex_compiled": 218.8, "fa4": 40.0}  # fixed + work: one process
    assert sources == {"flex_compiled": "fitted: 53 s fixed", "fa4": "measured"}
    assert startups == {"flex_compiled": 53.2, "fa4": STARTUP_S}
    plan = schedule.plan(got, 6, [], startups)
    flex = [p for p in plan.parts if p.backend == "flex_compiled"]
    assert sum(p.seconds for p in flex) == pytest.approx(218.8 + (len(flex) - 1) * 53.2)
    assert json.loads((tmp_path / costs.TIMINGS).read_text())["shards"] == {
        "sel": {"flex_compiled": {"3": 108.4, "6": 80.8}, "fa4": {"1": 40.0}}
    }


def test_a_backend_with_a_known_fixed_cost_is_measured_with_it_before_any_fit(tmp_path):
    """flex_compiled pays a fixed cost far above STARTUP_S a process whatever its share: read with
    STARTUP_S, six parts of one 75 s process looked like 175 s (2 x H200: 180-191 s for 70-75 s), and
    the next plan split it into shards of 95 s."""
    _, _, startups = costs.expected(["flex_compiled"], "sel", tmp_path)
    fixed = costs.DEFAULT_FIXED["flex_compiled"]
    assert startups == {"flex_compiled": fixed} and fixed > STARTUP_S
    parts = [("flex_compiled", 0, fixed + 180.0 / 6)] * 6  # one process of fixed + 180 s, in 6 shards
    assert costs.measured(parts, startups) == {"flex_compiled": pytest.approx(fixed + 180.0)}
    assert costs.measured(parts) == {"flex_compiled": pytest.approx(6 * fixed + 180.0 - 5 * STARTUP_S)}


# The restored check's parts on 2 x H200 (eleventh session, `bench --section gpus`'s priming run):
# every backend but flex_compiled as one process, flex_compiled in 6 shards of 29.9 s on average.
PRIMED = {"fa4": 38.5, "flashinfer_dec_cc": 21.0, "flashinfer_dec_tc": 49.6, "flashinfer_enc": 9.0}
PRIMED |= {"flashinfer_paged": 34.1, "flashinfer_ragged": 22.6, "flex_eager": 43.6, "torch_native": 28.7}
PRIMED |= {"torch_split": 29.6, "fa2": 3.2, "fa3": 3.6}


def test_shards_about_as_long_as_the_assumed_fixed_cost_do_not_read_as_one_shard_of_work():
    """With 30 s assumed fixed, those 6 shards read as 29.4 s of one process: the one-GPU run then
    left flex_compiled unsplit (planned 30 s), and it took 75 s of the run's 79 s (planned 47 s). The
    fixed cost taken off is at most FIXED_SHARE of a part, so they read as (6 + 1) / 2 parts."""
    parts = [("flex_compiled", 0, 29.9)] * 6
    startups = {"flex_compiled": 30.0}
    got = costs.measured(parts, startups)
    assert got == {"flex_compiled": pytest.approx(6 * 29.9 - 5 * 29.9 * costs.FIXED_SHARE, abs=0.06)}
    assert costs.FIXED_SHARE == 0.5  # (6 + 1) / 2 parts: 104.7 s, where one process took 74.5 s
    plan = schedule.plan({**PRIMED, **got}, 8, ["0"], startups)
    assert len([p for p in plan.parts if p.backend == "flex_compiled"]) > 1
    unsplit = schedule.plan({**PRIMED, "flex_compiled": 6 * 29.9 - 5 * 30.0}, 8, ["0"], startups)
    assert len([p for p in unsplit.parts if p.backend == "flex_compiled"]) == 1  # what the run was planned


def test_a_timings_file_without_shard_means_still_gives_its_costs(tmp_path):
    doc = {"format": costs.FORMAT, "selections": {"sel": {"fa4": 5.0}}}
    (tmp_path / costs.TIMINGS).write_text(json.dumps(doc))
    assert costs.expected(["fa4"], "sel", tmp_path)[:2] == ({"fa4": 5.0}, {"fa4": "measured"})
    costs.save(tmp_path, "sel", {}, {"fa4": {"2": 3.0, "x": 1.0}})
    doc = json.loads((tmp_path / costs.TIMINGS).read_text())
    assert doc["selections"] == {"sel": {"fa4": 5.0}} and doc["shards"]["sel"]["fa4"]["2"] == 3.0
    assert costs.expected(["fa4"], "sel", tmp_path)[0] == {"fa4": 5.0}  # "x" is no shard count


def test_each_backend_pays_its_own_startup_when_split():
    """slow (200 s, 60 s fixed) over 4 slots with two 40 s backends: three shards of 60 + 140 / 3."""
    plan = schedule.plan({"slow": 200, "x": 40, "y": 40}, 4, [], {"slow": 60.0})
    assert [p.name for p in plan.parts] == ["slow[0/3]", "slow[1/3]", "slow[2/3]", "x", "y"]
    assert plan.parts[0].seconds == pytest.approx(60 + 140 / 3)
    even = schedule.plan({"slow": 200, "x": 40, "y": 40}, 4, [])  # STARTUP_S: the shards are cheaper
    assert even.parts[0].seconds == pytest.approx(STARTUP_S + (200 - STARTUP_S) / 3)
