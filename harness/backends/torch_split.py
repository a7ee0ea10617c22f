"""torch_split: an engine-style chunked fallback whose partial results are merged by log-sum-exp.

Cached keys (a paged pass, cut into KV splits) and this forward's new tokens (a ragged pass) are
attended separately and merged by base-2 LSE, as engines do around FlashInfer: the CPU gets the
code paths torch_native lacks (a window per pass, an LSE base, split parameters deterministic mode
must fix). Requests run in groups padded to their largest; deterministic mode gives each request
its own group. Details: docs/mutants.md, "torch_split".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from harness.backends.base import ALL_CAPABILITIES, BackendOutput
from harness.backends.glue import EngineGlue
from harness.core import modes
from harness.core.batch import Batch
from harness.core.metadata import upload_int32
from harness.core.modes import Mode
from harness.core.pool import take
from harness.core.timing import phase
from harness.core.vocab import TORCH_DTYPES

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
WORK_UNITS = 16  # splits the scheduler spreads over the batch when no split size is fixed
DETERMINISTIC_SPLIT = 32  # keys per split in deterministic mode (the engine's fixed_split_size)
# Grouping (outside deterministic mode): padding a group may waste as many score elements (per head)
# as the real work, plus PAD_FREE, about what one launch costs on the device; GROUP_LIMIT bounds the
# scores of one group (all heads), hence its memory.
PAD_FREE = {"cpu": 1 << 12, "cuda": 1 << 20}
GROUP_LIMIT = 1 << 26
FAR = 1 << 30  # padding's position in the ragged pass: after every query; its keys are always hidden


@dataclass(frozen=True)
class SplitParams:
    """The engine's split-KV arguments: a fixed split size (keys) or none split at all."""

    fixed_split_size: int | None = None
    disable_split_kv: bool = False


@dataclass
class Partial:
    """One pass over some keys: output normalised over them, and their LSE in base 2 (-inf: none seen).
    A leading dimension, when there is one, counts the KV splits of the pass."""

    out: torch.Tensor  # [(splits,) R, Hq, E, D] float32: a group's R requests, padded to E queries
    lse2: torch.Tensor  # [(splits,) R, Hq, E] float32


def merge(out: torch.Tensor, lse: torch.Tensor, base2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine parts (leading dimension) by their LSE (base 2 or natural). The weights exp(lse - max)
    sum to at least 1 when any part saw a key (the largest weighs exactly 1), so clamping the sum at 1
    changes nothing but the case where none did: output 0, LSE -inf."""
    exp, log = (torch.exp2, torch.log2) if base2 else (torch.exp, torch.log)
    base = torch.nan_to_num(lse.amax(0), nan=math.nan, neginf=0.0)  # -inf (no key) -> 0; NaN stays
    w = exp(lse - base)
    total = w.sum(0)
    return (w.unsqueeze(-1) * out).sum(0) / total.clamp_min(1.0).unsqueeze(-1), base + log(total)


def merge_base2(splits: Partial) -> Partial:
    """Merge the splits (leading dimension) of a pass whose LSE is base 2: the kernel's own merge. One
    split is its own merge."""
    if splits.out.shape[0] == 1:
        return Partial(splits.out[0], splits.lse2[0])
    return Partial(*merge(splits.out, splits.lse2, base2=True))


def merge_states(states: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_state: combine (out, natural-log LSE) pairs into one (out, LSE)."""
    if len(states) == 1:
        return states[0]
    return merge(torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states]), base2=False)


