"""Case -> Batch: the logical inputs, the paged pool, and the engine metadata a kernel glue sees.

`make_inputs` draws the logical Q/K/V/sinks from the Case's seed; the references compute from
those alone. `build_batch` lays them out the way a serving engine would (pages, slots, metadata),
leaving this forward's new K/V for the adapter to write, as engine glue does. The Batch holds copies:
the Inputs stay with the caller, out of an adapter's reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from harness.core import logits, modes, pool
from harness.core.case import Case
from harness.core.metadata import Metadata, upload_metadata
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES, TORCH_KV_DTYPES


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """The logical tensors of a case, in the case dtype, on the device they were drawn on. What the
    references read. With an FP8 KV cache (`kv_dtype`) K and V are float32: the values the cache's
    codes stand for (code * scale), so the references attend over exactly what the pool holds
    without reading it, and quantization is not counted as error.

    Stored packed, each request's rows after the previous request's: q_all [sum E, Hq, D] and kv_all
    [2, sum T, Hkv, D] (K then V) with T = P + E (encoder length in CROSS), keys in position order
    (verify drafts in flattened order); q[r], k[r], v[r] are request r's rows (views). sinks: [Hq]
    float32 logits, or None. Packed, a GPU draws and lays out a batch in a few launches, not a few
    per request.
    """

    q_all: torch.Tensor
    kv_all: torch.Tensor
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    sinks: torch.Tensor | None

    @classmethod
    def from_requests(
        cls,
        q: Sequence[torch.Tensor],
        k: Sequence[torch.Tensor],
        v: Sequence[torch.Tensor],
        sinks: torch.Tensor | None,
    ) -> Inputs:
        """Pack per-request tensors (q[r]: [E, Hq, D]; k[r], v[r]: [T, Hkv, D])."""
        kv = torch.stack([torch.cat(list(k)), torch.cat(list(v))])
        return cls(
            q_all=torch.cat(list(q)),
            kv_all=kv,
            q_lens=tuple(len(x) for x in q),
            kv_lens=tuple(len(x) for x in k),
            sinks=sinks,
        )

    def with_request(self, at: int, source: Inputs, r: int = 0) -> Inputs:
        """These inputs with request `at` carrying `source`'s request `r` exactly, and `source`'s sinks:
        a request's logical inputs placed in another batch."""
        q, k, v = list(self.q), list(self.k), list(self.v)
        q[at], k[at], v[at] = source.q[r], source.k[r], source.v[r]
        return Inputs.from_requests(q, k, v, source.sinks)

    @cached_property
    def q(self) -> tuple[torch.Tensor, ...]:
        return self.q_all.split(self.q_lens)

    @cached_property
    def k(self) -> tuple[torch.Tensor, ...]:
        return self.kv_all[0].split(self.kv_lens)

    @cached_property
    def v(self) -> tuple[torch.Tensor, ...]:
        return self.kv_all[1].split(self.kv_lens)


def kv_len(case: Case, r: int) -> int:
    """Logical number of keys of request r (what the reference attends over)."""
    req = case.requests[r]
    return req.encoder_len if case.mode == Mode.CROSS else req.prefix_len + req.extend_len


