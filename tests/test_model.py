"""The model-level check: the engine's cache and metadata, the scenario, the rule, and that it fails.
The passing runs live in the suite (cases/test_model.py); here each part is shown able to fail. Its
table (python -m harness.checks.model.table): a worker that dies is a crash row, and the rest still runs."""

import math
import os
from pathlib import Path

import pytest
import torch

from harness.backends import load
from harness.backends.base import BackendOutput, Capabilities
from harness.backends.torch_native import TorchNative
from harness.checks.model import check as M
from harness.checks.model import table as model_table
from harness.checks.model.engine import PagedKVCache, Work
from harness.checks.model.serving import ATTN_NAME, register, serve, together
from harness.core import pool
from harness.core.batch import Inputs
from harness.core.case import Case
from harness.core.modes import Mode
from harness.mutants import by_name, catalogue
from harness.run.workers import Worker
from references.torch_ref import reference
from tests.helpers import AttendsOverACopy


def _cache(page_size=4, pages=16, whole_page_loads=False):
    return PagedKVCache(1, pages, page_size, 2, 8, torch.float32, "NHD", "cpu", whole_page_loads, seed=1)


def test_a_request_reuses_whole_cached_pages_of_another():
    c = _cache()
    c.finish(
        c.plan(Mode.EXTEND, [Work(rid="A", tokens=tuple(range(10)))]),
        [Work(rid="A", tokens=tuple(range(10)))],
    )
    b = Work(rid="B", tokens=(1, 2, 3), parent="A", reuse=8)
    step = c.plan(Mode.EXTEND, [b])
    assert c.pages["B"][:2] == c.pages["A"][:2] and c.pages["B"][2] not in c.pages["A"]
    assert step.prefix_lens.tolist() == [8] and step.req_to_token[0, :8].tolist() == c.slots("A", 0, 8)
    with pytest.raises(ValueError, match="whole cached pages"):
        c.start("C", "A", 6)


def test_verify_drafts_are_not_committed_and_their_rows_are_poison_again():
    c = _cache(whole_page_loads=False)
    a = Work(rid="A", tokens=tuple(range(6)))
    c.finish(c.plan(Mode.EXTEND, [a]), [a])
    free_before = len(c.free)
    v = Work(rid="A", tokens=(7, 8, 9, 10, 11), tree=(-1, 0, 0, 1, 2))
    step = c.plan(Mode.TARGET_VERIFY, [v])
    assert step.seq_lens.tolist() == [6] and step.positions.tolist() == [6, 7, 7, 8, 8]
    c.pools[0].write(step.out_cache_loc, torch.ones(5, 2, 8), torch.ones(5, 2, 8))
    c.finish(step, [v])
    assert c.length["A"] == 6 and len(c.free) == free_before
    k, _ = c.pools[0].read(torch.tensor(c.slots("A", 6, 8)))
    assert torch.isnan(k).all()


def test_draft_extend_metadata_follows_the_bumped_convention():
    c = _cache()
    a = Work(rid="A", tokens=tuple(range(5)))
    c.finish(c.plan(Mode.EXTEND, [a]), [a])
    step = c.plan(Mode.DRAFT_EXTEND_V2, [Work(rid="A", tokens=(1, 2, 3))])
    assert step.seq_lens.tolist() == [8] and step.seq_lens_before_bump.tolist() == [5]
    assert step.num_draft == 3 and step.out_cache_loc.tolist() == c.slots("A", 5, 8)


def test_whole_page_loads_get_the_canary_not_poison():
    c = _cache(whole_page_loads=True)
    a = Work(rid="A", tokens=(1, 2))
    c.plan(Mode.EXTEND, [a])
    k, _ = c.pools[0].read(torch.tensor(c.slots("A", 0, 4) + [0]))
    assert (k == pool.CANARY).all()