class TorchSplit(EngineGlue):
    name = "torch_split"
    library = "torch"
    capabilities = dataclasses.replace(
        ALL_CAPABILITIES,
        why_not={
            "graph": "not capturable: requests are grouped by lengths read on the host and each "
            "group's ragged and paged passes run in a Python loop, sized from them: no fixed buffers"
        },
    )

    # --- engine glue: the shared reads (glue.py), and this fallback's passes and splits -------

    def paged_windowed(self, batch: Batch) -> bool:
        """Whether the paged pass masks by the window: never in CROSS, where `window_left` is -1 (the
        encoder's keys are not on the decoder's positions)."""
        return self.window_left(batch) >= 0

    def ragged_window_left(self, batch: Batch) -> int:
        """The window the ragged pass over the new tokens gets: the same as the paged pass's."""
        return self.window_left(batch)

    def prefix_query_positions(self, batch: Batch, r: int) -> list[int]:
        """Where the paged pass places request r's queries for its window: their true positions."""
        return self.query_positions(batch, r)

    def paged_range(self, batch: Batch, r: int) -> tuple[int, int]:
        """Keys lo..hi-1 the paged pass reads: the prefix (two-pass modes), all keys (DECODE), or the
        encoder (CROSS); from the first query's window start on, as the hybrid pool frees older pages."""
        if batch.mode == Mode.CROSS:
            return 0, batch.cpu_list("encoder_lens")[r]
        hi = batch.cpu_list("prefix_lens" if self.two_pass(batch) else "seq_lens")[r]
        return min(self.kv_start(batch, r), hi), hi

    def split_params(self, batch: Batch) -> SplitParams:
        """Deterministic mode fixes the split size on every path; otherwise the scheduler decides."""
        if batch.case.deterministic:
            return SplitParams(fixed_split_size=DETERMINISTIC_SPLIT)
        return SplitParams()

    def split_size(self, batch: Batch, n_keys: int) -> int:
        """Keys per split of a paged pass over n_keys keys."""
        params = self.split_params(batch)
        if params.disable_split_kv:
            return max(1, n_keys)
        if params.fixed_split_size:
            return params.fixed_split_size
        per_request = max(1, WORK_UNITS // batch.batch_size)
        return max(1, -(-n_keys // per_request))

    def natural_lse(self, lse2: torch.Tensor) -> torch.Tensor:
        """A kernel's base-2 LSE in natural log, as merge_state and the caller expect."""
        return lse2 * LN2

    @staticmethod
    def two_pass(batch: Batch) -> bool:
        """Modes with new tokens attended in flight (ragged) next to the cached prefix (paged); an
        ENCODER_ONLY forward's prefix is empty, so its ragged pass is all there is."""
        return batch.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY, Mode.ENCODER_ONLY)

    # --- grouping and layout -----------------------------------------------------------------

    def request_sizes(self, batch: Batch) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        """Per request: its paged pass's key range (paged_range, read once per forward), its queries,
        and the keys its queries attend over (paged, plus its own new tokens in two-pass modes)."""
        qo = batch.host["qo_indptr"]
        queries = [qo[r + 1] - qo[r] for r in range(batch.batch_size)]
        two = self.two_pass(batch)
        ranges = [self.paged_range(batch, r) for r in range(batch.batch_size)]
        keys = [max(0, hi - lo) + (e if two else 0) for (lo, hi), e in zip(ranges, queries)]
        return ranges, queries, keys

    def groups(self, batch: Batch, queries: list[int], keys: list[int]) -> list[list[int]]:
        """Which requests are computed together, padded to the group's largest. Deterministic mode
        computes each request alone, so its shapes, and therefore its bits, never depend on the batch
        (a batch-invariant kernel gives each request its own tiles). Otherwise requests of similar size
        share one padded computation while the padding costs at most the real work plus what a launch
        costs (PAD_FREE) and the group's scores stay under GROUP_LIMIT elements."""
        if batch.case.deterministic:
            return [[r] for r in range(batch.batch_size)]
        free = PAD_FREE.get(batch.device.type, PAD_FREE["cpu"])
        out: list[list[int]] = []
        cur: list[int] = []
        e_max = k_max = real = 0
        for r in sorted(range(batch.batch_size), key=lambda r: (keys[r], queries[r])):
            e2, k2, real2 = max(e_max, queries[r]), max(k_max, keys[r]), real + queries[r] * keys[r]
            padded = (len(cur) + 1) * e2 * k2
            if cur and (padded > 2 * real2 + free or padded * batch.case.num_q_heads > GROUP_LIMIT):
                out.append(cur)
                cur, e2, k2, real2 = [], queries[r], keys[r], queries[r] * keys[r]
            cur.append(r)
            e_max, k_max, real = e2, k2, real2
        return out + [cur]

    def paged_layout(
        self, batch: Batch, rs: list[int], ranges: list[tuple[int, int]], width: int
    ) -> dict[str, np.ndarray]:
        """Host integers of a group's paged pass: its keys laid out [splits, R, Hkv, split size], split s
        of request r holding its keys s * size_r .. (s + 1) * size_r - 1 of lo..hi-1 (`ranges`: every
        request's paged_range, read once per forward).
        key_at: each real key's index in the flattened req_to_token padded by one zero column (a key
        beyond the row reads slot 0, reserved and poisoned, as an engine's over-long read would);
        key_pad: each place's row among the real keys' [count + 1 (a zero key), Hkv] rows;
        key_pos: each place's position (the window), [splits, R, 1, split size]."""
        lo, hi = (np.array(x) for x in zip(*(ranges[r] for r in rs)))
        n = hi - lo
        if n.max() <= 0:
            return {}
        hkv = batch.case.num_kv_heads
        sizes = np.array([self.split_size(batch, int(x)) if x > 0 else 1 for x in n])
        splits, size = int((-(-n // sizes)).max()), int(sizes.max())
        off = np.arange(splits)[:, None, None] * sizes[:, None] + np.arange(size)  # [S, R, size]
        real = (np.arange(size) < sizes[:, None]) & (off < n[:, None])
        pos = lo[:, None] + off
        at = np.array(rs)[:, None] * (width + 1) + np.minimum(pos, width)
        count = int(real.sum())
        key = np.full(real.shape, count)
        key[real] = np.arange(count)
        pad = key[:, :, None, :] * hkv + np.arange(hkv)[:, None]
        layout = {"key_at": at[real], "key_pad": pad}
        if self.paged_windowed(batch):
            layout["key_pos"] = pos[:, :, None, :]
        return layout

    def plan(self, batch: Batch) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        """Every group's layout as host integers, uploaded in one copy: per group where its queries and
        (ragged pass) new keys come from, laid out [R, heads, E] (padding repeats the request's
        first), their true positions (padding far in the future, so never a visible key), the
        positions the paged pass gives its queries for the window, the paged layout; and where each
        output row [sum E, Hq] sits in the groups' padded outputs."""
        ranges, queries, keys = self.request_sizes(batch)
        groups = self.groups(batch, queries, keys)
        qo = modes.offsets(queries)
        two = self.two_pass(batch)
        positions = np.array(batch.cpu_list("positions"))
        width = batch.req_to_token.shape[1]
        hq, hkv = batch.case.num_q_heads, batch.case.num_kv_heads
        layouts, out_at, base = [], np.zeros((qo[-1], hq), dtype=np.int64), 0
        for rs in groups:
            e = max(queries[r] for r in rs)
            used = np.arange(e) < np.array([queries[r] for r in rs])[:, None]  # [R, E]
            rows = np.array([qo[r] for r in rs])[:, None] + np.arange(e) * used
            layout = {"q_at": rows[:, None, :] * hq + np.arange(hq)[:, None]}  # [R, Hq, E]
            if two:
                layout["new_at"] = rows[:, None, :] * hkv + np.arange(hkv)[:, None]
                layout["pos"] = np.where(used, positions[rows], FAR)
            if self.paged_windowed(batch):
                layout["window_pos"] = np.zeros(used.shape, dtype=np.int64)
                for i, r in enumerate(rs):
                    layout["window_pos"][i, : queries[r]] = self.prefix_query_positions(batch, r)
            if batch.mode == Mode.TARGET_VERIFY:
                layout["requests"] = np.array(rs)
            layout.update(self.paged_layout(batch, rs, ranges, width))
            flat = base + np.arange(len(rs) * hq * e).reshape(len(rs), hq, e)  # [R, Hq, E] outputs
            out_at[rows[used]] = flat.transpose(0, 2, 1)[used]
            layouts.append(layout)
            base += flat.size
        names = [(g, k) for g, layout in enumerate(layouts) for k in layout]
        sent = upload_int32(batch.device, [layouts[g][k] for g, k in names] + [out_at])
        dev: list[dict[str, torch.Tensor]] = [{} for _ in layouts]
        for (g, k), t in zip(names, sent):
            dev[g][k] = t
        return dev, sent[-1]

    # --- the passes ---------------------------------------------------------------------------

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, batch: Batch
    ) -> Partial:
        """Every split of every request at once: q [R, Hkv, G * E, D] (a GQA group's queries stacked
        as rows, scaled by `scaled_queries`), k/v [splits, R, Hkv, n, D] float, mask [splits, R, E or
        1, n] -> Partial [splits, R, Hq, E, D] with base-2 LSE [splits, R, Hq, E]. Each split rounds
        its probabilities to the case dtype relative to its own maximum before P @ V, as a GPU
        kernel's tile does."""
        case = batch.case
        splits, r, hkv, n, d = k.shape
        hq = case.num_q_heads
        s = torch.matmul(q, k.transpose(-1, -2))  # [splits, R, Hkv, G * E, n]
        if case.soft_cap > 0:
            s = torch.tanh(s) * (case.soft_cap * LOG2E)
        p, base = self.weights(s.view(splits, r, hq, -1, n), mask[:, :, None])
        total = p.sum(-1)  # 0 only where no key is visible (the maximum weighs 1): output 0, LSE -inf
        o = torch.matmul(p.to(TORCH_DTYPES[case.dtype]).float().view(splits, r, hkv, -1, n), v)
        o = o.view(splits, r, hq, -1, d) / torch.where(total > 0, total, 1.0).unsqueeze(-1)
        return Partial(o, base + torch.log2(total))  # LSE -inf where no key is visible

    def weights(self, s: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A tile's unnormalised softmax: base-2 scores s [..., n] with the keys not `visible` hidden
        (-inf) -> (2^(s - max), max) over the last dimension; a row with no visible key has max 0."""
        s = torch.where(visible, s, float("-inf"))
        base = torch.nan_to_num(s.amax(-1), nan=math.nan, neginf=0.0)  # no visible key: 0
        return torch.exp2(s - base.unsqueeze(-1)), base

    def scaled_queries(self, batch: Batch, lay: dict[str, torch.Tensor]) -> torch.Tensor:
        """A group's queries as attend takes them, float, times the scale and log2 e (or over the soft
        cap, which attend applies before log2 e), as FlashInfer folds the scale into q."""
        case = batch.case
        pre = case.scale / case.soft_cap if case.soft_cap > 0 else case.scale * LOG2E
        q = take(batch.q.view(-1, case.head_dim), lay["q_at"])  # [R, Hq, E, D]
        return q.view(q.shape[0], case.num_kv_heads, -1, case.head_dim).float() * pre

    def paged_pass(
        self, batch: Batch, lay: dict[str, torch.Tensor], q: torch.Tensor, rt: torch.Tensor
    ) -> Partial:
        """The cached keys from the pool, in splits merged inside the 'kernel' (base 2). Non-causal, as
        engines call it: every key read here precedes every query (DECODE's own key sits at its
        position), so only the window masks. `rt`: req_to_token flattened with a zero column.
        An FP8 cache is read as FlashInfer reads it: the codes as they are, k_scale folded into the
        softmax scale (the queries), the pass's output times v_scale before any merge."""
        k, v = batch.pool.read(self.layer_slots(batch, take(rt, lay["key_at"])))
        if batch.case.kv_dtype is not None:  # FP8 codes, exactly, in a dtype every gather takes
            k, v = k.float(), v.float()
        count, d = k.shape[0], batch.case.head_dim
        kv = k.new_zeros(2, count + 1, *k.shape[1:])  # the real keys and values, then a zero one
        kv[0, :count], kv[1, :count] = k, v
        pad = lay["key_pad"]  # [splits, R, Hkv, n]
        kv = kv.view(2, -1, d).index_select(1, pad.view(-1)).view(2, *pad.shape, d).float()
        mask = pad[:, :, :1] < count * batch.case.num_kv_heads  # [splits, R, 1, n]: real keys
        if "key_pos" in lay:
            mask = mask & (lay["key_pos"] >= (lay["window_pos"] - self.window_left(batch))[None, :, :, None])
        if batch.case.kv_dtype is None:
            return merge_base2(self.attend(q, kv[0], kv[1], mask, batch))
        k_scale, v_scale = self.shared_kv_scales(batch)
        part = merge_base2(self.attend(q * k_scale, kv[0], kv[1], mask, batch))
        return Partial(part.out * v_scale, part.lse2)

    def ragged_pass(self, batch: Batch, lay: dict[str, torch.Tensor], q: torch.Tensor) -> Partial:
        """This forward's new tokens over their own in-flight K/V: causal (bidirectional in
        ENCODER_ONLY, with a right edge for a two-sided window), windowed, tree-masked."""
        pos = lay["pos"]
        key, query = pos[:, None, :], pos[:, :, None]
        mask = (key < FAR) & (query >= 0)  # [R, E queries, E keys]; padding is never seen
        if self.causal(batch):
            mask &= key <= query
        w = self.ragged_window_left(batch)
        if w >= 0:
            mask &= key >= query - w
        wr = self.window_right(batch)
        if wr >= 0:
            mask &= key <= query + wr
        if batch.mode == Mode.TARGET_VERIFY:  # every request has num_draft queries: no padding
            mask &= take(batch.tree_mask, lay["requests"])
        d = batch.case.head_dim
        k, v = (take(t.view(-1, d), lay["new_at"]).unsqueeze(0).float() for t in (batch.k_new, batch.v_new))
        return merge_base2(self.attend(q, k, v, mask.unsqueeze(0), batch))

    def apply_sinks(self, out: torch.Tensor, lse: torch.Tensor, batch: Batch) -> torch.Tensor:
        """A sink joins the softmax denominator once, after every merge: out * L / (L + e^sink)."""
        if batch.sinks is None:
            return out
        return out * torch.sigmoid(lse - batch.sinks.float()).unsqueeze(-1)

    # --- the forward --------------------------------------------------------------------------

    def run(self, batch: Batch) -> BackendOutput:
        two = self.two_pass(batch)
        if not two:
            self.write_kv(batch)  # DECODE reads its new token from the pool
        with phase("plan"):  # groups, split layout, gather indices: host integers, one upload
            layouts, out_at = self.plan(batch)
            rt = F.pad(batch.req_to_token, (0, 1)).view(-1) if any("key_at" in x for x in layouts) else None
        outs, lses = [], []
        for lay in layouts:
            q = self.scaled_queries(batch, lay)
            parts = [self.paged_pass(batch, lay, q, rt)] if "key_at" in lay else []
            if two:
                parts.append(self.ragged_pass(batch, lay, q))
            if parts:
                out, lse = merge_states([(p.out, self.natural_lse(p.lse2)) for p in parts])
            else:  # no key at all
                lse = torch.full(lay["q_at"].shape, -math.inf, device=batch.device)  # [R, Hq, E]
                out = torch.zeros(*lse.shape, batch.case.head_dim, device=batch.device)
            outs.append(out.reshape(-1, batch.case.head_dim))  # [R * Hq * E, D]
            lses.append(lse.reshape(-1))
        if two:
            self.write_kv(batch)  # the ragged path writes after attending over the in-flight K/V
        out, lse = (x[0] if len(x) == 1 else torch.cat(x) for x in (outs, lses))
        out, lse = take(out, out_at), take(lse, out_at)  # [sum E, Hq, D], [sum E, Hq]
        dt = TORCH_DTYPES[batch.case.dtype]
        return BackendOutput(out=self.apply_sinks(out, lse, batch).to(dt), lse=lse)


BACKENDS = {"torch_split": TorchSplit}
