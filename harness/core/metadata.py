"""The engine metadata of one forward (seq_lens, positions, num_draft, the tree mask, ...), built in
one place from its requests by the conventions of harness/core/modes.py, and uploaded to the device.

Both builders of a Batch call `upload_metadata`: build_batch (harness/core/batch.py: one layer, a
pool laid out for the case) and the model-level engine (harness/checks/model/engine.py: pools that
persist across steps). They differ only in where the slots come from (req_to_token, out_cache_loc),
which they pass in. A module of its own rather than part of batch.py because the engine needs the
metadata without batch.py's inputs and pool layout; a Batch is this Metadata plus one layer's tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from harness.core import modes
from harness.core.case import Request
from harness.core.modes import Mode
from harness.core.transfer import to_device

HostInts = np.ndarray | torch.Tensor | list[int]  # what `upload_int32` takes


@dataclass(kw_only=True)
class Metadata:
    """A forward's engine metadata (docs/design.md, harness/core/modes.py), int32 on the device:
      seq_lens, prefix_lens, extend_lens, encoder_lens: [B]
      qo_indptr: [B+1] offsets of each request's queries
      positions: [sum E] absolute position of each query
      req_to_token: [B, max_row] full-pool slot of each position (CROSS: encoder positions first,
        then the decoder's); padding is slot 0
      out_cache_loc: [sum E] full-pool slots of this forward's new tokens
      tree_mask: [B, E, E] bool (TARGET_VERIFY): draft j may see draft i (ancestor or itself)
      seq_lens_before_bump: [B] (DRAFT_EXTEND_V2): seq_lens as built, before the bump by num_draft
    and num_draft, draft tokens per request (DRAFT_EXTEND_V2, TARGET_VERIFY; 0 otherwise), and
    draft_parents, per request the parent of each draft (TARGET_VERIFY: the tree the engine's
    speculative step drew, -1 for a child of the last accepted token; () in every other mode).
    `host` holds the 1-D vectors (not req_to_token, out_cache_loc) as the Python ints they were
    built from, as an engine keeps CPU copies for planning: what the accessors below read, so that
    nothing waits for the device.
    """

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
    draft_parents: tuple[tuple[int, ...], ...]
    host: dict[str, list[int]] = field(repr=False)

    def metadata(self) -> dict[str, Any]:
        """This metadata's fields, to build a Batch over it (every layer of a step shares them)."""
        return {f.name: getattr(self, f.name) for f in fields(Metadata)}

    def cpu_list(self, name: str) -> list[int]:
        """A metadata vector as Python ints, as engines keep CPU copies for planning: the copy made
        when the metadata was built (reading the device tensor back would wait for the GPU)."""
        return list(self.host[name])

    def host_tensor(self, name: str) -> torch.Tensor:
        """A metadata vector as an int32 CPU tensor (what a planner takes on the host), from the host
        copy: no read back from the device."""
        return torch.tensor(self.cpu_list(name), dtype=torch.int32)

    def query_span(self, r: int) -> tuple[int, int]:
        """Request r's rows in the queries (and in `positions`), from qo_indptr's host copy."""
        qo = self.host["qo_indptr"]
        return qo[r], qo[r + 1]

    def query_positions(self, r: int) -> list[int]:
        """Request r's query positions, from the host copy of `positions`."""
        q0, q1 = self.query_span(r)
        return self.host["positions"][q0:q1]

    def first_position(self, r: int) -> int:
        """The smallest position among request r's queries."""
        return min(self.query_positions(r))


def upload_metadata(
    mode: Mode,
    requests: Sequence[Request],
    req_to_token: HostInts,
    out_cache_loc: HostInts,
    device: torch.device,
    extra: dict[str, HostInts | None] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The engine metadata of a forward over `requests` with these slots, on `device`: Metadata's
    fields (keyword arguments of Metadata, or of a Batch), and the `extra` integers (None entries
    left out) uploaded in the same copy, by name."""
    extend = [r.extend_len for r in requests]
    positions: list[int] = []
    for r in requests:
        positions += modes.query_positions(mode, r.prefix_len, r.extend_len, r.tree)
    host = dict(
        seq_lens=[modes.seq_len(mode, r.prefix_len, r.extend_len) for r in requests],
        prefix_lens=[r.prefix_len for r in requests],
        extend_lens=extend,
        encoder_lens=[r.encoder_len for r in requests],
        qo_indptr=modes.offsets(extend),
        positions=positions,
    )
    if mode == Mode.DRAFT_EXTEND_V2:
        host["seq_lens_before_bump"] = host["prefix_lens"]
    # Every integer the device needs (metadata, the caller's own) in one copy (transfer.py: queued,
    # the host does not wait for the GPU).
    ints: dict[str, HostInts | None] = {
        **host,
        "req_to_token": req_to_token,
        "out_cache_loc": out_cache_loc,
        **(extra or {}),
    }
    if mode == Mode.TARGET_VERIFY:
        ints["tree_mask"] = np.array([modes.tree_ancestry(r.tree) for r in requests], dtype=np.int32)
    sent = [name for name, x in ints.items() if x is not None]
    dev = dict(zip(sent, upload_int32(device, [ints[name] for name in sent])))
    own = ("num_draft", "draft_parents", "host")  # host values, not uploaded
    meta = {f.name: dev.get(f.name) for f in fields(Metadata) if f.name not in own}
    if meta["tree_mask"] is not None:
        meta["tree_mask"] = meta["tree_mask"].bool()
    parents = tuple(tuple(r.tree) if mode == Mode.TARGET_VERIFY else () for r in requests)
    meta.update(num_draft=modes.num_draft(mode, extend), draft_parents=parents, host=host)
    return meta, {name: dev[name] for name in sent if name in (extra or {})}


UPLOAD_ALIGN = 16  # int32 elements: every tensor of an upload starts 64-byte aligned, as kernels expect


def upload_int32(device: torch.device, parts: list[HostInts]) -> list[torch.Tensor]:
    """Host integers (arrays, tensors, or lists of ints for 1-D vectors) on `device` as int32, through
    one queued copy (harness/core/transfer.py), returned as contiguous views of their
    own shapes, each starting UPLOAD_ALIGN-aligned (one code path on every device). They are packed
    into one numpy buffer first: no torch operation per part."""
    arrays = [p.numpy() if isinstance(p, torch.Tensor) else np.asarray(p, dtype=np.int32) for p in parts]
    sizes = [-(-a.size // UPLOAD_ALIGN) * UPLOAD_ALIGN for a in arrays]
    buf = np.zeros(sum(sizes), dtype=np.int32)
    at = 0
    for a, size in zip(arrays, sizes):
        buf[at : at + a.size] = a.ravel()
        at += size
    # One split into each part and the padding after it (every piece a view, made in one operation);
    # only a part of more than one dimension takes a view of its own shape.
    cuts = [n for a, size in zip(arrays, sizes) for n in (a.size, size - a.size)]
    pieces = to_device(buf, device).split(cuts)
    return [d if a.ndim == 1 else d.view(a.shape) for d, a in zip(pieces[::2], arrays)]
