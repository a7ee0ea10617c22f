"""A paged KV cache that persists across forward steps, and the per-step metadata an engine builds.

The model-level check (harness/checks/model.py) runs a model step by step as a serving engine does:
every attention layer has its own pool, requests own page lists that grow as they are extended, a
request may start from another's cached prefix (whole pages shared, as a radix cache shares them),
and the drafts of a verify step get slots that are given back afterwards. So what one step writes is
what later steps read. Every slot that no request owns holds NaN, as in harness/batch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness import modes, pool
from harness.batch import Batch
from harness.case import Case, Request
from harness.modes import Mode


@dataclass(frozen=True)
class Work:
    """One request's share of a forward: its new tokens (verify: the drafts, flattened), its tree
    (verify), and, for a request's first work, the request whose cached prefix it starts from."""

    rid: str
    tokens: tuple[int, ...]
    tree: tuple[int, ...] | None = None
    parent: str | None = None
    reuse: int = 0  # tokens of the parent's prefix reused (a whole number of pages)


@dataclass
class Step:
    """Engine metadata of one forward (harness/modes.py conventions), shared by all its layers."""

    mode: Mode
    requests: tuple[Request, ...]
    seq_lens: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    encoder_lens: torch.Tensor
    qo_indptr: torch.Tensor
    positions: torch.Tensor
    req_to_token: torch.Tensor
    out_cache_loc: torch.Tensor
    tree_mask: torch.Tensor | None
    num_draft: int
    seq_lens_before_bump: torch.Tensor | None


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
        tail = torch.tensor(self.slots(rid, length, keep * ps), dtype=torch.long, device=self.device)
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
        device = self.device
        reqs, positions, out_loc, rows = [], [], [], []
        for w in works:
            if w.rid not in self.pages:
                self.start(w.rid, w.parent, w.reuse)
            p, e = self.length[w.rid], len(w.tokens)
            self.reserve(w.rid, p + e)
            reqs.append(Request(prefix_len=p, extend_len=e, tree=w.tree))
            positions += modes.query_positions(mode, p, e, w.tree)
            out_loc += self.slots(w.rid, p, p + e)
            rows.append(self.slots(w.rid, 0, p + e))
        req_to_token = torch.zeros(len(works), max(len(r) for r in rows), dtype=torch.int32)
        for i, r in enumerate(rows):
            req_to_token[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
        qo = modes.offsets([r.extend_len for r in reqs])
        num_draft = reqs[0].extend_len if mode in (Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY) else 0

        def i32(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=device)

        tree_mask = None
        if mode == Mode.TARGET_VERIFY:
            tree_mask = torch.tensor([modes.tree_ancestry(r.tree) for r in reqs], dtype=torch.bool)
            tree_mask = tree_mask.to(device)
        return Step(
            mode=mode,
            requests=tuple(reqs),
            seq_lens=i32([modes.seq_len(mode, r.prefix_len, r.extend_len) for r in reqs]),
            prefix_lens=i32([r.prefix_len for r in reqs]),
            extend_lens=i32([r.extend_len for r in reqs]),
            encoder_lens=i32([0] * len(reqs)),
            qo_indptr=i32(qo),
            positions=i32(positions),
            req_to_token=req_to_token.to(device),
            out_cache_loc=i32(out_loc),
            tree_mask=tree_mask,
            num_draft=num_draft,
            seq_lens_before_bump=i32([r.prefix_len for r in reqs]) if mode == Mode.DRAFT_EXTEND_V2 else None,
        )

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
            seq_lens=step.seq_lens,
            prefix_lens=step.prefix_lens,
            extend_lens=step.extend_lens,
            encoder_lens=step.encoder_lens,
            qo_indptr=step.qo_indptr,
            positions=step.positions,
            req_to_token=step.req_to_token,
            out_cache_loc=step.out_cache_loc,
            tree_mask=step.tree_mask,
            pool=self.pools[layer],
            full_to_swa=None,
            num_draft=step.num_draft,
            seq_lens_before_bump=step.seq_lens_before_bump,
        )
