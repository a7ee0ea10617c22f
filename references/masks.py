"""Who may attend to whom: the ONE definition of visibility, used by the references only.

Per request: P cached tokens, E queries. Query j sits at position P + j (TARGET_VERIFY: P + depth(j)).
Keys are the logical K/V in order: positions 0 .. P+E-1 (verify drafts: prefix keys 0 .. P-1, then
draft i at position P + depth(i)). A key at position k is visible to a query at position p iff
  causal:   k <= p
  window:   k >= p - W           (window_left W >= 0; W = -1 means no window): W + 1 keys in all
  verify:   a draft key is visible iff it is the query itself or one of its ancestors (and in window)
  cross:    every encoder key is visible; no causal mask, no window
  encoder:  ENCODER_ONLY (P = 0): no causal mask, each query sees its request's E keys, bounded by
            the left window (k >= p - W) and, for a two-sided window, the right one:
            k <= p + R (window_right R >= 0; -1 means none)
This file is deliberately independent of harness/ (backends build their own masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch


def _depths(parents: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(0 if p == -1 else out[p] + 1)
    return out


def _ancestors_or_self(parents: tuple[int, ...]) -> torch.Tensor:
    """[n, n] bool: draft j may see draft i (i is j or an ancestor of j); built as Python rows and
    made a tensor once (a tensor op per draft costs more than the whole rule)."""
    n = len(parents)
    rows: list[list[bool]] = []
    for j, p in enumerate(parents):
        row = list(rows[p]) if p >= 0 else [False] * n
        row[j] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, n)


def _by_position(
    qp: torch.Tensor, kp: torch.Tensor, causal: bool, window_left: int, window_right: int
) -> torch.Tensor:
    """The position rule on broadcastable positions: k <= p if causal, k >= p - W with a left window,
    k <= p + R with a right window."""
    if causal:
        vis = kp <= qp
    else:
        vis = torch.ones(torch.broadcast_shapes(qp.shape, kp.shape), dtype=torch.bool, device=qp.device)
    if window_left >= 0:
        vis &= kp >= qp - window_left
    if window_right >= 0:
        vis &= kp <= qp + window_right
    return vis


@dataclass(frozen=True, kw_only=True)
class RequestMask:
    """Visibility for one request, evaluated block by block so no [E, T] matrix need exist."""

    query_pos: torch.Tensor  # [E] int64
    key_pos: torch.Tensor  # [T] int64
    window_left: int
    causal: bool
    num_prefix: int  # keys before this index are cached context; after it, tree drafts (verify)
    draft_visible: torch.Tensor | None  # [E, E] bool (verify): query j may see draft i
    window_right: int = -1  # ENCODER_ONLY's right window R: keys up to p + R; -1 none

    @cached_property
    def num_queries(self) -> int:
        return self.query_pos.numel()

    @cached_property
    def num_keys(self) -> int:
        return self.key_pos.numel()

    def block(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """[q1-q0, k1-k0] bool: may query j (q0 <= j < q1) see key i (k0 <= i < k1)?"""
        qp = self.query_pos[q0:q1, None]
        kp = self.key_pos[None, k0:k1]
        vis = _by_position(qp, kp, self.causal, self.window_left, self.window_right)
        if self.draft_visible is not None and k1 > self.num_prefix:
            d0 = max(k0, self.num_prefix)
            vis[:, d0 - k0 :] &= self.draft_visible[q0:q1, d0 - self.num_prefix : k1 - self.num_prefix]
        return vis

    def fully_visible(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """Whether `block(q0, q1, k0, k1)` is all True, from the positions' extremes alone (lets a
        loop skip building and applying the mask of the many blocks inside every query's reach)."""
        if self.draft_visible is not None and k1 > self.num_prefix:
            return False
        qp = self.query_pos[q0:q1]
        kp = self.key_pos[k0:k1]
        pmin, pmax, kmin, kmax = int(qp.min()), int(qp.max()), int(kp.min()), int(kp.max())
        if self.causal and kmax > pmin:
            return False
        if self.window_left >= 0 and kmin < pmax - self.window_left:
            return False
        return self.window_right < 0 or kmax <= pmin + self.window_right

    def dense(self) -> torch.Tensor:
        return self.block(0, self.num_queries, 0, self.num_keys)

    def key_range(self, q0: int, q1: int) -> tuple[int, int]:
        """Keys outside [lo, hi) are invisible to every query in q0..q1-1 (lets a loop skip them)."""
        pmin = int(self.query_pos[q0:q1].min())
        pmax = int(self.query_pos[q0:q1].max())
        hi = self.num_keys
        if self.causal and self.draft_visible is None:
            hi = min(hi, pmax + 1)
        if self.window_right >= 0:  # ENCODER_ONLY: a key's index is its position
            hi = min(hi, pmax + self.window_right + 1)
        lo = 0 if self.window_left < 0 else max(0, pmin - self.window_left)
        return min(lo, hi), hi


def upload(host: dict[str, np.ndarray], device: torch.device | str) -> dict[str, torch.Tensor]:
    """Host integer arrays on `device` as int64, through one copy made before any launch (a copy from
    pageable memory waits for the device's queue), each returned as a view of its own shape."""
    arrays = [np.asarray(a, dtype=np.int64) for a in host.values()]
    flat = torch.from_numpy(np.concatenate([a.ravel() for a in arrays])).to(device)
    parts = flat.split([a.size for a in arrays])
    return {name: x.view(a.shape) for name, x, a in zip(host, parts, arrays)}


