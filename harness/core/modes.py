"""Forward modes and the engine's metadata conventions, in one place.

These are the numbers a production engine puts in its batch (what `seq_lens` means per mode, how
far the KV cache extends, where each query sits). Adapters derive kernel arguments from them, as
engine glue does; the references never read them (they work from the Case alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum


class Mode(str, Enum):
    DECODE = "DECODE"
    EXTEND = "EXTEND"
    DRAFT_EXTEND_V2 = "DRAFT_EXTEND_V2"
    TARGET_VERIFY = "TARGET_VERIFY"
    CROSS = "CROSS"
    ENCODER_ONLY = "ENCODER_ONLY"

    def __str__(self) -> str:
        return self.value


# Suite families: the `-k` keywords. EXTEND splits into `prefill` (no cached tokens) and `prefix`
# (over a cached prefix); neither word occurs in another family's test ids.
FAMILIES = ("decode", "prefill", "prefix", "draft_extend_v2", "verify", "cross", "encoder")
FAMILY_MODE = {
    "decode": Mode.DECODE,
    "prefill": Mode.EXTEND,
    "prefix": Mode.EXTEND,
    "draft_extend_v2": Mode.DRAFT_EXTEND_V2,
    "verify": Mode.TARGET_VERIFY,
    "cross": Mode.CROSS,
    "encoder": Mode.ENCODER_ONLY,
}


def family_of(mode: Mode, prefix_lens: list[int]) -> str:
    """The suite family of a batch: EXTEND with any cached prefix is 'prefix'."""
    if mode == Mode.EXTEND:
        return "prefix" if any(prefix_lens) else "prefill"
    return {v: k for k, v in FAMILY_MODE.items() if k != "prefix"}[mode]


def tree_depths(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Depth of each draft node (0 for a root, whose parent is -1)."""
    depths: list[int] = []
    for j, p in enumerate(parents):
        if p >= j:
            raise ValueError(f"tree[{j}]={p}: a parent must come before its child")
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def seq_len(mode: Mode, prefix_len: int, extend_len: int) -> int:
    """The engine's `seq_lens` entry for one request, after the batch is fully built.

    EXTEND/DECODE: P + E (the new tokens included). DRAFT_EXTEND_V2: the engine builds the batch with
    P and then bumps it by num_draft, so P + E. TARGET_VERIFY: P (the drafts are not counted).
    CROSS: the decoder's own P + E (the encoder length travels separately in `encoder_lens`).
    ENCODER_ONLY: E (P is 0: an encoder forward caches nothing; its keys are its own tokens).
    """
    if mode == Mode.TARGET_VERIFY:
        return prefix_len
    return prefix_len + extend_len


def kv_extent(mode: Mode, seq_len_: int, num_draft: int, encoder_len: int) -> int:
    """How many keys the kernel must read for one request, from the engine's metadata."""
    if mode == Mode.CROSS:
        return encoder_len
    if mode == Mode.TARGET_VERIFY:
        return seq_len_ + num_draft
    return seq_len_


def query_positions(mode: Mode, prefix_len: int, extend_len: int, tree: tuple[int, ...] | None) -> list[int]:
    """Absolute position of each new token: P + j, or P + depth(j) for a verify tree."""
    if mode == Mode.TARGET_VERIFY and tree is not None:
        return [prefix_len + d for d in tree_depths(tree)]
    return [prefix_len + j for j in range(extend_len)]


def num_draft(mode: Mode, extend_lens: Sequence[int]) -> int:
    """The engine's num_draft: draft tokens per request (every request's extend_len), else 0."""
    if mode in (Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY):
        return extend_lens[0]
    return 0


def tree_ancestry(parents: tuple[int, ...] | list[int]) -> list[list[bool]]:
    """The engine's verify mask among drafts: row j marks j's ancestors and j itself."""
    n = len(parents)
    rows = [[False] * n for _ in range(n)]
    for j in range(n):
        a = j
        while a >= 0:
            rows[j][a] = True
            a = parents[a]
    return rows


def offsets(lengths: Sequence[int]) -> list[int]:
    """[0, l0, l0 + l1, ...]: where each run of these lengths starts, then the total (qo_indptr)."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
