"""Case -> Batch: the logical inputs, the paged pool, and the engine metadata a kernel glue sees.

`make_inputs` draws the logical Q/K/V/sinks from the Case's seed; the references compute from
those alone. `build_batch` lays them out the way a serving engine would (pages, slots, metadata),
leaving this forward's new K/V for the adapter to write, as engine glue does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness import modes, pool
from harness.case import Case
from harness.modes import Mode

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Inputs:
    """The logical tensors of a case, in the case dtype, on the device they were drawn on. What the
    references read.

    q[r]: [E, Hq, D]; k[r], v[r]: [T, Hkv, D] with T = P + E (encoder length in CROSS), keys in
    position order (verify drafts in flattened order); sinks: [Hq] float32 logits, or None.
    """

    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    sinks: torch.Tensor | None


def kv_len(case: Case, r: int) -> int:
    """Logical number of keys of request r (what the reference attends over)."""
    req = case.requests[r]
    return req.encoder_len if case.mode == Mode.CROSS else req.prefix_len + req.extend_len


def make_inputs(case: Case, device: torch.device | str = "cpu") -> Inputs:
    """Seeded logical inputs: drawn in float32 on `device` from a torch.Generator seeded with the
    case's seed, then rounded to the case dtype.

    A case replays exactly on the same kind of device and torch version; the CPU and a GPU draw
    different values from one seed (both are valid draws of the case). Drawing on the GPU takes the
    host's normal sampling (about 4.5 ms for a small batch of 8, most of a GPU check) off every case.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(case.seed)
    dt = TORCH_DTYPES[case.dtype]
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    qs, ks, vs = [], [], []
    for r, req in enumerate(case.requests):
        t = kv_len(case, r)
        qs.append((randn(req.extend_len, hq, d) * case.q_amplitude).to(dt))
        ks.append(randn(t, hkv, d).to(dt))
        vs.append(randn(t, hkv, d).to(dt))
    sinks = (randn(hq) * 2.0).float() if case.sinks else None
    return Inputs(q=qs, k=ks, v=vs, sinks=sinks)


@dataclass
class Batch:
    """What a backend adapter receives: engine metadata, queries, new K/V, and the layer's pool.

    Metadata follows DESIGN.md and harness/modes.py (int32 on `device`):
      seq_lens, prefix_lens, extend_lens, encoder_lens: [B]
      qo_indptr: [B+1] offsets of each request's queries in q
      positions: [sum E] absolute position of each query
      req_to_token: [B, max_row] full-pool slot of each position (CROSS: encoder positions first,
        then the decoder's); padding is slot 0
      out_cache_loc: [sum E] full-pool slots of this forward's new tokens
      tree_mask: [B, E, E] bool (TARGET_VERIFY): draft j may see draft i (ancestor or itself)
    `pool` is the buffer this layer reads: on a sliding-window layer of a hybrid pool it is the SWA
    pool, indexed through `full_to_swa` ([num full slots] -> SWA slot; freed tokens map to 0).
    `inputs` belongs to the references; an adapter must not read it.
    """

    case: Case
    device: torch.device
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    sinks: torch.Tensor | None
    seq_lens: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    encoder_lens: torch.Tensor
    qo_indptr: torch.Tensor
    positions: torch.Tensor
    req_to_token: torch.Tensor
    out_cache_loc: torch.Tensor
    tree_mask: torch.Tensor | None
    pool: pool.PagedPool
    full_to_swa: torch.Tensor | None
    num_draft: int
    seq_lens_before_bump: torch.Tensor | None = None
    inputs: Inputs | None = field(default=None, repr=False)
    host: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def mode(self) -> Mode:
        return self.case.mode

    @property
    def batch_size(self) -> int:
        return self.case.batch_size

    def cpu_list(self, name: str) -> list[int]:
        """A metadata vector as Python ints, as engines keep CPU copies for planning: the copy made
        when the batch was built (reading the device tensor back would wait for the GPU)."""
        if name in self.host:
            return list(self.host[name])
        return [int(x) for x in getattr(self, name).tolist()]

    def query_span(self, r: int) -> tuple[int, int]:
        """Request r's rows in `q` (and in `positions`), from qo_indptr's host copy."""
        qo = self.host["qo_indptr"] if "qo_indptr" in self.host else self.cpu_list("qo_indptr")
        return qo[r], qo[r + 1]

    def first_position(self, r: int) -> int:
        """The smallest position among request r's queries, from the host copy of `positions`."""
        q0, q1 = self.query_span(r)
        if "positions" in self.host:
            return min(self.host["positions"][q0:q1])
        return int(self.positions[q0:q1].min())


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