def test_a_backend_on_the_engines_batch_matches_the_reference():
    """The engine's metadata is what build_batch would give: torch_native on it equals torch_ref."""
    c = _cache(page_size=16)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, h, 8, generator=gen) for n, h in ((7, 4), (7, 2), (7, 2)))
    w = Work(rid="A", tokens=tuple(range(7)))
    step = c.plan(Mode.EXTEND, [w])
    shape = dict(num_q_heads=4, num_kv_heads=2, head_dim=8, dtype="float32", page_size=16)
    case = Case(mode="EXTEND", requests=step.requests, window_left=2, **shape)
    out = load("torch_native").run(c.batch(step, case, 0, q, k, v, None)).out
    ref = reference(case, Inputs.from_requests([q], [k], [v], None)).out
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_the_scenario_runs_every_step_the_issue_names():
    phases = M.scenario(page_size=16, window=8, vocab=50)
    modes = {p.mode for p in phases}
    assert modes == {Mode.EXTEND, Mode.DECODE, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY}
    b = next(it for it in phases[1].items if it.work.rid == "B")
    assert b.work.parent == "A" and b.work.reuse % 16 == 0 and b.work.reuse > 8  # window binds in it
    a_prompt = len(phases[0].items[0].work.tokens)
    decodes = [p for p in phases if p.mode == Mode.DECODE]
    assert a_prompt > 8 and len(decodes) > 8  # the window binds in the prefill and slides past decodes
    tree = next(p for p in phases if p.name == "verify tree").items[0].work.tree
    assert len(set(tree)) < len(tree)  # some node has two children


def test_whole_sequence_reference_equals_one_forward_per_query():
    """The covering logic is right: a causal model's logit at p does not see tokens after p."""
    model = M.exact_model(M.MODELS["mistral"].build(torch.float32, "cpu"), torch.float64)
    phases = M.scenario(16, 8, 256)[:3]
    with M.single_threaded():
        whole = M.reference_logprobs(model, phases, "cpu", whole=True)
        each = M.reference_logprobs(model, phases, "cpu", whole=False)
    assert max(abs(whole[k] - each[k]) for k in whole) < 1e-10


def test_the_budget_is_k_times_the_native_error_plus_noise():
    spec = M.MODELS["mistral"]
    keys = [("A", "p", 0), ("A", "p", 1)]
    run = M.Run(logprobs={keys[0]: torch.tensor(-1.0), keys[1]: torch.tensor(-2.1)}, own=set(keys))
    exact = {keys[0]: -1.0, keys[1]: -2.0}
    native = [{keys[0]: -1.02, keys[1]: -2.0}]
    k, n, worst, budget, where = M.judge(spec, run, exact, native, "float32")
    assert math.isclose(budget, 2 * 0.02 + 2 * 2.0**-22, rel_tol=1e-3)  # noise(fp32) at |lp| ~ 2
    assert (k, n) == (1, 2) and math.isclose(worst, 0.1, rel_tol=1e-5) and "query 1" in where


DE_AND_WINDOW = ["window_ignored", "window_short", "window_long", "de_v2_prefix_only"]
MUTANTS = [m for m in catalogue() if m.name.removeprefix("torch_native~") in DE_AND_WINDOW]


@pytest.mark.parametrize("model", list(M.MODELS))
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name.removeprefix("torch_native~"))
def test_injected_bugs_make_the_model_check_fail_with_a_count(mutant, model):
    res = M.check_model(mutant.make(), model, "cpu", determinism=False)
    assert res.status == "fail" and 0 < res.differing <= res.tokens
    assert res.reason.startswith(f"{res.differing} of {res.tokens} logprobs differ beyond tolerance")


def test_the_three_bugs_the_issue_names_are_in_the_catalogue():
    for name in ("window_ignored", "window_short", "de_v2_prefix_only"):
        assert by_name(f"torch_native~{name}")


