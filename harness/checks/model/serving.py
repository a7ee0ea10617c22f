"""Serving a transformers model as an engine does: attention on a backend over a paged KV cache.

The model's attention is routed, through transformers' AttentionInterface, to a Runner that turns
each layer's call into a harness Batch over the persistent cache of engine.py (beside it) and runs the
backend under test on it. `serve` drives a scenario (phases of per-request work) through the model
in a given batch composition and collects each query's log-probability of its target token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np
import torch

from harness import backends
from harness.backends.base import Backend
from harness.checks.model.engine import PagedKVCache, Step, Work
from harness.core import pool
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.transfer import settle, to_device
from harness.core.vocab import DTYPE_NAMES

ATTN_NAME = "attn_harness_paged"

_RUNNER: ContextVar[Runner | None] = ContextVar("attn_harness_runner", default=None)


def _paged_attention(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
    """transformers' attention-function signature -> the active Runner (the engine's forward)."""
    runner = _RUNNER.get()
    if runner is None:
        raise RuntimeError(f"{ATTN_NAME} called outside a harness Runner")
    return runner.attend(module, query, key, value, **kwargs), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _paged_attention)


class Runner:
    """The engine's side of one model: cache, the step being run, and the backend per layer.

    A layer whose case the backend does not support runs on `fallback` (torch_native), as an engine
    mixes backends per mode; tokens of a forward that needed the fallback are not the backend's.
    """

    def __init__(
        self,
        backend: Backend,
        fallback: Backend,
        cache: PagedKVCache,
        deterministic: bool,
        dtype: torch.dtype,
    ) -> None:
        self.backend, self.fallback, self.cache = backend, fallback, cache
        self.deterministic = deterministic
        self.dtype = dtype  # attention's dtype: q, k, v are cast to it (the model may be wider)
        self.step: Step | None = None
        self.bounds: list[int] = []  # the step's qo_indptr as ints
        self.fell_back: list[str] = []  # reasons, for the current forward
        self.served: list[Case] = []  # the layer calls the backend itself ran

    def case(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        scaling: float | None,
        sliding_window: int | None,
        softcap: float | None,
        sinks: torch.Tensor | None,
    ) -> Case:
        """The Case of this layer's call: the step's requests, the layer's window, cap and sinks."""
        step = self.step
        return Case(
            mode=step.mode,
            requests=step.requests,
            num_q_heads=query.shape[1],
            num_kv_heads=key.shape[1],
            head_dim=query.shape[-1],
            dtype=DTYPE_NAMES[self.dtype],
            window_left=sliding_window - 1 if sliding_window else -1,  # HF: S keys = W + 1
            soft_cap=float(softcap or 0.0),
            sinks=sinks is not None,
            sm_scale=float(scaling) if scaling is not None else None,
            page_size=self.cache.page_size,
            kv_layout=self.cache.pools[0].kv_layout,
            deterministic=self.deterministic,
        )

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        s_aux: torch.Tensor | None = None,
        **_: object,
    ) -> torch.Tensor:
        """query [1, Hq, N, D], key/value [1, Hkv, N, D] (this forward's tokens) -> [1, N, Hq, D]."""
        case = self.case(query, key, scaling, sliding_window, softcap, s_aux)
        backend = self.backend
        why = backend.supports(case)
        if why:
            self.fell_back.append(why)
            backend = self.fallback
        else:
            self.served.append(case)
        q, k, v = (t[0].transpose(0, 1).to(self.dtype).contiguous() for t in (query, key, value))
        sinks = s_aux.detach().float() if s_aux is not None else None
        batch = self.cache.batch(self.step, case, module.layer_idx, q, k, v, sinks)
        return backend.run(batch).out.to(query.dtype).unsqueeze(0)


@contextlib.contextmanager
def per_request_dense(model: torch.nn.Module) -> Iterator[None]:
    """Run every module that owns weights (but attention and embeddings) on one request at a time.

    A matmul's or a norm's rounding can depend on how many rows it is given (cuBLAS picks kernels by
    shape). Given only one request's tokens, a request's dense layers compute the same bits in any
    batch composition, so only attention, the thing under test, sees the batch.
    """
    patched = []
    for m in model.modules():
        owns = any(p is not None for p in m._parameters.values())
        if not owns or isinstance(m, torch.nn.Embedding) or hasattr(m, "q_proj"):
            continue
        m.forward = _per_request(m.forward)
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def _per_request(fn: Callable) -> Callable:
    """Call fn on each request's tokens of the running step; tokens lie along dim ndim - 2 of every
    tensor argument and output (hidden states [1, N, H], MoE rows [N, H])."""

    def part(x, lo, hi):  # noqa: ANN001, ANN202
        return x.narrow(x.ndim - 2, lo, hi - lo) if torch.is_tensor(x) and x.ndim >= 2 else x

    def cat(parts):  # noqa: ANN001, ANN202
        return torch.cat(parts, dim=parts[0].ndim - 2)

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        bounds = _RUNNER.get().bounds
        outs = [fn(*(part(a, lo, hi) for a in args), **kwargs) for lo, hi in zip(bounds, bounds[1:])]
        if isinstance(outs[0], tuple):
            return tuple(cat([o[j] for o in outs]) for j in range(len(outs[0])))
        return cat(outs)

    return wrapper


