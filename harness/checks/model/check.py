"""The model-level check: per-token logprobs of tiny random HF models, served through a backend.

Gemma2-, GPT-OSS- and Mistral-like models built offline run a scenario (prefill, prefix reuse,
decode past the window, DRAFT_EXTEND_V2, verify chain and tree) with attention routed to a backend
over a persistent paged cache (engine.py beside it); each logprob is judged against the model's
own forward by the project's tolerance rule, and in deterministic mode must not move with the batch
composition. Models, dtypes and the rule applied to logprobs: docs/hf_and_models.md.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.backends.base import Backend
from harness.checks.known_issues import excuse
from harness.checks.model.engine import Work
from harness.checks.model.serving import (
    ATTN_NAME,
    Item,
    Key,
    Phase,
    Run,
    ServeError,
    one_per_forward,
    per_request_dense,
    register,
    reversed_order,
    serve,
    together,
)
from harness.core.compare import noise
from harness.core.modes import Mode
from harness.core.results import test_record
from harness.core.transfer import to_device
from harness.core.vocab import CASE_FEATURES, DTYPE_NAMES

PAGE_SIZE_PREFERENCE = (16, 32, 64, 128, 1)


# --- the tiny models --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    name: str
    what: str
    config: Callable[[], object]  # builds the transformers config
    soft_cap: bool = False
    features: tuple[str, ...] = ("window",)  # vocab.CASE_FEATURES its attention layers use

    def build(self, dtype: torch.dtype, device: str, seed: int = 0) -> torch.nn.Module:
        """The randomly initialised model (seeded), eager attention, in `dtype` on `device`."""
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(self.config(), attn_implementation="eager")
        if hasattr(model, "set_experts_implementation"):
            set_experts(model)
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "sinks"):  # GPT-OSS: sinks large enough to take real probability mass
                    m.sinks.normal_(0.0, 1.5)
        return model.to(device=device, dtype=dtype).eval()


EXPERTS = ("batched_mm", "eager")  # transformers' experts functions that run in any dtype on any device


def set_experts(model: torch.nn.Module) -> str:
    """Run the model's experts by the first of EXPERTS this transformers has, and name it: `batched_mm`
    (every token's experts in one batched matmul), else `eager`. Eager loops over the experts hit, and
    each step asks the device which tokens chose it (nonzero, a tensor compared in Python): 17,898 host
    syncs in a GPT-OSS model check on an H200 against 1,310, and beside 7 busy processes on the GPU
    21-23 s against 2.9 s (docs/performance.md)."""
    for name in EXPERTS[:-1]:
        try:
            model.set_experts_implementation(name)
        except (ValueError, KeyError):
            continue
        return name
    model.set_experts_implementation(EXPERTS[-1])
    return EXPERTS[-1]


def _common(sliding_window: int) -> dict:
    # Heads as the gpu profile draws them (8 q / 2 kv, head_dim 128, bf16 on the GPU), so no new
    # kernel variant compiles for this check; a large init so that attention decides the logits.
    return dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        sliding_window=sliding_window,
        initializer_range=0.25,
        max_position_embeddings=4096,
    )


def _gemma2():  # noqa: ANN202
    from transformers import Gemma2Config

    return Gemma2Config(
        **_common(16), attn_logit_softcapping=4.0, final_logit_softcapping=30.0, query_pre_attn_scalar=64
    )


def _gpt_oss():  # noqa: ANN202
    from transformers import GptOssConfig

    return GptOssConfig(**_common(12), num_local_experts=4, num_experts_per_tok=4)


def _mistral():  # noqa: ANN202
    from transformers import MistralConfig

    return MistralConfig(**_common(8))


MODELS = {
    m.name: m
    for m in (
        TinyModel(
            name="gemma2",
            what="Gemma2-like: sliding/full alternating, soft cap 4, sm_scale 1/8",
            config=_gemma2,
            soft_cap=True,
            features=("window", "soft_cap"),
        ),
        TinyModel(
            name="gpt_oss",
            what="GPT-OSS-like: sliding/full alternating, sinks, 4 experts",
            config=_gpt_oss,
            features=("window", "sinks"),
        ),
        TinyModel(name="mistral", what="Mistral-like: every layer sliding (window 8)", config=_mistral),
    )
}


# --- the exact reference ----------------------------------------------------------------------

EXACT_NAME = "attn_harness_eager_exact"


def _exact_attention(module, query, key, value, attention_mask, scaling=None, softcap=None, s_aux=None, **_):  # noqa: ANN001, ANN202, E501
    """Eager attention that stays in the model's dtype through the softmax: Gemma2's and Mistral's
    eager functions upcast only to float32, which would cap a float64 model at float32 accuracy."""
    from references.hf_ref import eager_attention  # imports transformers: only once it is needed

    return eager_attention(query, key, value, attention_mask, scaling, softcap or 0.0, s_aux), None


def exact_model(eager: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of the model in `dtype` whose attention is hf_ref's eager attention (transformers'
    eager mask builder; GPT-OSS's eager function, Gemma2's cap), so float64 means float64."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EXACT_NAME, _exact_attention)
    AttentionMaskInterface.register(EXACT_NAME, eager_mask)
    model = copy.deepcopy(eager).to(dtype)
    model.set_attn_implementation(EXACT_NAME)
    return model


def _eager_in(dtype: torch.dtype) -> Callable:
    """The model's own eager attention function, run on q, k, v (and the mask) cast to `dtype`."""

    def attention(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        mask = None if attention_mask is None else attention_mask.to(dtype)
        out, _ = eager(module, query.to(dtype), key.to(dtype), value.to(dtype), mask, **kwargs)
        return out.to(query.dtype), None

    return attention


def native_model(eager: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of the model whose attention is its own eager function in `dtype` (the attention
    dtype of the run); with `dtype` the model's own, this is the eager model itself."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    name = f"attn_harness_eager_{DTYPE_NAMES[dtype]}"
    AttentionInterface.register(name, _eager_in(dtype))
    AttentionMaskInterface.register(name, eager_mask)
    model = copy.deepcopy(eager)
    model.set_attn_implementation(name)
    return model


# --- the scenario -----------------------------------------------------------------------------


CHAIN = (-1, 0, 1, 2)
TREE = (-1, 0, 0, 1, 1, 2)
NUM_DRAFT = 3


def tree_paths(ctx: tuple[int, ...], nodes: list[int], tree: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each draft's sequence: the context, then the draft tokens from the root down to it."""
    paths = []
    for j in range(len(tree)):
        path, a = [], j
        while a >= 0:
            path.append(nodes[a])
            a = tree[a]
        paths.append(ctx + tuple(reversed(path)))
    return tuple(paths)


def scenario(page_size: int, window: int, vocab: int, seed: int = 0, neighbour: bool = False) -> list[Phase]:
    """Requests A and B (and, with `neighbour`, a longer unrelated C) through every engine step.

    A's prompt binds the window and spans two pages; B starts from A's cached prefix (whole pages)
    and is batched with A's next chunk; then decode steps until the window has slid past all of
    them, a DRAFT_EXTEND_V2 step, and verify steps over a chain and a tree of drafts.
    """
    ps, s = page_size, window
    rngs: dict[str, random.Random] = {}

    def toks(rid: str, n: int) -> list[int]:  # one stream per request: C leaves A and B unchanged
        rng = rngs.setdefault(rid, random.Random(f"{seed}/{rid}"))
        return [rng.randrange(vocab) for _ in range(n)]

    a_prompt = max(2 * ps, s) + s // 2 + 3
    shared = a_prompt - 3
    reuse = shared // ps * ps
    n_decode = s + 2
    seqs = {"A": toks("A", a_prompt + s + 3 + n_decode + NUM_DRAFT + 1)}
    seqs["B"] = seqs["A"][:shared] + toks("B", s // 2 + 5 + n_decode + NUM_DRAFT + 1)
    first = {"A": (0, a_prompt), "B": (reuse, shared + s // 2 + 5)}
    second = {"A": s + 3}
    if neighbour:
        seqs["C"] = toks("C", 3 * s + 7 + ps + 5 + n_decode + NUM_DRAFT + 1)
        first["C"] = (0, 3 * s + 7 + ps)
        second["C"] = 5
    length = dict.fromkeys(seqs, 0)

    def linear(rid: str, n: int, **start) -> Item:  # noqa: ANN003
        p = length[rid] if not start else start["reuse"]
        seq = seqs[rid]
        length[rid] = p + n
        return Item(
            Work(rid=rid, tokens=tuple(seq[p : p + n]), **start),
            tuple(seq[p + 1 : p + n + 1]),
            tuple(tuple(seq[: p + j + 1]) for j in range(n)),
        )

    def drafts(rid: str, tree: tuple[int, ...]) -> Item:
        nodes = toks(rid, len(tree))
        paths = tree_paths(tuple(seqs[rid][: length[rid]]), nodes, tree)
        return Item(Work(rid=rid, tokens=tuple(nodes), tree=tree), tuple(toks(rid, len(tree))), paths)

    others = [r for r in seqs if r != "B"]
    phases = [Phase("prefill", Mode.EXTEND, tuple(linear(r, first[r][1]) for r in others))]
    b0, b1 = first["B"]
    chunk = [linear("B", b1 - b0, parent="A", reuse=b0)] + [linear(r, second[r]) for r in others]
    phases.append(Phase("prefix+chunk", Mode.EXTEND, tuple(chunk)))
    for i in range(n_decode):
        phases.append(Phase(f"decode {i + 1}", Mode.DECODE, tuple(linear(r, 1) for r in seqs)))
    phases.append(Phase("draft_extend", Mode.DRAFT_EXTEND_V2, tuple(linear(r, NUM_DRAFT) for r in seqs)))
    phases.append(Phase("verify chain", Mode.TARGET_VERIFY, tuple(drafts(r, CHAIN) for r in seqs)))
    phases.append(Phase("verify tree", Mode.TARGET_VERIFY, tuple(drafts(r, TREE) for r in seqs)))
    return phases


def reference_logprobs(
    model: torch.nn.Module, phases: list[Phase], device: str, whole: bool = True
) -> dict[Key, float]:
    """Every query's logprob from the eager model. `whole`: one forward per sequence that is not a
    prefix of another (a causal model's logits at p see tokens 0..p only); otherwise one forward
    per query over the sequence that ends with it (other shapes, so other rounding)."""
    queries = [
        ((it.work.rid, ph.name, j), it.prefixes[j], it.targets[j])
        for ph in phases
        for it in ph.items
        for j in range(len(it.work.tokens))
    ]
    seqs = sorted({q[1] for q in queries}, key=len, reverse=True)
    cover: dict[tuple[int, ...], tuple[int, ...]] = {}
    for s in seqs:
        cover[s] = next(long for long in seqs if len(long) >= len(s) and long[: len(s)] == s) if whole else s
    lps: dict[tuple[int, ...], torch.Tensor] = {}
    for s in {cover[s] for s in seqs}:
        ids = to_device(np.asarray(s, dtype=np.int64), device)[None]
        with torch.no_grad():
            lps[s] = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].double(), -1).cpu()
    return {key: float(lps[cover[seq]][len(seq) - 1, tgt]) for key, seq, tgt in queries}


# --- judging ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class ModelResult:
    model: str
    backend: str
    device: str
    status: str  # pass, fail, xfail (a known library bug), skip, crash
    reason: str
    dtype: str = ""  # attention dtype / model (dense layers) dtype
    tokens: int = 0  # logprobs compared (queries whose forward ran on the backend)
    differing: int = 0
    worst_diff: float = 0.0
    budget: float = 0.0
    worst: str = ""
    deterministic: str = "not checked"
    fallback: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """Its results.json record (docs/reports.md): family `model`, no Case; err, budget and their
        ratio as the verdict (the worst logprob difference and its budget), the rest in `extra`."""
        checked = self.deterministic not in ("not checked", "not requested") and self.status != "skip"
        used = {*MODELS[self.model].features, *(("deterministic",) if checked else ())}
        ratio = self.worst_diff / self.budget if self.budget else None
        verdict = {"err": self.worst_diff, "budget": self.budget, "ratio": ratio} if self.tokens else None
        extra = {
            "check": "model_logprobs",
            "model": self.model,
            "dtype": self.dtype,
            "tokens": self.tokens,
            "differing": self.differing,
            "worst": self.worst,
            "deterministic": self.deterministic,
            "fallback": self.fallback,
        }
        return test_record(
            self.status,
            self.backend,
            self.device,
            "model",
            self.reason,
            "",
            [f for f in CASE_FEATURES if f in used],
            verdict=verdict,
            seconds=round(self.seconds, 6),
            extra=extra,
        )

    def row(self) -> str:
        return (
            f"{self.model:<8} {self.backend:<20} {self.device:<5} {self.dtype:<17} {self.status:<5} "
            f"{self.tokens:>6} {self.differing:>5} {self.worst_diff:>10.3g} {self.budget:>10.3g}  "
            f"{self.deterministic}"
        )


TABLE_HEAD = (
    f"{'model':<8} {'backend':<20} {'dev':<5} {'attn/model dtype':<17} {'stat':<5} {'tokens':>6} {'diff':>5} "
    f"{'worst|dlp|':>10} {'budget':>10}  deterministic"
)


def fallback_summary(fallback: dict[str, str]) -> str:
    """Steps served by torch_native, grouped by the reason the backend could not serve them."""
    by_reason: dict[str, list[str]] = {}
    for step, reason in fallback.items():
        by_reason.setdefault(reason, []).append(step)
    return "; ".join(f"{', '.join(steps)}: {reason}" for reason, steps in by_reason.items())


def no_step_mode(backend: Backend) -> str | None:
    """Why the backend can serve no step of any model, known before a model is built: it implements
    none of the modes the scenario's steps run in. Serving would fall back to torch_native on every
    step and end in the same skip, after building the models and running them (10.5 s on an H200)."""
    modes = {p.mode for p in scenario(PAGE_SIZE_PREFERENCE[0], 4, 2)}
    if modes & backend.capabilities.modes:
        return None
    names = ", ".join(sorted(str(m) for m in modes))
    return f"the backend serves no step of this model: {backend.name} implements none of its modes ({names})"


def choose_layout(backend: Backend) -> tuple[int, str]:
    caps = backend.capabilities
    page = next((p for p in PAGE_SIZE_PREFERENCE if p in caps.page_sizes), min(caps.page_sizes))
    return page, ("NHD" if "NHD" in caps.kv_layouts else sorted(caps.kv_layouts)[0])


def judge(
    spec: TinyModel, run: Run, exact: dict[Key, float], natives: list[dict[Key, float]], dtype: str
) -> tuple:
    """(differing, n, worst diff, budget, where) under the rule in this module's docstring."""
    keys = sorted(run.own)
    ref = torch.tensor([exact[k] for k in keys], dtype=torch.float64)
    test = torch.stack([run.logprobs[k] for k in keys]).double()
    native_err = max(max(abs(nat[k] - exact[k]) for k in keys) for nat in natives)
    mult = 3.0 if spec.soft_cap else 2.0
    budget = mult * native_err + noise(ref, dtype)
    diff = (test - ref).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, torch.inf), diff)
    i = int(diff.argmax())
    rid, phase, j = keys[i]
    where = f"request {rid}, {phase}, query {j}: test {float(test[i]):.6g} vs exact {float(ref[i]):.6g}"
    return int((diff > budget).sum()), len(keys), float(diff[i]), budget, where


def check_determinism(model, backend, phases_n, device, page, layout, dtype) -> str:  # noqa: ANN001
    """Each of A's and B's logprobs bitwise equal across batch compositions (deterministic mode)."""
    runs = {}
    with per_request_dense(model):
        for name, phases, compose in (
            ("together", phases_n[0], together),
            ("one request per forward", phases_n[0], one_per_forward),
            ("reversed, with a long neighbour", phases_n[1], reversed_order),
        ):
            runs[name] = serve(model, backend, phases, compose, device, True, page, layout, dtype)
    base = runs["together"]
    keys = sorted(k for k in base.logprobs if k[0] in ("A", "B"))
    for name, run in runs.items():
        moved = [k for k in keys if not torch.equal(run.logprobs[k], base.logprobs[k])]
        if moved:
            d = max(abs(float(run.logprobs[k]) - float(base.logprobs[k])) for k in moved)
            return f"FAIL: {len(moved)} of {len(keys)} logprobs changed in '{name}' (max {d:.3g})"
    return f"bitwise equal across {len(runs)} batch compositions"


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """One intra-op thread: these ops are tiny, and on a busy CPU extra threads only spin-wait."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_model(
    backend: Backend,
    model_name: str,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    model_dtype: torch.dtype = torch.float32,
    determinism: bool = True,
) -> ModelResult:
    """Serve `model_name` through `backend` and compare every query's logprob with the eager model;
    then, if the backend has a deterministic mode (and `determinism`), check batch invariance.

    `dtype` is attention's (what the backend computes in; default bf16 on CUDA, float32 on the CPU),
    `model_dtype` the weights' and dense layers'. Float32 dense layers keep the budget about attention:
    in bf16 they would dominate it (and bf16 rounding flips GPT-OSS's expert choices).
    """
    attn = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    with single_threaded() if device == "cpu" else contextlib.nullcontext():
        return _check_model(backend, model_name, device, attn, model_dtype, determinism)


def _why_not(backend: Backend, device: str, attn: torch.dtype) -> str | None:
    """Why the model check cannot run here: the backend, the attention dtype, no step mode, no
    transformers; None when it can."""
    why = backend.available(device)
    if why is None and DTYPE_NAMES[attn] not in backend.capabilities.dtypes:
        why = f"{backend.name} does not support dtype {DTYPE_NAMES[attn]}"
    if why is None:
        why = no_step_mode(backend)
    if why is None:
        try:
            import transformers  # noqa: F401
        except ImportError:
            why = "transformers is not installed (the `hf` extra)"
    return why


def _determinism(
    served: torch.nn.Module,
    backend: Backend,
    both: tuple[list[Phase], list[Phase]],
    device: str,
    page: int,
    layout: str,
    attn: torch.dtype,
) -> str:
    """check_determinism's verdict, a crash in it read as a failure."""
    try:
        return check_determinism(served, backend, both, device, page, layout, attn)
    except ServeError as e:
        return f"FAIL: crashed in {e}"


def _three_models(
    spec: TinyModel, dense: torch.dtype, attn: torch.dtype, device: str
) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """One random model as the exact reference (upcast), the same-precision one (native), and the
    copy whose attention the backend serves."""
    register()
    eager = spec.build(dense, device)
    upcast = exact_model(eager, torch.float64 if device == "cpu" else torch.float32)
    native = native_model(eager, attn)
    served = copy.deepcopy(eager)
    served.set_attn_implementation(ATTN_NAME)
    return upcast, native, served


def _mark_known_bug(res: ModelResult, backend_name: str, served: list, device: str) -> None:
    """A failure that a known library bug explains, reached and confirmed on a layer call of this
    model: xfail."""
    if res.status != "fail":
        return
    for case in served:
        excused, reason = excuse(backend_name, case, res.reason, device)
        if excused:
            res.status, res.reason = "xfail", reason
            return


def _check_model(
    backend: Backend,
    model_name: str,
    device: str,
    attn: torch.dtype,
    dense: torch.dtype,
    determinism: bool,
) -> ModelResult:
    start = time.perf_counter()
    spec = MODELS[model_name]
    res = ModelResult(
        model=model_name,
        backend=backend.name,
        device=device,
        status="skip",
        reason="",
        dtype=f"{DTYPE_NAMES[attn]}/{DTYPE_NAMES[dense]}",
    )
    why = _why_not(backend, device, attn)
    if why:
        res.reason = why
        return res
    upcast, native, served = _three_models(spec, dense, attn, device)
    page, layout = choose_layout(backend)
    window = served.config.sliding_window
    phases = scenario(page, window, served.config.vocab_size)
    try:
        run = serve(served, backend, phases, together, device, False, page, layout, attn)
    except ServeError as e:
        res.status, res.reason = "crash", f"crashed in {e}"
        return res
    res.fallback = run.fallback
    if not run.own:
        res.reason = "the backend served no step of this model: " + fallback_summary(run.fallback)
        return res
    exact = reference_logprobs(upcast, phases, device)
    natives = [reference_logprobs(native, phases, device, whole) for whole in (True, False)]
    k, n, worst, budget, where = judge(spec, run, exact, natives, DTYPE_NAMES[dense])
    res.tokens, res.differing, res.worst_diff, res.budget, res.worst = n, k, worst, budget, where
    res.status = "pass" if k == 0 else "fail"
    res.reason = (
        f"{k} of {n} logprobs differ beyond tolerance {budget:.3g}; worst: {where} (|diff| {worst:.3g})"
    )
    if run.fallback:
        res.reason += f"; steps on torch_native: {fallback_summary(run.fallback)}"
    if not determinism:
        res.deterministic = "not requested"
    elif backend.capabilities.deterministic:
        both = (phases, scenario(page, window, served.config.vocab_size, neighbour=True))
        res.deterministic = _determinism(served, backend, both, device, page, layout, attn)
        if res.deterministic.startswith("FAIL"):
            res.status = "fail"
            res.reason += "; deterministic mode: " + res.deterministic
    else:
        res.deterministic = backend.capabilities.reason("deterministic", "no deterministic mode")
    _mark_known_bug(res, backend.name, run.served, device)
    res.seconds = time.perf_counter() - start
    return res
