"""What one flex call takes: the Launch (queries and keys laid end to end, with per-token
metadata), the terms of its mask and score function, and the padded sizes a compiled launch takes.

Shared by the eager and compiled variants (flex.py, flex_eager.py, flex_compiled.py) and their
CUDA-graph path (flex_graph.py); docs/flex.md says why each choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# A window bound that admits every key: what "no window" (-1) becomes inside the mask.
NO_WINDOW = 1 << 40
# Padded launch sizes of the compiled CPU kernel: 128 * 4**k rows. Coarse buckets mean few C++
# compiles; padding rows and keys belong to no request, so their blocks are skipped.
MIN_BUCKET, BUCKET_GROWTH = 128, 4

# The shortest a captured index tensor is made (the tree table): dynamo specialises a dimension of
# size 1 (its 0/1 rule), so a length-1 table would be a compile of its own.
MIN_CAPTURED_LEN = 2

# The terms of the mask besides "same request"; see FlexBase.mask_mod.
MASK_TERMS = frozenset({"free", "causal", "window", "window_right", "tree"})
# The terms of the score function: a soft cap, a virtual sink key; see FlexBase.score_mod.
SCORE_TERMS = frozenset({"cap", "sink"})

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(kw_only=True)
class Launch:
    """One flex call: some requests' queries and keys laid end to end, with per-token metadata.

    Index tensors are int64 on the batch's device: q_* have one entry per (padded) query row,
    kv_* one per (padded) key. Padding rows and keys carry document ids that match nothing.
    Flags are int64 0/1 too (the most plainly supported dtype for a captured tensor in a kernel).
    """

    q: torch.Tensor  # [1, Hq, Lq, D]
    k: torch.Tensor  # [1, Hkv, Lk, D]
    v: torch.Tensor
    q_doc: torch.Tensor
    q_pos: torch.Tensor
    q_tree_row: torch.Tensor  # the query's row in the flattened tree mask (verify)
    kv_doc: torch.Tensor
    kv_pos: torch.Tensor
    kv_draft: torch.Tensor  # draft index of a verify draft key, -1 otherwise
    kv_free: torch.Tensor  # 1: every query of the document sees it (encoder keys, sink key)
    kv_sink: torch.Tensor  # 1: the virtual sink key
    tree: torch.Tensor  # the flattened [B, E, E] tree mask as 0/1 (verify; else [1]), zero-padded
    causal: torch.Tensor  # int64 scalar: 1 if the causal term masks, 0 if it admits every key
    window: torch.Tensor  # int64 scalar: W, or NO_WINDOW
    window_right: torch.Tensor  # int64 scalar: R of a two-sided (encoder) window, or NO_WINDOW
    cap: torch.Tensor  # float32 scalar, 0 for none
    sink_logit: torch.Tensor  # float32 [Hq] (zeros without sinks)
    num_queries: int  # real query rows (the rest is padding)
    num_keys: int  # keys up to the last real one (the rest: padding)
    terms: frozenset[str]  # the mask terms this launch needs, of MASK_TERMS
    score_terms: frozenset[str]  # of SCORE_TERMS
    deterministic: bool = False  # the case's deterministic mode (flex_compiled pins its kernel for it)


def bucket(n: int) -> int:
    """The padded length of n rows."""
    size = MIN_BUCKET
    while size < n:
        size *= BUCKET_GROWTH
    return size


def soft_capped(s: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """The soft cap's term on the scaled score s, for a cap > 0."""
    return cap * torch.tanh(s / cap)


def with_sink_key(
    s: torch.Tensor, h: torch.Tensor, k: torch.Tensor, kv_sink: torch.Tensor, sink_logit: torch.Tensor
) -> torch.Tensor:
    """The virtual sink key's term: it scores its head's logit."""
    return torch.where(kv_sink[k] != 0, sink_logit[h].to(s.dtype), s)


def score_terms(soft_cap: float, virtual_sink: bool) -> frozenset[str]:
    """The SCORE_TERMS a launch needs."""
    return frozenset({"cap"} if soft_cap > 0 else ()) | frozenset({"sink"} if virtual_sink else ())
