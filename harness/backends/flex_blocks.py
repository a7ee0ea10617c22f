"""A flex BlockMask built from a launch's visibility grid with a few tensor ops, without flex's vmaps.

`create_block_mask` evaluates the `mask_mod` through four nested `vmap`s (functorch and pytree
dispatch in Python for every operation of the mask), then reduces the grid to blocks. Here the grid
comes from the glue's own `mask_mod` evaluated once by broadcasting its index tensors (flex.py's
`visible_grid`), and this module reduces it to blocks exactly as flex does (a block is partial when
some of its entries are visible, full when all are; `full` blocks skip the mask_mod in the kernel),
then hands the ordered indices to the public `BlockMask.from_kv_blocks`. Both paths use it: the eager
launches and, captured, the CUDA-graph path's (no host read). docs/flex.md says why.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache

import torch

# flex's default (and the CUDA kernel's) sparse block: 128 query rows x 128 keys.
BLOCK = 128


@cache
def _skips_q_blocks() -> bool:
    """Whether from_kv_blocks can skip the transposed (query-block) indices, which only the backward
    pass reads (torch >= 2.9): computing them is a vmap of its own."""
    from torch.nn.attention.flex_attention import BlockMask

    return "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters


def block_counts(visible: torch.Tensor, lengths: tuple[int, int], block: int = BLOCK) -> torch.Tensor:
    """Visible entries per (query block, key block) of a [Lq, Lk] grid whose first rows and columns
    are `visible` (bool) and the rest False: int64 [ceil(Lq / block), ceil(Lk / block)]. The False
    rest is never materialised, only its blocks' zero counts."""
    (nq, nk), (lq, lk) = visible.shape, lengths
    bq, bk = -(-nq // block), -(-nk // block)
    if (bq * block, bk * block) != (nq, nk):
        visible = torch.nn.functional.pad(visible, (0, bk * block - nk, 0, bq * block - nq))
    counts = visible.reshape(bq, block, bk, block).sum(dim=(1, 3))
    return torch.nn.functional.pad(counts, (0, -(-lk // block) - bk, 0, -(-lq // block) - bq))


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks per row, their column indices first, in ascending order) as flex stores them: int32,
    with the batch and head dimensions of size 1."""
    as_int = blocks.to(torch.int32)
    num = as_int.sum(dim=-1).to(torch.int32)
    indices = torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32)
    return num[None, None].contiguous(), indices[None, None].contiguous()


def _from_kv_blocks(kv_num, kv_idx, full_num, full_idx, lengths, mask_mod, block):  # noqa: ANN001, ANN202
    """BlockMask.from_kv_blocks without the query-block indices where this torch can skip them."""
    from torch.nn.attention.flex_attention import BlockMask

    extra = {"compute_q_blocks": False} if _skips_q_blocks() else {}
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=lengths,
        **extra,
    )


def block_mask_from_grid(  # noqa: ANN201 - a flex BlockMask
    visible: torch.Tensor, lengths: tuple[int, int], mask_mod: Callable, block: int = BLOCK
):
    """The BlockMask of a `lengths` = (Lq, Lk) launch whose visibility grid is `visible` (its first
    rows and keys; the rest sees nothing), `mask_mod` kept for the partial blocks: the same
    kv_num_blocks / kv_indices and full_kv_* as create_block_mask(mask_mod, ...) gives for the
    mask_mod whose grid this is (tests/test_flex.py)."""
    counts = block_counts(visible, lengths, block)
    whole = block * block
    partial, full = (counts > 0) & (counts < whole), counts == whole
    return _from_kv_blocks(*_ordered(partial), *_ordered(full), lengths, mask_mod, (block, block))