def padded_positions(masks: list[RequestMask]) -> dict[str, np.ndarray]:
    """The host half of `padded_visible`: what the device needs to build the padded mask, as numpy
    arrays (a torch operation on the CPU costs microseconds of dispatch, numpy's a fraction):
    query_pos [B, max E], key_pos [B, max T] (0 past a request's end), counts [3, B] (queries, keys,
    prefix keys) and, for tree drafts, draft_visible [B, max E, max E]."""
    if len({(m.window_left, m.window_right, m.causal) for m in masks}) > 1:
        raise ValueError(
            "padded_visible: the requests of one batch must share window_left, window_right and causality"
        )
    bsz, e, t = len(masks), max(m.num_queries for m in masks), max(m.num_keys for m in masks)
    query_pos = np.zeros((bsz, e), dtype=np.int64)
    key_pos = np.zeros((bsz, t), dtype=np.int64)
    for r, m in enumerate(masks):
        query_pos[r, : m.num_queries] = m.query_pos.numpy()
        key_pos[r, : m.num_keys] = m.key_pos.numpy()
    counts = np.array([[m.num_queries, m.num_keys, m.num_prefix] for m in masks], dtype=np.int64).T
    host = {"query_pos": query_pos, "key_pos": key_pos, "counts": counts}
    if masks[0].draft_visible is not None:
        drafts = np.zeros((bsz, e, e), dtype=np.int64)
        for r, m in enumerate(masks):
            drafts[r, : m.num_queries, : m.num_queries] = m.draft_visible.numpy()
        host["draft_visible"] = drafts
    return host


def padded_visible_from(pos: dict[str, torch.Tensor], masks: list[RequestMask]) -> torch.Tensor:
    """The device half of `padded_visible`, from `padded_positions` already on the device."""
    bsz, e = pos["query_pos"].shape
    t = pos["key_pos"].shape[1]
    device = pos["query_pos"].device
    qp, kp = pos["query_pos"].view(bsz, e, 1), pos["key_pos"].view(bsz, 1, t)
    num_queries, num_keys, num_prefix = pos["counts"][:, :, None]
    key, query = torch.arange(t, device=device), torch.arange(e, device=device)
    vis = (query < num_queries)[:, :, None] & (key < num_keys)[:, None, :]  # padding sees and is seen by none
    m = masks[0]
    if m.causal or m.window_left >= 0 or m.window_right >= 0:
        vis = vis & _by_position(qp, kp, m.causal, m.window_left, m.window_right)
    if "draft_visible" in pos:  # key i >= P is draft i - P: visible to j iff draft_visible[j, i - P]
        draft = (key - num_prefix).clamp(0, e - 1)  # [B, T]
        seen = pos["draft_visible"].gather(2, draft[:, None, :].expand(bsz, e, t)) != 0
        vis = vis & (seen | (key < num_prefix)[:, None, :])
    return vis


def padded_visible(masks: list[RequestMask], device: torch.device | str) -> torch.Tensor:
    """[B, max E, max T] bool on `device`: request r's `dense()` in [r, :E_r, :T_r], False elsewhere.

    Computed on the device from the positions (one small upload) instead of a dense mask built per
    request on the host and copied: the batch form of `block`'s rule, for a padded reference. The
    requests of one batch share their windows and causality (one case).
    """
    return padded_visible_from(upload(padded_positions(masks), device), masks)


def request_mask(
    mode: str,
    prefix_len: int,
    extend_len: int,
    window_left: int,
    encoder_len: int = 0,
    tree: tuple[int, ...] | None = None,
    window_right: int = -1,
) -> RequestMask:
    """The visibility rule for one request of a case, from the case's numbers alone."""
    p, e = prefix_len, extend_len
    if mode == "ENCODER_ONLY":  # P is 0: the request's own E tokens, at positions 0 .. E-1
        return RequestMask(
            query_pos=torch.arange(e),
            key_pos=torch.arange(e),
            window_left=window_left,
            causal=False,
            num_prefix=e,
            draft_visible=None,
            window_right=window_right,
        )
    if mode == "CROSS":
        return RequestMask(
            query_pos=torch.arange(p, p + e),
            key_pos=torch.arange(encoder_len),
            window_left=-1,
            causal=False,
            num_prefix=encoder_len,
            draft_visible=None,
        )
    if mode == "TARGET_VERIFY":
        depths = torch.tensor(_depths(tree), dtype=torch.int64)
        return RequestMask(
            query_pos=p + depths,
            key_pos=torch.cat([torch.arange(p), p + depths]),
            window_left=window_left,
            causal=True,
            num_prefix=p,
            draft_visible=_ancestors_or_self(tree),
        )
    return RequestMask(
        query_pos=torch.arange(p, p + e),
        key_pos=torch.arange(p + e),
        window_left=window_left,
        causal=True,
        num_prefix=p + e,
        draft_visible=None,
    )


def case_masks(case) -> list[RequestMask]:  # noqa: ANN001 - any object with the Case's fields
    """One RequestMask per request of a Case (duck-typed so this module imports nothing of harness)."""
    return [
        request_mask(
            str(case.mode),
            r.prefix_len,
            r.extend_len,
            case.window_left,
            r.encoder_len,
            r.tree,
            case.window_right,
        )
        for r in case.requests
    ]


def hf_window_left(sliding_window: int | None) -> int:
    """Hugging Face `config.sliding_window = S` admits S keys (itself included): W = S - 1."""
    return -1 if sliding_window is None else sliding_window - 1


def hf_bidirectional_window(sliding_window: int | None) -> tuple[int, int]:
    """Hugging Face's bidirectional `sliding_window = S` (`sliding_window_bidirectional_overlay`) admits
    keys with |p - k| <= S, 2S + 1 in all: window_left = window_right = S, unlike the causal S = W + 1."""
    return (-1, -1) if sliding_window is None else (sliding_window, sliding_window)
