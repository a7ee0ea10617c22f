"""Paged KV pools: page allocation by layout, the hybrid SWA pool and its translation, poisoning.

Every slot the batch does not own holds NaN, so a kernel that reads memory that is not its own
produces NaN, which the comparison reports as a poison read. Page (and slot) 0 is reserved.
An FP8 pool stores K / k_scale and V / v_scale rounded to its dtype, as an engine's cache write
does; both FP8 dtypes have a NaN, so its poison stays NaN (and NaN times a scale is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.core.vocab import TORCH_KV_DTYPES

POISON = float("nan")
# A large finite value for rows that a kernel loads legitimately but must mask out (FA4's whole-page
# TMA loads): NaN there would turn a correct `0 * v` into NaN. Exact in bf16 and fp16.
CANARY = 1024.0
RESERVED_PAGE = 0
FP8_DTYPES = frozenset(TORCH_KV_DTYPES.values())


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x / scale rounded to an FP8 dtype, saturated at its largest finite value (as engines clamp
    before the cast), computed in float32. NaN stays NaN."""
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp_(-top, top).to(dtype)


def dequantize(codes: torch.Tensor, scale: float) -> torch.Tensor:
    """The value an FP8 code stands for, in float32: code * scale."""
    return codes.float() * scale


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a pool of this dtype holds FP8 codes (a Case's kv_dtype)."""
    return dtype in FP8_DTYPES


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a pool of `dtype` is filled and indexed as: an FP8 pool as its bytes (uint8), whose
    fill and index kernels every device has (float8 ones came to torch op by op, device by device)."""
    return torch.uint8 if is_fp8(dtype) else dtype


def as_storage(x: torch.Tensor) -> torch.Tensor:
    """`x` viewed in its storage dtype (an FP8 pool's bytes); `x` itself otherwise, with no view made."""
    dtype = storage_dtype(x.dtype)
    return x if dtype == x.dtype else x.view(dtype)


def stored(value: float, dtype: torch.dtype) -> float | int:
    """A value as a pool of `dtype` stores it: itself, or its FP8 code's byte (NaN stays NaN)."""
    if not is_fp8(dtype):
        return value
    return int(torch.tensor(value).to(dtype).view(torch.uint8))


@dataclass(kw_only=True)
class PagedPool:
    """One layer's K and V buffers, paged. Slot s lives in page s // page_size at offset s % page_size.

    NHD storage is [num_pages, page_size, heads, dim]; HND is [num_pages, heads, page_size, dim].
    An FP8 pool holds codes: K / k_scale and V / v_scale (1.0 for a pool in the model's dtype).
    """

    k: torch.Tensor
    v: torch.Tensor
    page_size: int
    kv_layout: str
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def num_pages(self) -> int:
        return self.k.shape[0]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def _at(self, slots: torch.Tensor) -> tuple:
        """Index of the slots into `k` and `v`: NHD slots index the [num_slots, heads, dim] view of the
        buffer directly (int32 or int64, no arithmetic); HND needs (page, :, offset)."""
        slots = slots.to(self.k.device)
        if self.kv_layout == "NHD":
            return (slots,)
        slots = slots.long()
        return slots // self.page_size, slice(None), slots % self.page_size

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v as indexed by `_at`, in their storage dtype (an FP8 pool's bytes)."""
        k, v = as_storage(self.k), as_storage(self.v)
        if self.kv_layout == "NHD":
            return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
        return k, v

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given slots as [n, heads, dim] in the pool's dtype (an out-of-range slot
        raises, as on a GPU)."""
        at = self._at(slots)
        k, v = self._buffers()
        if self.kv_layout == "NHD":  # one index: (slots,)
            k, v = take(k, at[0]), take(v, at[0])
        else:
            k, v = k[at], v[at]
        return k.view(self.k.dtype), v.view(self.v.dtype)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V at the slots: converted to the pool's dtype, or quantized with its scales (FP8)."""
        at = self._at(slots)
        kb, vb = self._buffers()
        if is_fp8(self.k.dtype):
            k = quantize(k, self.k.dtype, self.k_scale).view(kb.dtype)
            v = quantize(v, self.v.dtype, self.v_scale).view(vb.dtype)
        kb[at] = k.to(kb.dtype)
        vb[at] = v.to(vb.dtype)

    def fill_slots(self, slots: torch.Tensor, value: float) -> None:
        """Store `value` in every element of the slots (an FP8 pool: its code, saturated)."""
        at = self._at(slots)
        for buf in self._buffers():
            buf[at] = stored(value, self.k.dtype)


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along the first dimension, for an integer index of any shape, through index_select:
    less host time per call than advanced indexing (measured on the device host, a 1024-row gather:
    10.7 against 15.8 us)."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])


def empty_pool(
    num_pages: int,
    page_size: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    kv_layout: str,
    device: torch.device | str = "cpu",
    scales: tuple[float, float] = (1.0, 1.0),
) -> PagedPool:
    """A pool whose every slot is poison until the batch writes what it owns. Made where the kernel
    reads it: filling a GPU pool in place costs a launch, copying one from the host a transfer.
    `scales`: (k_scale, v_scale) an FP8 pool quantizes with."""
    shape = (num_pages, page_size, heads, dim) if kv_layout == "NHD" else (num_pages, heads, page_size, dim)
    poison = stored(POISON, dtype)

    def buffer() -> torch.Tensor:
        buf = torch.full(shape, poison, dtype=storage_dtype(dtype), device=device)
        return buf if buf.dtype == dtype else buf.view(dtype)

    return PagedPool(
        k=buffer(),
        v=buffer(),
        page_size=page_size,
        kv_layout=kv_layout,
        k_scale=scales[0],
        v_scale=scales[1],
    )


def allocate_pages(
    pages_per_request: list[int],
    first_extend_page: list[int],
    layout: str,
    first_id: int,
    total_pages: int,
    gen: torch.Generator,
) -> list[list[int]]:
    """Page ids for each request's pages, in order, drawn from [first_id, total_pages).

    contiguous: one run per request; shuffled: a random sample; interleaved: round robin across
    requests; nonmonotonic: prefix pages ascending, the pages that receive this forward's new tokens
    taken from the top of the free list downwards (so extend slots go backwards in memory).
    """
    need = sum(pages_per_request)
    free = list(range(first_id, total_pages))
    if need > len(free):
        raise ValueError(f"pool of {total_pages} pages cannot hold {need} pages from id {first_id}")
    out: list[list[int]] = [[] for _ in pages_per_request]
    if layout in ("contiguous", "shuffled"):  # one run of ids, cut into requests in order
        if layout == "contiguous":
            ids = free[:need]
        else:
            ids = (torch.randperm(len(free), generator=gen)[:need] + first_id).tolist()  # = free[i]
        at = 0
        for r, n in enumerate(pages_per_request):
            out[r] = ids[at : at + n]
            at += n
    elif layout == "interleaved":
        it = iter(free)
        for i in range(max(pages_per_request, default=0)):
            for r, n in enumerate(pages_per_request):
                if i < n:
                    out[r].append(next(it))
    elif layout == "nonmonotonic":
        low, high = 0, len(free) - 1
        for r, n in enumerate(pages_per_request):
            for i in range(n):
                if i < first_extend_page[r]:
                    out[r].append(free[low])
                    low += 1
                else:
                    out[r].append(free[high])
                    high -= 1
    else:
        raise ValueError(f"unknown page layout {layout!r}")
    return out


def spare_pages(owned: int) -> int:
    """Unowned pages mixed into every pool, so that stray reads land on poison rather than data."""
    return max(2, owned // 4)


def slot_grid(page_ids: list[list[int]], page_size: int) -> np.ndarray:
    """[B, max pages * page_size] int64 (host): the slot of every position of each request's pages
    (page * page_size + offset; positions past a request's pages read page 0's slots)."""
    width = max(len(ids) for ids in page_ids)
    ids = np.array([ids + [RESERVED_PAGE] * (width - len(ids)) for ids in page_ids], dtype=np.int64)
    return (ids[:, :, None] * page_size + np.arange(page_size)).reshape(len(page_ids), width * page_size)


def page_slots(pages: list[int], page_size: int, length: int) -> list[int]:
    """Slots of positions 0..length-1 for a request whose pages are `pages`."""
    return slot_grid([pages], page_size)[0, :length].tolist()


def page_table_from_req_to_token(req_to_token: torch.Tensor, page_size: int) -> torch.Tensor:
    """[batch, max_pages] page ids from token slots, as engine glue derives it (first slot of a page)."""
    return req_to_token[:, ::page_size] // page_size


def translate_slots(slots: torch.Tensor, full_to_swa: torch.Tensor | None) -> torch.Tensor:
    """Full-pool slots -> SWA-pool slots on a sliding-window layer of a hybrid pool (identity otherwise)."""
    if full_to_swa is None:
        return slots
    return take(full_to_swa, slots).to(slots.dtype)


@dataclass
class SwaPlan:
    """Where a hybrid SWA pool puts each request's kept pages; freed pages map to slot 0."""

    swa_pages: list[dict[int, int]]  # per request: page index in the request -> SWA page id
    num_owned: int  # SWA pages in use; their ids are 1..num_owned


def plan_swa_pool(first_kept_page: list[int], pages_per_request: list[int], gen: torch.Generator) -> SwaPlan:
    """Assign SWA pages to the pages each request still needs inside its window.

    The assignment is a random permutation of 1..n, never the identity when n > 1. The caller
    starts the full pool's ids above n, so a full-pool slot used on the SWA pool unchanged is always
    an index the SWA pool does not own: poison in the default storage (as large as the full pool),
    out of bounds in the exact-size storage (n + 1 pages) that production uses.
    """
    n_swa = sum(n - f for n, f in zip(pages_per_request, first_kept_page))
    perm = (torch.randperm(n_swa, generator=gen) + 1).tolist()
    if n_swa > 1 and perm == sorted(perm):
        perm = perm[1:] + perm[:1]
    it = iter(perm)
    swa_pages = [{i: next(it) for i in range(f, n)} for n, f in zip(pages_per_request, first_kept_page)]
    return SwaPlan(swa_pages=swa_pages, num_owned=n_swa)