def make_inputs(case: Case, device: torch.device | str = "cpu") -> Inputs:
    """Seeded logical inputs: drawn in float32 on `device` from a torch.Generator seeded with the
    case's seed, then rounded to the case dtype: every query of the batch in one draw, then every key
    and value in one, then the sinks, then the keys a logit pattern lifts (`_pattern`). With an FP8
    kv_dtype, K and V are quantized with their scales (pool.quantize, as the cache write does) and
    kept as the float32 values of those codes.

    A case replays exactly on the same kind of device and torch version; the CPU and a GPU draw
    different values from one seed (both are valid draws of the case). Drawing on the GPU takes the
    host's normal sampling (about 4.5 ms for a small batch of 8, most of a GPU check) off every case.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dt = TORCH_DTYPES[case.dtype]
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    q_lens = tuple(r.extend_len for r in case.requests)
    kv_lens = tuple(kv_len(case, r) for r in range(case.batch_size))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    q_all = randn(sum(q_lens), hq, d)
    q_all = q_all if case.q_amplitude == 1 else q_all * case.q_amplitude  # x * 1 is x
    kv_all = randn(2, sum(kv_lens), hkv, d)
    sinks = (randn(hq) * 2.0).float() if case.sinks else None
    if case.logits != "plain":
        _pattern(case, q_all, kv_all[0], kv_lens, gen)
    q_all = q_all.to(dt)
    kv_all = kv_all.to(dt) if case.kv_dtype is None else _fp8_values(case, kv_all)
    return Inputs(q_all=q_all, kv_all=kv_all, q_lens=q_lens, kv_lens=kv_lens, sinks=sinks)


def _pattern(
    case: Case, q_all: torch.Tensor, k_all: torch.Tensor, kv_lens: tuple[int, ...], gen: torch.Generator
) -> None:
    """Write the case's logit pattern (harness/core/logits.py) into the float32 draws, in place: every
    query's feature 0 is a, every key's c; per request and KV head, a dominant key (drawn) gets c + g,
    or the tied keys (drawn, distinct) take one key's vector with c + g at feature 0."""
    a, c, g = logits.components(case.logits, case.logit_offset, case.scale, case.q_amplitude, case.head_dim)
    q_all[..., 0] = a
    k_all[..., 0] = c
    if case.logits == "offset":
        return
    at = 0
    for n in kv_lens:
        for h in range(case.num_kv_heads):
            order = torch.randperm(n, generator=gen, device=gen.device)
            top = order[: 1 if case.logits == "dominant" else min(logits.TIED_KEYS, n)] + at
            k_all[top, h] = k_all[top[:1], h]
            k_all[top, h, 0] = c + g
        at += n


def _fp8_values(case: Case, kv: torch.Tensor) -> torch.Tensor:
    """[2, n, Hkv, D] float32 K, V -> the float32 values an FP8 cache holds for them."""
    fp8 = TORCH_KV_DTYPES[case.kv_dtype]
    scales = (case.k_scale, case.v_scale)
    return torch.stack([pool.dequantize(pool.quantize(x, fp8, s), s) for x, s in zip(kv, scales)])


def cache_dtype(case: Case) -> torch.dtype:
    """The dtype the case's KV pool stores: its kv_dtype, or the case dtype."""
    return TORCH_DTYPES[case.dtype] if case.kv_dtype is None else TORCH_KV_DTYPES[case.kv_dtype]


@dataclass(kw_only=True)
class Batch(Metadata):
    """What a backend adapter receives: the forward's engine metadata (harness/core/metadata.py),
    the queries, the new K/V, and the layer's pool. Only what an engine has: the logical inputs the
    references read stay with the caller of build_batch.

    `pool` is the buffer this layer reads: on a sliding-window layer of a hybrid pool it is the SWA
    pool, indexed through `full_to_swa` ([num full slots] -> SWA slot; freed tokens map to 0).
    """

    case: Case
    device: torch.device
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    sinks: torch.Tensor | None
    pool: pool.PagedPool
    full_to_swa: torch.Tensor | None

    @property
    def mode(self) -> Mode:
        return self.case.mode

    @property
    def batch_size(self) -> int:
        return self.case.batch_size


def _row_len(case: Case, r: int) -> int:
    """Positions in request r's req_to_token row (CROSS: encoder then decoder tokens)."""
    req = case.requests[r]
    if case.mode == Mode.CROSS:
        return req.encoder_len + req.prefix_len + req.extend_len
    return req.prefix_len + req.extend_len


def _first_kept_position(case: Case, r: int) -> int:
    """The earliest key position any query of request r can see through its window."""
    req = case.requests[r]
    return max(0, req.prefix_len - case.window_left)


