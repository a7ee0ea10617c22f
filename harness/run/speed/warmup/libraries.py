"""The JIT libraries the warm-up compiles for, and how each compiles one variant in a worker.

- FlashInfer: one small probe per module (harness/run/speed/warmup/flashinfer.py's `module_probes`); one
  worker runs them all up to their module's JitSpec (`ninja_plan`) and writes each module's
  build.ninja, then one ninja builds every module (ninja.py), and its logs are copied into each
  module's directory, so FlashInfer's own ninja there later finds the module up to date and only
  loads it. Compiled: the module's library file was (re)linked.
- FA4 and flex_compiled: the cases the check draws (the suite for the backend in record mode,
  harness/run/record_mode.py), grouped by what selects a kernel, each group run through the adapter
  in one worker, as its check runs it. FA4's go into its disk cache: graph replays and the model
  check from fa4_precompile's `variant_cases`, all of `variant_cases` when the recording fails;
  Compiled: `cute.compile` was called. flex_compiled's go into inductor's caches: its graph replays
  are recorded too (each group captures and replays them), the model check runs whole, one model
  per variant; when the recording fails, one case per mode of each dtype x head_dim x heads.
  Compiled: inductor's FX graph cache missed.
- sglang_flashinfer and vllm_flashinfer: one library each, built alike (engine_flashinfer_library):
  the backend's drawn cases (record mode, graph replays included, the model check left out) grouped
  by the FlashInfer modules the engine's attention backend loads (one key, engine_flashinfer_key,
  with what each engine's planning selects as data, EngineModules), each group run through the
  adapter; a fixed list when the recording fails. Both engines prefill through FlashInfer's
  `backend="auto"`, FA3's sm90 module on Hopper, which no core backend loads. Compiled: a module
  appeared in FlashInfer's JIT cache.
Each pool worker function returns COMPILED or CACHED and raises when the variant cannot run.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

from harness.checks.judged_inputs import prefill_requests
from harness.run import cache_dir
from harness.run.parallel import NVCC_JOBS
from harness.run.speed import variant_shards
from harness.run.speed.warmup import CACHED, COMPILED, Library, Variant
from harness.run.speed.warmup import flashinfer as flashinfer_warmup

# One request shape per mode for flex_compiled's variants (CROSS: 30 encoder keys).
FLEX_REQUESTS = {
    "EXTEND": ((40, 24, 0, None), (0, 24, 0, None)),
    "DECODE": ((40, 1, 0, None), (20, 1, 0, None)),
    "DRAFT_EXTEND_V2": ((40, 4, 0, None),),
    "TARGET_VERIFY": ((40, 4, 0, (-1, 0, 0, 1)),),
    "CROSS": ((0, 12, 30, None), (5, 1, 30, None)),
    "ENCODER_ONLY": ((0, 24, 0, None),),
}


def _available(backend: str) -> Callable[[], str | None]:
    """Why `backend` cannot run on CUDA here (None: it can); raises BackendBroken when broken."""

    def why() -> str | None:
        from harness import backends

        return backends.load(backend).available("cuda")

    return why


def _run_on_gpu(backend, case) -> None:  # noqa: ANN001 - a Backend and a Case
    """One forward of `backend` on `case` on the GPU: what compiles its variant."""
    import torch

    from harness.core.batch import build_batch, make_inputs

    batch = build_batch(case, make_inputs(case, "cuda"), "cuda", backend.capabilities.whole_page_loads)
    backend.run(batch)
    torch.cuda.synchronize()


@functools.cache
def _backend(name: str):  # noqa: ANN202 - a Backend, loaded once per worker
    from harness import backends

    return backends.load(name)


# --- FlashInfer -------------------------------------------------------------------------------


def flashinfer_variants(profile: str) -> list[Variant]:
    return [Variant("flashinfer", p.label, p, p.users) for p in flashinfer_warmup.module_probes(profile)]


FLASHINFER = Library(
    name="flashinfer",
    backends=tuple(f"flashinfer_{path}" for path in ("paged", "ragged", "dec_tc", "dec_cc", "enc")),
    unavailable=_available("flashinfer_paged"),
    variants=flashinfer_variants,
    plan=flashinfer_warmup.ninja_plan,
)


# --- FA4 --------------------------------------------------------------------------------------


def _describe(case) -> str:  # noqa: ANN001 - a Case or a GraphCase
    from harness.core.graph_case import GraphCase

    if isinstance(case, GraphCase):
        return f"graph of {len(case.batches)} at max_batch {case.max_batch}: {_describe(case.layer)}"
    rows = sum(r.extend_len for r in case.requests)
    window = f",w={case.window_left}" + (f"/{case.window_right}" if case.window_right >= 0 else "")
    return (
        f"{case.mode},{case.dtype},d={case.head_dim},heads={case.num_q_heads}/{case.num_kv_heads},"
        f"rows={rows},cap={case.soft_cap:g},sinks={int(case.sinks)},page={case.page_size}"
        + (window if case.window_left >= 0 else "")
    )


# What FA4's recording leaves out: graph replays (harness/run/graph_suite.py: fa4 captures DECODE,
# TARGET_VERIFY and DRAFT_EXTEND_V2) and the model check (cases/test_model.py: soft cap 4). Their
# variants still come from fa4_precompile's reachable list, the short-row and tree cases and the
# model's soft cap, less those whose key a recorded group already has. flex_compiled records its
# graph replays (their captured launches are compiles of their own) and runs its model checks whole.
UNRECORDED_TESTS = "not test_graph and not test_model"
FLEX_UNRECORDED_TESTS = "not test_model"
GRAPH_ROWS = 8  # a captured step has at most max_draft query rows per request
LONG_ROWS = 128  # FA4's query tile on sm90: a request past it fills more than one tile
RECORD_TIMEOUT = 600.0  # seconds for the recording run


@dataclass(frozen=True)
class RecordedTask:
    """What one variant of a record-mode library runs in a worker: (check kind, Case) pairs, the
    invariance check's (long_kv, long_q), and a model check to run whole (harness/checks/model/)."""

    cases: tuple = ()
    neighbours: tuple[int, int] = (0, 0)
    model: str | None = None