class _BatchSized(TorchNative):
    """Attention whose rounding depends on the batch: what deterministic mode must rule out."""

    def run(self, batch):
        out = super().run(batch).out
        return BackendOutput(out * (1 + 1e-6 * (batch.batch_size - 1)))


def test_a_batch_dependent_backend_fails_deterministic_mode():
    res = M.check_model(_BatchSized(), "mistral", "cpu")
    assert res.deterministic.startswith("FAIL") and "changed in" in res.deterministic
    assert res.status == "fail"


class _NoDecode(TorchNative):
    name = "torch_native_nodec"
    capabilities = Capabilities(
        modes=frozenset({Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY}),
        dtypes=frozenset({"float32"}),
        devices=frozenset({"cpu"}),
        window=True,
    )


def test_steps_a_backend_lacks_run_on_torch_native_and_are_not_counted():
    res = M.check_model(_NoDecode(), "mistral", "cpu", determinism=False)
    decodes = [k for k in res.fallback if k.startswith("decode")]
    assert res.status == "pass" and set(res.fallback) == {*decodes, "verify tree"}
    assert len(decodes) == 10 and "DECODE" in res.fallback["decode 1"]
    assert "trees" in res.fallback["verify tree"]
    full = M.check_model(load("torch_native"), "mistral", "cpu", determinism=False)
    assert res.tokens == full.tokens - 2 * 10 - 2 * 6


def test_a_backend_that_serves_nothing_is_a_skip_with_the_reasons():
    res = M.check_model(_NoDecode(), "gemma2", "cpu", determinism=False)  # no soft cap
    assert res.status == "skip" and "soft cap" in res.reason


class _CrossOnly(TorchNative):
    name = "torch_native_cross"
    capabilities = Capabilities(
        modes=frozenset({Mode.CROSS}), dtypes=frozenset({"float32"}), devices=frozenset({"cpu"})
    )