@dataclass(frozen=True, kw_only=True)
class _Layout:
    """Where a case's tokens live in the pool: every request's positions over its whole pages in one
    [B, max pages * page size] table (`grid`, full-pool slots), and the hybrid pool's full-to-SWA map.
    Host integers are numpy arrays: a torch operation on the CPU costs several microseconds of
    dispatch, numpy's one."""

    grid: np.ndarray
    rows: list[int]  # positions in each request's req_to_token row
    new_start: list[int]  # position of each request's first new token in its row
    full_to_swa: np.ndarray | None
    storage_pages: int  # pages of this layer's pool

    def span(self, lo: list[int], hi: list[int]) -> np.ndarray:
        """[B, positions] bool: lo[r] <= position < hi[r]."""
        at = np.arange(self.grid.shape[1])
        return (at >= np.array(lo)[:, None]) & (at < np.array(hi)[:, None])

    def layer_slots(self, full: np.ndarray) -> np.ndarray:
        """Full-pool slots -> this layer's pool (pool.translate_slots, on the host)."""
        return self.full_to_swa[full] if self.full_to_swa is not None else full


def _lay_out(case: Case, gen: torch.Generator) -> _Layout:
    """Allocate every request's pages (after the SWA pool's, on a hybrid pool) as an engine would."""
    ps, bsz = case.page_size, case.batch_size
    rows = [_row_len(case, r) for r in range(bsz)]
    pages_per = [-(-n // ps) for n in rows]
    cross = case.mode == Mode.CROSS
    new_start = [(r.encoder_len if cross else 0) + r.prefix_len for r in case.requests]
    owned = sum(pages_per)
    swa_plan = None
    first_id = 1
    if case.hybrid_swa_pool:
        first_kept = [_first_kept_position(case, r) // ps for r in range(bsz)]
        swa_plan = pool.plan_swa_pool(first_kept, pages_per, gen)
        first_id = swa_plan.num_owned + 1
    full_total = first_id + owned + pool.spare_pages(owned)
    page_ids = pool.allocate_pages(
        pages_per, [s // ps for s in new_start], case.page_layout, first_id, full_total, gen
    )
    full_to_swa, storage_pages = None, full_total
    if swa_plan is not None:
        full_to_swa = _full_to_swa(case, swa_plan, page_ids, full_total)
        storage_pages = swa_plan.num_owned + 1 if case.swa_pool_exact else full_total
    return _Layout(
        grid=pool.slot_grid(page_ids, ps),
        rows=rows,
        new_start=new_start,
        full_to_swa=full_to_swa,
        storage_pages=storage_pages,
    )


def _full_to_swa(case: Case, plan: pool.SwaPlan, page_ids: list[list[int]], full_total: int) -> np.ndarray:
    """[full slots] -> SWA slot: every slot of a kept full page maps to the same offset in its SWA
    page; every other slot (freed tokens) to 0."""
    ps = case.page_size
    full_to_swa = np.zeros(full_total * ps, dtype=np.int64)
    kept = [(page_ids[r][i], swa) for r in range(case.batch_size) for i, swa in plan.swa_pages[r].items()]
    if kept:
        full_page, swa_page = np.array(kept, dtype=np.int64).T
        offset = np.arange(ps)
        full_to_swa[(full_page[:, None] * ps + offset).ravel()] = (swa_page[:, None] * ps + offset).ravel()
    return full_to_swa


def _cached(case: Case, lay: _Layout) -> np.ndarray:
    """[B, positions] bool: the K/V already in the pool (the prefix, or the encoder's output in
    CROSS); a hybrid pool holds only the pages inside the window. ENCODER_ONLY caches nothing: all
    its K/V are new tokens, which the adapter writes to the pool as an engine does."""
    reqs, bsz = case.requests, case.batch_size
    if case.mode == Mode.CROSS:
        return lay.span([0] * bsz, [r.encoder_len for r in reqs])
    ps = case.page_size
    hybrid = lay.full_to_swa is not None
    kept_from = [_first_kept_position(case, r) // ps * ps if hybrid else 0 for r in range(bsz)]
    return lay.span(kept_from, [r.prefix_len for r in reqs])


def _canary_slots(case: Case, lay: _Layout) -> np.ndarray:
    """The tail rows of each request's last KV page (in this layer's pool), then the reserved page."""
    ps = case.page_size
    cross = case.mode == Mode.CROSS
    kv_end = [r.encoder_len if cross else n for r, n in zip(case.requests, lay.rows)]
    tails = lay.grid[lay.span(kv_end, [-(-n // ps) * ps for n in kv_end])]
    return np.concatenate([lay.layer_slots(tails), np.arange(ps)])  # the reserved page untranslated


def _filled_pool(
    case: Case, lay: _Layout, kv_all: torch.Tensor, dev: dict[str, torch.Tensor], device: torch.device
) -> pool.PagedPool:
    """The layer's pool with the cached K/V written in one indexed copy (and the canary, if asked)."""
    layer_pool = pool.empty_pool(
        lay.storage_pages,
        case.page_size,
        case.num_kv_heads,
        case.head_dim,
        cache_dtype(case),
        case.kv_layout,
        device,
        (case.k_scale, case.v_scale),
    )
    if len(dev["cached_slots"]):
        cached_kv = kv_all.index_select(1, dev["cached_rows"])
        layer_pool.write(dev["cached_slots"], cached_kv[0], cached_kv[1])
    if "canary_slots" in dev:
        layer_pool.fill_slots(dev["canary_slots"], pool.CANARY)
    return layer_pool


def _new_kv(
    case: Case, kv_all: torch.Tensor, dev: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's K/V of this forward, in its dtype (an FP8 case's are the values its codes stand
    for, rounded to it): what the engine writes to the cache and a ragged pass attends over. CROSS
    has none."""
    dt = TORCH_DTYPES[case.dtype]
    if case.mode == Mode.CROSS:
        k_new = torch.empty(0, case.num_kv_heads, case.head_dim, dtype=dt, device=kv_all.device)
        return k_new, k_new.clone()
    k_new, v_new = kv_all.index_select(1, dev["new_rows"]).to(dt).unbind()
    return k_new, v_new


def build_batch(
    case: Case,
    inputs: Inputs,
    device: torch.device | str = "cpu",
    whole_page_loads: bool = False,
) -> Batch:
    """Lay the case out as an engine would. `whole_page_loads`: the kernel declares it loads the
    tail rows of each request's last page and the reserved page; those rows get a finite canary."""
    device = torch.device(device)
    lay = _lay_out(case, torch.Generator().manual_seed(case.seed ^ 0x5EED))
    bsz, reqs = case.batch_size, case.requests
    # A selection of positions (a range per request) read row-major comes out in request order, then
    # position order: the slots, and the rows of their keys in the packed inputs.
    kv_rows = np.array(modes.offsets(inputs.kv_lens)[:-1])[:, None] + np.arange(lay.grid.shape[1])
    max_row = max(lay.rows)
    req_to_token = lay.grid[:, :max_row] * lay.span([0] * bsz, lay.rows)[:, :max_row]  # padding: slot 0
    cached = _cached(case, lay)
    new = lay.span(lay.new_start, [s + r.extend_len for s, r in zip(lay.new_start, reqs)])
    cross = case.mode == Mode.CROSS
    meta, dev = upload_metadata(
        case.mode,
        reqs,
        req_to_token,
        lay.grid[new],
        device,
        extra={
            "full_to_swa": lay.full_to_swa,
            "cached_slots": lay.layer_slots(lay.grid[cached]),
            "cached_rows": kv_rows[cached],
            "new_rows": None if cross else kv_rows[new],
            "canary_slots": _canary_slots(case, lay) if whole_page_loads else None,
        },
    )
    kv_all = inputs.kv_all.to(device)
    k_new, v_new = _new_kv(case, kv_all, dev)
    return Batch(
        case=case,
        device=device,
        q=inputs.q_all.to(device, copy=True),  # the adapter's own: the references read the inputs
        k_new=k_new,
        v_new=v_new,
        sinks=inputs.sinks.to(device, copy=True) if inputs.sinks is not None else None,
        pool=_filled_pool(case, lay, kv_all, dev, device),
        full_to_swa=dev.get("full_to_swa"),
        **meta,
    )