class RecordFailed(RuntimeError):
    """The suite's record-mode run for a backend did not give its drawn cases."""


def fa4_key(case) -> tuple:  # noqa: ANN001 - a Case
    """What plausibly selects an FA4 kernel (flash_attn/cute/interface.py's compile_key, as the adapter
    fills it): mode (causal, tree mask_mod), dtype, head_dim, heads, soft cap value (score_mod's
    hash), sinks, page size (paged TMA), window sides, deterministic, KV dtype, query rows (1, more,
    past a tile: pack_gqa and tile shapes)."""
    rows = max(r.extend_len for r in case.requests)
    return (
        str(case.mode), case.dtype, case.head_dim, case.num_q_heads, case.num_kv_heads, case.soft_cap,
        case.sinks, case.page_size, case.window_left >= 0, case.window_right >= 0, case.deterministic,
        case.kv_dtype, rows > 1, rows > LONG_ROWS,
    )


def record_cases(profile: str, backend: str, leave_out: str = UNRECORDED_TESTS) -> list[dict]:
    """The cases a `check --backend <backend>` under `profile` draws: the suite for it in record mode
    (harness/run/record_mode.py), in a pytest process started as `check` starts it, `-m gpu`, less
    the tests `leave_out` (a -k expression) deselects."""
    import os
    import subprocess
    import tempfile

    from harness.backends import BACKENDS_ENV
    from harness.run import record_mode
    from harness.run.pytest_command import command
    from harness.run.speed.settings import RECORD_ENV

    with tempfile.TemporaryDirectory(prefix="attn-harness-record-") as tmp:
        file = os.path.join(tmp, "drawn.jsonl")
        run = command(profile, marker="gpu", keyword=leave_out, options=["-p", "no:cacheprovider"])
        env = {**run.env, BACKENDS_ENV: backend, RECORD_ENV: file}
        try:
            out = subprocess.run(
                run.argv, cwd=run.cwd, env=env, capture_output=True, text=True, timeout=RECORD_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            raise RecordFailed(f"the recording run took over {RECORD_TIMEOUT:g} s") from None
        tail = ((out.stdout + out.stderr).strip().splitlines() or ["no output"])[-1]
        if out.returncode != 0:
            raise RecordFailed(f"the recording run exited {out.returncode}: {tail}")
        if not os.path.isfile(file):
            raise RecordFailed(f"the recording run drew no case: {tail}")
        return [r for r in record_mode.read(file) if r["backend"] == backend]


def _unrecorded_cases(profile: str) -> list:
    """fa4_precompile's reachable cases for what record mode does not reach (see UNRECORDED_TESTS)."""
    from harness.run.speed.warmup.fa4 import MODEL_SOFT_CAPS, variant_cases
    from harness.search.profiles import SIZES

    graph_modes = {str(m) for m in _backend("fa4").capabilities.graph_modes}
    return [
        c
        for c in variant_cases(SIZES[profile])
        if c.soft_cap in MODEL_SOFT_CAPS
        or (str(c.mode) in graph_modes | {"EXTEND"} and max(r.extend_len for r in c.requests) <= GRAPH_ROWS)
    ]


def recorded_groups(
    library: str, recorded: list[dict], key: Callable, neighbours: tuple[int, int]
) -> list[Variant]:
    """One variant per `key` of the recorded cases: its task runs every case of the group as its
    check would (the forward, or the invariance check's batches), in one worker."""
    groups: dict[tuple, list] = {}
    for r in recorded:
        groups.setdefault(key(r["case"]), []).append((r["kind"], r["case"]))
    return [
        Variant(library, f"{_describe(c[0][1])} ({len(c)} drawn)", RecordedTask(tuple(c), neighbours))
        for c in groups.values()
    ]


_NOTES: dict[str, str] = {}  # library -> the line its variants' listing left (Library.note)


def fa4_variants(profile: str) -> list[Variant]:
    """The groups of the cases a check will draw (record mode), plus the graph replay and model
    check variants; the full reachable list when the recording run fails (one line says why)."""
    from harness.checks.invariance import neighbour_sizes
    from harness.run.speed.warmup.fa4 import variant_cases
    from harness.search.profiles import SIZES

    fa4 = _backend("fa4")
    _NOTES.pop("fa4", None)
    try:
        recorded = record_cases(profile, "fa4")
    except RecordFailed as e:
        _NOTES["fa4"] = f"{e}; compiling every reachable variant instead"
        cases = [c for c in variant_cases(SIZES[profile]) if fa4.supports(c) is None]
        return [Variant("fa4", _describe(c), RecordedTask((("numeric", c),))) for c in dict.fromkeys(cases)]
    out = recorded_groups("fa4", recorded, fa4_key, neighbour_sizes(SIZES[profile]))
    keys = {fa4_key(r["case"]) for r in recorded}
    extra = [c for c in dict.fromkeys(_unrecorded_cases(profile)) if fa4.supports(c) is None]
    extra = [c for c in extra if fa4_key(c) not in keys]
    _NOTES["fa4"] = (
        f"{len(recorded)} drawn cases in {len(out)} groups (record mode), {len(extra)} more for the graph "
        "replays and the model check"
    )
    return out + [Variant("fa4", _describe(c), RecordedTask((("numeric", c),))) for c in extra]


def fa4_unavailable() -> str | None:
    why = _available("fa4")()
    if why is None and not cache_dir.fa4_enabled():
        why = f"FA4's disk cache is off (${cache_dir.FA4_SWITCH} is not 1): nothing compiled would be kept"
    return why


def run_task(backend: str, task: RecordedTask) -> None:
    """Run one variant's cases on the GPU as their checks do (the forward, or the invariance check's
    batches), or its model check."""
    if task.model is not None:
        from harness.checks.model.check import check_model

        check_model(_backend(backend), task.model, "cuda")
    for kind, case in task.cases:
        if kind == "invariance":
            from harness.checks.invariance import invariance_result

            invariance_result(_backend(backend), case, "cuda", *task.neighbours)
        elif kind == "graph":
            from harness.checks.replay import replay_result

            replay_result(_backend(backend), case, "cuda")
        else:
            _run_on_gpu(_backend(backend), case)


def compile_fa4(task: RecordedTask) -> str:
    """Run one variant's cases as their checks do; COMPILED if CuTe DSL compiled a kernel for any."""
    import cutlass.cute as cute

    original = cute.compile
    calls: list[int] = []

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return original(*args, **kwargs)

    cute.compile = counting
    try:
        run_task("fa4", task)
    finally:
        cute.compile = original
    return COMPILED if calls else CACHED


FA4 = Library(
    name="fa4",
    backends=("fa4",),
    unavailable=fa4_unavailable,
    variants=fa4_variants,
    compile=compile_fa4,
    note=lambda: _NOTES.get("fa4"),
)


# --- flex_compiled ----------------------------------------------------------------------------


def flex_cases(dtype: str, head_dim: int, heads: tuple[int, int], modes: set[str]) -> tuple:
    """One case per mode (and a deterministic one: a launch per request) of one dtype, head_dim and
    heads; the compiled mask and score functions hold every term, so their values do not matter."""
    from harness.core.case import Case, Request

    out = []
    for mode in sorted(modes):
        reqs = tuple(Request(p, e, enc, tree=t) for p, e, enc, t in FLEX_REQUESTS[mode])
        window = 8 if mode == "EXTEND" else -1
        base = Case(mode=mode, requests=reqs, dtype=dtype, head_dim=head_dim, window_left=window)
        base = base.replace(num_q_heads=heads[0], num_kv_heads=heads[1], soft_cap=30.0, sinks=True)
        out.append(base)
        if mode == "EXTEND":
            out.append(base.replace(deterministic=True, sinks=False, soft_cap=0.0))
    return tuple(out)


def flex_shapes(profile: str) -> list[Variant]:
    """Without a recording: per dtype x head_dim x heads of the profile (and of the pinned cases,
    which run in every profile), one case per mode."""
    from harness.core.modes import FAMILIES
    from harness.run.suite import pinned_examples
    from harness.search.profiles import SIZES

    flex = _backend("flex_compiled")
    caps, sizes = flex.capabilities, SIZES[profile]
    modes = {str(m) for m in caps.modes}
    groups = {
        (t, d, h)
        for t, d, h in itertools.product(sizes.dtypes, sizes.head_dims, sizes.heads)
        if t in caps.dtypes and d in caps.head_dims
    }
    for family in FAMILIES:
        for c in pinned_examples(family):
            if flex.supports(c) is None:
                groups.add((c.dtype, c.head_dim, (c.num_q_heads, c.num_kv_heads)))
    out = []
    for t, d, h in sorted(groups):
        cases = tuple(("numeric", c) for c in flex_cases(t, d, h, modes) if flex.supports(c) is None)
        out.append(Variant("flex_compiled", f"{t},d={d},heads={h[0]}/{h[1]}", RecordedTask(cases)))
    return out


def flex_variants(profile: str) -> list[Variant]:
    """The groups of the cases a check will draw (record mode), and each model check whole; one case
    per mode and shape (flex_shapes) when the recording run fails (one line says why). The recording
    also gives the weights that balance the check's variant shards (harness/run/speed/variant_shards.py)."""
    from harness.checks.invariance import neighbour_sizes
    from harness.checks.model.check import MODELS
    from harness.search.profiles import SIZES

    _NOTES.pop("flex_compiled", None)
    models = [Variant("flex_compiled", f"model {m}", RecordedTask(model=m)) for m in MODELS]
    try:
        recorded = record_cases(profile, "flex_compiled", FLEX_UNRECORDED_TESTS)
    except RecordFailed as e:
        _NOTES["flex_compiled"] = f"{e}; one case per mode of each shape instead"
        return flex_shapes(profile) + models
    flex = _backend("flex_compiled")
    variant_shards.save_weights(flex, profile, recorded)  # how the check's shards deal its variants
    out = recorded_groups("flex_compiled", recorded, flex.variant_key, neighbour_sizes(SIZES[profile]))
    graphs = sum(r["kind"] == "graph" for r in recorded)
    _NOTES["flex_compiled"] = (
        f"{len(recorded) - graphs} drawn cases and {graphs} graph replays in {len(out)} groups "
        f"(record mode), {len(models)} model checks"
    )
    return out + models


def compile_flex(task: RecordedTask) -> str:
    """Run one variant's cases (or model check) as their checks do; COMPILED if inductor compiled a
    graph its cache lacked."""
    from torch._dynamo.utils import counters

    before = counters["inductor"]["fxgraph_cache_miss"]
    run_task("flex_compiled", task)
    return COMPILED if counters["inductor"]["fxgraph_cache_miss"] > before else CACHED


def flex_env(jobs: int) -> dict[str, str]:
    """One inductor compile thread per worker: the pool is the parallelism, and inductor would start
    a process per core in each worker. The setting is not part of inductor's cache key, so the
    check's processes find what these workers compiled."""
    return {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


FLEX = Library(
    name="flex_compiled",
    backends=("flex_compiled",),
    unavailable=_available("flex_compiled"),
    variants=flex_variants,
    compile=compile_flex,
    env=flex_env,
    note=lambda: _NOTES.get("flex_compiled"),
)

# --- the engines' FlashInfer: sglang_flashinfer, vllm_flashinfer --------------------------------


@dataclass(frozen=True, kw_only=True)
class EngineModules:
    """What an engine's FlashInfer attention backend plans that selects the modules it loads, beyond
    what every engine's does (a captured graph's wrappers, dtype, head_dim, the KV cache's dtype, a
    window): how it classes a case's mode (`mode`), and whether the soft cap, determinism, a cached
    prefix or grouped query heads each select a module of their own."""

    mode: Callable[[object], object]
    soft_cap: bool = False
    deterministic: bool = False
    prefix: bool = False
    grouped: bool = False


def engine_flashinfer_key(case, modules: EngineModules) -> tuple:  # noqa: ANN001 - a Case or a GraphCase
    """The group of a case, or of a graph's layer: cases of one key load the same FlashInfer modules."""
    from harness.core.graph_case import GraphCase

    graph = isinstance(case, GraphCase)
    c = case.layer if graph else case
    return (
        graph, modules.mode(c), c.dtype, c.head_dim, c.kv_dtype, c.window_left >= 0,
        modules.soft_cap and c.soft_cap > 0,
        modules.deterministic and c.deterministic,
        modules.prefix and any(r.prefix_len for r in c.requests),
        modules.grouped and c.num_q_heads // c.num_kv_heads >= 4,
    )


# sglang's FlashInferAttnBackend: its ragged wrapper (backend "auto": FA3's sm90 module on Hopper, which
# the core warm-up, all fa2, never builds) unless deterministic, the paged wrappers (fa2, of the KV
# cache's dtype; a window's module when deterministic), merge_state after a cached prefix, the decode
# wrapper (tensor cores from 4 query heads per KV head, or an FP8 cache), a custom mask's packbits
# (verify, a windowed prefix): each mode plans its own. Its soft cap selects nothing: sglang plans
# without it.
SGLANG_MODULES = EngineModules(mode=lambda c: str(c.mode), deterministic=True, prefix=True, grouped=True)


def vllm_split(case) -> tuple[bool, bool]:  # noqa: ANN001 - a Case
    """(decodes, prefills): which of its wrappers vLLM's FlashInferMetadataBuilder plans for a batch,
    by vLLM's split of the batch (judged_inputs.prefill_requests, the rule its FP8 query cast follows)."""
    prefills = prefill_requests([r.extend_len for r in case.requests])
    return not all(prefills), any(prefills)


# vLLM's FlashInferMetadataBuilder (0.26.0): decodes through its tensor-core decode wrapper (the
# module of the query and KV dtypes, `use_tensor_cores=True` whatever the heads), prefills through the
# paged prefill wrapper (backend "auto": FA3's sm90 module on Hopper), queries in FP8 for an FP8 cache's
# prefills; both planned with the layer's `logits_soft_cap` and `window_left`, which name modules of
# their own. No ragged wrapper, so a cached prefix selects nothing; no batch invariance declared.
VLLM_MODULES = EngineModules(mode=vllm_split, soft_cap=True)


def sglang_flashinfer_key(case) -> tuple:  # noqa: ANN001 - a Case or a GraphCase
    return engine_flashinfer_key(case, SGLANG_MODULES)


def vllm_flashinfer_key(case) -> tuple:  # noqa: ANN001 - a Case or a GraphCase
    return engine_flashinfer_key(case, VLLM_MODULES)


def _fallback(backend: str, profile: str, shapes: Callable) -> list:
    """Per dtype x head_dim of the profile and KV cache dtype, the cases `shapes(base)` gives from an
    extend of 24 tokens after 40, those `backend` supports."""
    from harness.core.case import Case, Request
    from harness.run.speed.warmup.flashinfer import KV_CACHES, profile_variants

    engine = _backend(backend)
    out = []
    for (dtype, head_dim), kv in itertools.product(profile_variants(profile), KV_CACHES):
        fp8 = {"kv_dtype": kv, "k_scale": 0.5, "v_scale": 2.0} if kv else {}
        base = Case(mode="EXTEND", requests=(Request(40, 24),), dtype=dtype, head_dim=head_dim, **fp8)
        out += [c for c in shapes(base) if engine.supports(c) is None]
    return out


def sglang_flashinfer_fallback(profile: str) -> list:
    """Without a recording: an extend after a prefix and one without, a grouped and an ungrouped
    decode, a deterministic windowed extend and a verify tree."""
    from harness.core.case import Request

    def shapes(base) -> tuple:  # noqa: ANN001 - a Case
        return (
            base,
            base.replace(requests=(Request(0, 24),)),
            base.replace(mode="DECODE", requests=(Request(40, 1),)),
            base.replace(mode="DECODE", requests=(Request(40, 1),), num_q_heads=4, num_kv_heads=4),
            base.replace(window_left=8, deterministic=True),
            base.replace(mode="TARGET_VERIFY", requests=(Request(40, 4, tree=(-1, 0, 0, 1)),)),
        )

    return _fallback("sglang_flashinfer", profile, shapes)


def vllm_flashinfer_fallback(profile: str) -> list:
    """Without a recording: a decode and an extend, each without and with a soft cap and a window."""
    from harness.core.case import Request

    def shapes(base) -> tuple:  # noqa: ANN001 - a Case
        decode = base.replace(mode="DECODE", requests=(Request(40, 1),))
        return tuple(
            c.replace(**extra)
            for c in (decode, base)
            for extra in ({}, {"soft_cap": 30.0}, {"window_left": 8})
        )

    return _fallback("vllm_flashinfer", profile, shapes)


def engine_flashinfer_variants(
    backend: str, key: Callable, fallback: Callable, profile: str
) -> list[Variant]:
    """An engine's FlashInfer backend's recorded cases (graph replays included; the model check left
    out) grouped by `key`, the modules they load; `fallback(profile)`'s cases when the recording run
    fails (one line says why)."""
    from harness.checks.invariance import neighbour_sizes
    from harness.search.profiles import SIZES

    _NOTES.pop(backend, None)
    try:
        recorded = record_cases(profile, backend, FLEX_UNRECORDED_TESTS)
    except RecordFailed as e:
        _NOTES[backend] = f"{e}; compiling a fixed list of cases instead"
        return [Variant(backend, _describe(c), RecordedTask((("numeric", c),))) for c in fallback(profile)]
    out = recorded_groups(backend, recorded, key, neighbour_sizes(SIZES[profile]))
    _NOTES[backend] = f"{len(recorded)} drawn cases in {len(out)} groups (record mode)"
    return out


def compile_engine_flashinfer(backend: str, task: RecordedTask) -> str:
    """Run one variant's cases as their checks do; COMPILED if a FlashInfer module appeared in the JIT
    cache meanwhile."""
    before = set(flashinfer_warmup.list_modules())
    run_task(backend, task)
    return COMPILED if set(flashinfer_warmup.list_modules()) - before else CACHED


ENGINE_NVCC_JOBS = 4  # nvcc jobs of each engine warm-up worker's FlashInfer build


def engine_processes(jobs: int) -> int:
    """Workers for `jobs` cores: each builds the modules its cases meet through FlashInfer's own ninja,
    ENGINE_NVCC_JOBS at a time (engine_env), so that together they run about `jobs` nvcc. One worker
    per core, each ninja running cores + 2, kept 16 workers and over a hundred nvcc on a 16-core host."""
    return max(1, jobs // ENGINE_NVCC_JOBS)


def engine_env(jobs: int) -> dict[str, str]:
    """MAX_JOBS for the workers' FlashInfer builds, unless the user set it."""
    return {} if NVCC_JOBS in os.environ else {NVCC_JOBS: str(min(jobs, ENGINE_NVCC_JOBS))}


def engine_flashinfer_library(backend: str, key: Callable, fallback: Callable) -> Library:
    """The warm-up library of one engine's FlashInfer backend, named after it."""
    return Library(
        name=backend,
        backends=(backend,),
        unavailable=_available(backend),
        variants=functools.partial(engine_flashinfer_variants, backend, key, fallback),
        compile=functools.partial(compile_engine_flashinfer, backend),
        processes=engine_processes,
        env=engine_env,
        note=lambda: _NOTES.get(backend),
    )


SGLANG_FLASHINFER = engine_flashinfer_library(
    "sglang_flashinfer", sglang_flashinfer_key, sglang_flashinfer_fallback
)
VLLM_FLASHINFER = engine_flashinfer_library("vllm_flashinfer", vllm_flashinfer_key, vllm_flashinfer_fallback)

LIBRARIES = (FLASHINFER, FA4, FLEX, SGLANG_FLASHINFER, VLLM_FLASHINFER)