def test_a_backend_with_none_of_the_step_modes_skips_before_any_model_is_built(monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("a model was built for a backend that can serve none of its steps")

    monkeypatch.setattr(M.TinyModel, "build", build)
    res = M.check_model(_CrossOnly(), "mistral", "cpu")
    assert res.status == "skip"
    assert res.reason == (
        "the backend serves no step of this model: torch_native_cross implements none of its modes "
        "(DECODE, DRAFT_EXTEND_V2, EXTEND, TARGET_VERIFY)"
    )
    assert M.no_step_mode(_NoDecode()) is None  # one mode is enough to serve


class _Raises(TorchNative):
    def run(self, batch):
        if batch.mode == Mode.DECODE:
            raise RuntimeError("illegal memory access (simulated)")
        return super().run(batch)


def test_a_backend_whose_cache_writes_do_not_reach_the_pool_fails_at_the_first_step_that_reads_them():
    """A backend right within each forward but writing only a copy of the pool (an engine adapter's
    per-run cache) leaves the next step reading poison: NaN from decode 1 on, not a pass."""
    res = M.check_model(AttendsOverACopy(), "mistral", determinism=False)
    assert res.status == "fail", res
    assert res.worst.startswith("request A, decode 1,") and "test nan" in res.worst, res.worst


def test_a_crash_is_a_result_that_names_the_step():
    res = M.check_model(_Raises(), "mistral", "cpu")
    assert res.status == "crash" and "decode 1" in res.reason and "simulated" in res.reason


def test_served_model_keeps_the_eager_reference_untouched():
    register()
    eager = M.MODELS["mistral"].build(torch.float32, "cpu")
    served = M.copy.deepcopy(eager)
    served.set_attn_implementation(ATTN_NAME)
    assert eager.config._attn_implementation == "eager"
    phases = M.scenario(16, 8, 256)[:2]
    run = serve(served, load("torch_native"), phases, together, "cpu")
    assert len(run.own) == sum(len(it.work.tokens) for p in phases for it in p.items)


def test_the_gpu_configuration_bf16_attention_in_a_float32_model_passes_and_catches_a_bug():
    """What the GPU runs (q, k, v and the pool in bf16, dense layers in float32), here on the CPU."""
    good = M.check_model(load("torch_native"), "gpt_oss", "cpu", torch.bfloat16, determinism=False)
    assert good.status == "pass" and good.dtype == "bfloat16/float32" and good.budget < 1.0
    bad = M.check_model(by_name("torch_native~window_short").make(), "gpt_oss", "cpu", torch.bfloat16)
    assert bad.status == "fail" and bad.differing > 0


class _SyncingOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts, while `on`, the operations that make the host wait for a GPU: nonzero (its size is
    data) and _local_scalar_dense (a tensor read as a Python number)."""

    SYNCING = ("aten::nonzero", "aten::_local_scalar_dense")

    def __init__(self):
        super().__init__()
        self.on, self.count = False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func.name().split(".")[0] in self.SYNCING:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_gpt_oss_experts_run_without_a_host_sync():
    """batched_mm, not transformers' eager loop (nonzero and a tensor comparison per expert per layer):
    the loop synchronised a GPT-OSS check 17,898 times on an H200 (harness/checks/model/check.py)."""
    model = M.MODELS["gpt_oss"].build(torch.float32, "cpu")
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    assert experts and model.config._experts_implementation == "batched_mm"
    mode = _SyncingOps()

    def on(*_):
        mode.on = True

    def off(*_):
        mode.on = False

    for m in experts:
        m.register_forward_pre_hook(on)
        m.register_forward_hook(off)
    with mode, torch.no_grad():
        model(input_ids=torch.arange(12)[None] % 256, use_cache=False)
    assert mode.count == 0


def test_experts_fall_back_to_the_loop_where_transformers_lacks_batched_mm():
    calls = []

    class Old:
        def set_experts_implementation(self, name):
            calls.append(name)
            if name != "eager":
                raise ValueError(f"Specified `experts_implementation={name!r}` is not supported")

    assert M.set_experts(Old()) == "eager" and calls == ["batched_mm", "eager"]


ROOT = Path(__file__).resolve().parent.parent


class _Dies(TorchNative):
    name = "dies"

    def run(self, batch):
        if batch.mode == Mode.DECODE:
            os._exit(7)  # as a process killed by an illegal memory access would vanish
        return super().run(batch)


def test_a_dying_worker_becomes_a_crash_row_and_the_next_job_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    jobs = [("tests.test_model:_Dies", "mistral"), ("torch_native", "mistral")]
    rows = model_table.run_jobs(jobs, "cpu", timeout=300)
    assert [(r.backend, r.status) for r in rows] == [
        ("tests.test_model:_Dies", "crash"),
        ("torch_native", "pass"),
    ]
    assert "worker exited with status 7" in rows[0].reason
    assert "bitwise equal" in rows[1].deterministic


def test_jobs_run_in_the_callers_worker_which_stays_running(monkeypatch):
    """The suite passes its isolation worker: the jobs run in that process (the dying job ends it,
    the next job starts it again) and it is left running for the suite's next case."""
    monkeypatch.chdir(ROOT)
    worker = Worker("model-table-test")
    try:
        worker.start()
        jobs = [("tests.test_model:_Dies", "mistral"), ("torch_native", "mistral")]
        rows = model_table.run_jobs(jobs, "cpu", timeout=300, worker=worker)
        assert [r.status for r in rows] == ["crash", "pass"]
        assert worker.started == 2  # its first process died in the first job; the second ran the next
        assert worker.proc is not None and worker.proc.is_alive()
    finally:
        worker.stop()


def test_fallback_summary_groups_steps_by_reason():
    text = M.fallback_summary({"decode 1": "no DECODE", "decode 2": "no DECODE", "verify tree": "no trees"})
    assert text == "decode 1, decode 2: no DECODE; verify tree: no trees"