def build_batch(
    case: Case,
    inputs: Inputs,
    device: torch.device | str = "cpu",
    whole_page_loads: bool = False,
) -> Batch:
    """Lay the case out as an engine would. `whole_page_loads`: the kernel declares it loads the
    tail rows of each request's last page and the reserved page; those rows get a finite canary."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(case.seed ^ 0x5EED)
    ps = case.page_size
    dt = TORCH_DTYPES[case.dtype]
    bsz = case.batch_size
    reqs = case.requests
    cross = case.mode == Mode.CROSS

    rows = [_row_len(case, r) for r in range(bsz)]
    pages_per = [-(-n // ps) for n in rows]
    new_start = [(r.encoder_len if cross else 0) + r.prefix_len for r in reqs]
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
    slots = [pool.slot_table(page_ids[r], ps, rows[r]) for r in range(bsz)]  # int64, per request

    max_row = max(rows)
    req_to_token = torch.zeros(bsz, max_row, dtype=torch.int32)
    for r in range(bsz):
        req_to_token[r, : rows[r]] = slots[r]

    full_to_swa = None
    storage_pages = full_total
    if swa_plan is not None:
        full_to_swa = torch.zeros(full_total * ps, dtype=torch.int32)
        kept = [(page_ids[r][i], swa) for r in range(bsz) for i, swa in swa_plan.swa_pages[r].items()]
        if kept:  # every slot of a kept full page maps to the same offset in its SWA page
            full_page, swa_page = torch.tensor(kept, dtype=torch.int64).T
            offset = torch.arange(ps)
            dst = (swa_page[:, None] * ps + offset).flatten().to(torch.int32)
            full_to_swa[(full_page[:, None] * ps + offset).flatten()] = dst
        storage_pages = swa_plan.num_owned + 1 if case.swa_pool_exact else full_total

    def layer_slots(full: torch.Tensor) -> torch.Tensor:
        return pool.translate_slots(full, full_to_swa).long() if full_to_swa is not None else full

    # Cached K/V (prefix, or the encoder's output in CROSS) is already in the pool; the slots are
    # gathered here so that the pool is written in one indexed copy, not one per request.
    cached: list[tuple[torch.Tensor, int, int, int]] = []  # (slots, request, lo, hi)
    canary: list[torch.Tensor] = []
    for r, req in enumerate(reqs):
        if cross:
            lo, hi = 0, req.encoder_len
        else:
            lo = _first_kept_position(case, r) // ps * ps if full_to_swa is not None else 0
            hi = req.prefix_len
        if hi > lo:
            cached.append((slots[r][lo:hi], r, lo, hi))
        if whole_page_loads:
            kv_end = req.encoder_len if cross else rows[r]
            last_page_end = -(-kv_end // ps) * ps
            canary.append(pool.slot_table(page_ids[r], ps, last_page_end)[kv_end:])
    if whole_page_loads:
        canary.append(torch.arange(ps))  # the reserved page (slots 0 .. page_size-1), untranslated

    cached_slots = layer_slots(torch.cat([c[0] for c in cached])) if cached else None
    canary_slots = None
    if whole_page_loads:
        tails = torch.cat(canary[:-1]) if len(canary) > 1 else torch.zeros(0, dtype=torch.int64)
        canary_slots = torch.cat([layer_slots(tails), canary[-1]])

    seq_lens = [modes.seq_len(case.mode, r.prefix_len, r.extend_len) for r in reqs]
    extend = [r.extend_len for r in reqs]
    qo_indptr = [0]
    for e in extend:
        qo_indptr.append(qo_indptr[-1] + e)
    positions = []
    for req in reqs:
        positions += modes.query_positions(case.mode, req.prefix_len, req.extend_len, req.tree)
    out_cache_loc = torch.cat(
        [slots[r][new_start[r] : new_start[r] + req.extend_len] for r, req in enumerate(reqs)]
    )
    host = dict(
        seq_lens=seq_lens,
        prefix_lens=[r.prefix_len for r in reqs],
        extend_lens=extend,
        encoder_lens=[r.encoder_len for r in reqs],
        qo_indptr=qo_indptr,
        positions=positions,
    )
    if case.mode == Mode.DRAFT_EXTEND_V2:
        host["seq_lens_before_bump"] = host["prefix_lens"]
    # Every integer the device needs (metadata, the slots the pool is written at, the tree mask) in
    # one copy, made before the batch's first launch: a copy from pageable memory waits for the queue.
    ints: dict[str, torch.Tensor | list[int] | None] = {
        **host,
        "req_to_token": req_to_token,
        "out_cache_loc": out_cache_loc,
        "full_to_swa": full_to_swa,
        "cached_slots": cached_slots,
        "canary_slots": canary_slots,
    }
    if case.mode == Mode.TARGET_VERIFY:
        ints["tree_mask"] = torch.tensor([modes.tree_ancestry(r.tree) for r in reqs], dtype=torch.int32)
    sent = [name for name, x in ints.items() if x is not None]
    dev = dict(zip(sent, upload_int32(device, [ints[name] for name in sent])))

    layer_pool = pool.empty_pool(
        storage_pages, ps, case.num_kv_heads, case.head_dim, dt, case.kv_layout, device
    )
    if cached:
        layer_pool.write(
            dev["cached_slots"],
            torch.cat([inputs.k[r][lo:hi] for _, r, lo, hi in cached]).to(device),
            torch.cat([inputs.v[r][lo:hi] for _, r, lo, hi in cached]).to(device),
        )
    if whole_page_loads:
        layer_pool.fill_slots(dev["canary_slots"], pool.CANARY)

    q = torch.cat(inputs.q).to(device)
    if cross:
        k_new = torch.empty(0, case.num_kv_heads, case.head_dim, dtype=dt, device=device)
        v_new = k_new.clone()
    else:
        k_new = torch.cat([inputs.k[r][req.prefix_len :] for r, req in enumerate(reqs)]).to(device)
        v_new = torch.cat([inputs.v[r][req.prefix_len :] for r, req in enumerate(reqs)]).to(device)
    return Batch(
        case=case,
        device=device,
        q=q,
        k_new=k_new,
        v_new=v_new,
        sinks=inputs.sinks.to(device) if inputs.sinks is not None else None,
        seq_lens=dev["seq_lens"],
        prefix_lens=dev["prefix_lens"],
        extend_lens=dev["extend_lens"],
        encoder_lens=dev["encoder_lens"],
        qo_indptr=dev["qo_indptr"],
        positions=dev["positions"],
        req_to_token=dev["req_to_token"],
        out_cache_loc=dev["out_cache_loc"],
        tree_mask=dev["tree_mask"].bool() if "tree_mask" in dev else None,
        pool=layer_pool,
        full_to_swa=dev.get("full_to_swa"),
        num_draft=case.num_draft,
        seq_lens_before_bump=dev.get("seq_lens_before_bump"),
        inputs=inputs,
        host=host,
    )


UPLOAD_ALIGN = 16  # int32 elements: every tensor of an upload starts 64-byte aligned, as kernels expect


def upload_int32(device: torch.device, parts: list[torch.Tensor | list[int]]) -> list[torch.Tensor]:
    """int32 host data (tensors, or lists of ints for 1-D vectors) on `device` through one copy (on a
    GPU each separate copy waits for the host), returned as contiguous views of their own shapes, each
    starting UPLOAD_ALIGN-aligned (one code path on every device). Lists are joined in Python, so a
    vector costs no tensor operation of its own before the copy."""
    chunks: list[torch.Tensor] = []
    ints: list[int] = []  # consecutive list parts, joined before they become one tensor
    sizes, shapes = [], []
    for p in parts:
        n = p.numel() if isinstance(p, torch.Tensor) else len(p)
        size = -(-n // UPLOAD_ALIGN) * UPLOAD_ALIGN
        sizes.append(size)
        if isinstance(p, torch.Tensor):
            shapes.append(tuple(p.shape))
            if ints:
                chunks.append(torch.tensor(ints, dtype=torch.int32))
                ints = []
            chunks += [p.reshape(-1).to(torch.int32), torch.zeros(size - n, dtype=torch.int32)]
        else:
            shapes.append(None)
            ints += [*p, *([0] * (size - n))]
    if ints:
        chunks.append(torch.tensor(ints, dtype=torch.int32))
    dev = torch.cat(chunks).to(device).split(sizes)
    return [
        d[: len(p)] if shape is None else d[: p.numel()].view(shape)
        for d, p, shape in zip(dev, parts, shapes)
    ]