# --- scenarios and compositions --------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """A request's work in a phase, the token each query's logprob is taken of, and for each query
    the token sequence that ends with it (what the reference runs over)."""

    work: Work
    targets: tuple[int, ...]
    prefixes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Phase:
    name: str
    mode: Mode
    items: tuple[Item, ...]


def together(items: tuple[Item, ...]) -> list[list[Item]]:
    return [list(items)]


def one_per_forward(items: tuple[Item, ...]) -> list[list[Item]]:
    return [[it] for it in items]


def reversed_order(items: tuple[Item, ...]) -> list[list[Item]]:
    return [list(reversed(items))]


class ServeError(RuntimeError):
    """A forward raised (a backend error, an illegal state): names the phase; a crash result."""


Key = tuple[str, str, int]  # (request, phase, query index within the request's work)


@dataclass
class Run:
    logprobs: dict[Key, torch.Tensor] = field(default_factory=dict)  # float32 scalars
    fallback: dict[str, str] = field(default_factory=dict)  # phase -> why the backend could not
    own: set[Key] = field(default_factory=set)  # queries whose forward ran on the backend alone
    served: list[Case] = field(default_factory=list)  # the layer calls the backend ran (known issues)


def token_logprobs(logits: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """[N] float32 on the CPU: row i's log-probability of targets[i], computed one row at a time
    (a row's log_softmax then cannot depend on how many rows the forward had)."""
    return torch.stack([torch.log_softmax(logits[i].float(), dim=-1)[t] for i, t in enumerate(targets)]).cpu()


def cache_for(
    model: torch.nn.Module,
    phases: list[Phase],
    page_size: int,
    kv_layout: str,
    device: str,
    whole_page_loads: bool,
    dtype: torch.dtype,
) -> PagedKVCache:
    """A cache with pages for the most slots each request ever holds (verify: P + num_draft), plus
    unowned spare pages, so that a stray read lands on poison."""
    extent: dict[str, int] = {}
    for ph in phases:
        for it in ph.items:
            held = len(it.prefixes[0]) - 1 + len(it.work.tokens)
            extent[it.work.rid] = max(extent.get(it.work.rid, 0), held)
    owned = sum(-(-n // page_size) for n in extent.values())
    cfg = model.config
    pages = 1 + owned + pool.spare_pages(owned)
    return PagedKVCache(
        cfg.num_hidden_layers,
        pages,
        page_size,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype,
        kv_layout,
        device,
        whole_page_loads,
    )


def serve(
    model: torch.nn.Module,
    backend: Backend,
    phases: list[Phase],
    compose: Callable,
    device: str,
    deterministic: bool = False,
    page_size: int = 16,
    kv_layout: str = "NHD",
    dtype: torch.dtype | None = None,
) -> Run:
    """Run the scenario through the engine with attention on `backend` in `dtype` (default: the
    model's); collect every query's logprob."""
    dtype = dtype or next(model.parameters()).dtype
    wpl = backend.capabilities.whole_page_loads
    cache = cache_for(model, phases, page_size, kv_layout, device, wpl, dtype)
    runner = Runner(backend, backends.load("torch_native"), cache, deterministic, dtype)
    run = Run()
    token = _RUNNER.set(runner)
    try:
        for phase in phases:
            for group in compose(phase.items):
                works = [it.work for it in group]
                runner.step = cache.plan(phase.mode, works)
                runner.bounds = runner.step.cpu_list("qo_indptr")
                runner.fell_back = []
                ids = to_device(np.asarray([t for w in works for t in w.tokens], dtype=np.int64), device)
                pos = runner.step.positions.long()
                try:
                    with torch.no_grad():
                        out = model(input_ids=ids[None], position_ids=pos[None], use_cache=False)
                    settle(device)
                except Exception as e:
                    raise ServeError(f"{phase.name}: {type(e).__name__}: {e}") from e
                cache.finish(runner.step, works)
                lps = token_logprobs(out.logits[0], [t for it in group for t in it.targets])
                keys = [(it.work.rid, phase.name, j) for it in group for j in range(len(it.targets))]
                run.logprobs.update(zip(keys, lps))
                if runner.fell_back:
                    run.fallback.setdefault(phase.name, runner.fell_back[0])
                else:
                    run.own.update(keys)
    finally:
        _RUNNER.reset(token)
    run.served = runner.served
    return run
