"""A paged KV cache that persists across forward steps, and the per-step metadata an engine builds.

The model-level check (harness/checks/model/check.py) runs a model step by step as a serving engine does:
every attention layer has its own pool, requests own page lists that grow as they are extended, a
request may start from another's cached prefix (whole pages shared, as a radix cache shares them),
and the drafts of a verify step get slots that are given back afterwards. So what one step writes is
what later steps read. Every slot that no request owns holds NaN, as in harness/core/batch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.core import pool
from harness.core.batch import Batch
from harness.core.case import Case, Request
from harness.core.metadata import Metadata, upload_metadata
from harness.core.modes import Mode
from harness.core.transfer import to_device


@dataclass(frozen=True, kw_only=True)
class Work:
    """One request's share of a forward: its new tokens (verify: the drafts, flattened), its tree
    (verify), and, for a request's first work, the request whose cached prefix it starts from."""

    rid: str
    tokens: tuple[int, ...]
    tree: tuple[int, ...] | None = None
    parent: str | None = None
    reuse: int = 0  # tokens of the parent's prefix reused (a whole number of pages)


@dataclass(kw_only=True)
class Step(Metadata):
    """One forward: its requests and its engine metadata, shared by all its layers."""

    mode: Mode
    requests: tuple[Request, ...]


class PagedKVCache:
    """Per-layer paged pools plus each request's page list and committed length."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        kv_layout: str,
        device: torch.device | str,
        whole_page_loads: bool = False,
        seed: int = 0,
    ) -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self.whole_page_loads = whole_page_loads
        self.pools = []
        for _ in range(num_layers):
            p = pool.empty_pool(num_pages, page_size, kv_heads, head_dim, dtype, kv_layout)
            p.k, p.v = p.k.to(self.device), p.v.to(self.device)
            if whole_page_loads:
                p.fill_slots(torch.arange(page_size, device=self.device), pool.CANARY)
            self.pools.append(p)
        gen = torch.Generator().manual_seed(seed)
        self.free = [i + 1 for i in torch.randperm(num_pages - 1, generator=gen).tolist()]
        self.pages: dict[str, list[int]] = {}
        self.length: dict[str, int] = {}

    def start(self, rid: str, parent: str | None = None, reuse: int = 0) -> None:
        """A new request, optionally on the first `reuse` tokens (whole pages) of `parent`'s cache."""
        if reuse % self.page_size or (parent is not None and reuse > self.length[parent]):
            raise ValueError(f"{rid} cannot reuse {reuse} tokens of {parent}: whole cached pages only")
        self.pages[rid] = list(self.pages[parent][: reuse // self.page_size]) if parent else []
        self.length[rid] = reuse

    def reserve(self, rid: str, total: int) -> None:
        """Give request `rid` pages for positions 0..total-1 (new pages are poison, or canary)."""
        pages = self.pages[rid]
        while len(pages) * self.page_size < total:
            if not self.free:
                raise RuntimeError("the KV pool is out of pages")
            page = self.free.pop()
            pages.append(page)
            if self.whole_page_loads:
                rows = torch.arange(page * self.page_size, (page + 1) * self.page_size, device=self.device)
                for p in self.pools:
                    p.fill_slots(rows, pool.CANARY)

    def release_after(self, rid: str, length: int) -> None:
        """Forget a verify step's drafts: their rows become poison again (the canary in a kept page
        of a whole-page-loading kernel) and pages wholly past `length` go back to the free list."""
        ps = self.page_size
        keep = -(-length // ps)
        pages = self.pages[rid]
        tail = to_device(np.asarray(self.slots(rid, length, keep * ps), dtype=np.int64), self.device)
        for p in self.pools:
            p.fill_slots(tail, pool.CANARY if self.whole_page_loads else pool.POISON)
        for page in pages[keep:]:
            rows = torch.arange(page * ps, (page + 1) * ps, device=self.device)
            for p in self.pools:
                p.fill_slots(rows, pool.POISON)
            self.free.append(page)
        del pages[keep:]

    def slots(self, rid: str, lo: int, hi: int) -> list[int]:
        return pool.page_slots(self.pages[rid], self.page_size, hi)[lo:hi]

    def plan(self, mode: Mode, works: list[Work]) -> Step:
        """Reserve slots for this forward's new tokens and build its metadata, as an engine does."""
        reqs, out_loc, rows = [], [], []
        for w in works:
            if w.rid not in self.pages:
                self.start(w.rid, w.parent, w.reuse)
            p, e = self.length[w.rid], len(w.tokens)
            self.reserve(w.rid, p + e)
            reqs.append(Request(prefix_len=p, extend_len=e, tree=w.tree))
            out_loc += self.slots(w.rid, p, p + e)
            rows.append(self.slots(w.rid, 0, p + e))
        req_to_token = np.zeros((len(works), max(len(r) for r in rows)), dtype=np.int32)
        for i, r in enumerate(rows):
            req_to_token[i, : len(r)] = r
        meta, _ = upload_metadata(mode, reqs, req_to_token, out_loc, self.device)
        return Step(mode=mode, requests=tuple(reqs), **meta)

    def finish(self, step: Step, works: list[Work]) -> None:
        """Commit the new tokens (verify drafts are not committed: their pages go back)."""
        for w, r in zip(works, step.requests):
            if step.mode == Mode.TARGET_VERIFY:
                self.release_after(w.rid, r.prefix_len)
            else:
                self.length[w.rid] = r.prefix_len + r.extend_len

    def batch(
        self,
        step: Step,
        case: Case,
        layer: int,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        sinks: torch.Tensor | None,
    ) -> Batch:
        """What a backend adapter receives for one layer of this step: its pool, unchanged metadata."""
        return Batch(
            case=case,
            device=self.device,
            q=q,
            k_new=k_new,
            v_new=v_new,
            sinks=sinks,
            pool=self.pools[layer],
            full_to_swa=None,
            **step.metadata(),
        )
