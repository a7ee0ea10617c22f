"""torch_split: an engine-style chunked fallback whose partial results are merged by log-sum-exp.

Per request, the cached keys (read from the paged pool) and this forward's new tokens (the in-flight
K/V: a "ragged" pass) are attended in separate passes, and the paged pass is cut into KV splits.
Every partial result carries its LSE and the glue merges them, as engines do around FlashInfer
(ragged + paged + merge_state) and split-KV decode kernels. This gives the CPU the code paths that
torch_native lacks, so their bug classes can be shown there: a window per pass, a base-2 LSE to
convert before merging, and split parameters that deterministic mode must fix.

Like FlashInfer's kernels, a pass returns base-2 LSE; the glue converts it to natural log. Like a GPU
kernel, a split rounds its probabilities to the case dtype before P @ V, relative to its own running
maximum, so how the keys were split shows in the output bits: without a fixed split size the split
depends on the batch (a scheduler spreading the work over WORK_UNITS), and batch invariance fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.backends.base import Backend, BackendOutput, Capabilities
from harness.backends.torch_native import row_slots
from harness.batch import TORCH_DTYPES, Batch
from harness.modes import Mode
from harness.pool import translate_slots
from harness.timing import phase

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
WORK_UNITS = 16  # splits the scheduler spreads over the batch when no split size is fixed
DETERMINISTIC_SPLIT = 32  # keys per split in deterministic mode (the engine's fixed_split_size)


@dataclass(frozen=True)
class SplitParams:
    """The engine's split-KV arguments: a fixed split size (keys) or none split at all."""

    fixed_split_size: int | None = None
    disable_split_kv: bool = False


@dataclass
class Partial:
    """One pass over some keys: output normalised over them, and their LSE in base 2 (-inf: none seen).
    A leading dimension, when there is one, counts the KV splits of the pass."""

    out: torch.Tensor  # [(splits,) E, Hq, D] float32
    lse2: torch.Tensor  # [(splits,) E, Hq] float32


def merge_base2(splits: Partial) -> Partial:
    """Merge the splits (leading dimension) of a pass whose LSE is base 2: the kernel's own merge."""
    top = splits.lse2.amax(0)
    base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp2(splits.lse2 - base)
    total = w.sum(0)
    out = (w.unsqueeze(-1) * splits.out).sum(0)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return Partial(out / safe.unsqueeze(-1), torch.where(total > 0, base + torch.log2(safe), top))


def merge_states(states: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_state: combine (out, natural-log LSE) pairs into one (out, LSE)."""
    lse = torch.stack([s[1] for s in states])
    top = lse.amax(0)
    base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(lse - base)
    total = w.sum(0)
    out = sum(wi.unsqueeze(-1) * s[0] for wi, s in zip(w, states))
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return out / safe.unsqueeze(-1), torch.where(total > 0, base + torch.log(safe), top)


class TorchSplit(Backend):
    name = "torch_split"
    library = "torch"
    capabilities = Capabilities(
        modes=frozenset(Mode),
        dtypes=frozenset({"bfloat16", "float16", "float32"}),
        kv_layouts=frozenset({"NHD", "HND"}),
        devices=frozenset({"cpu", "cuda"}),
        window=True,
        soft_cap=True,
        sinks=True,
        hybrid_pool=True,
        deterministic=True,
        returns_lse=True,
        tree=True,
    )

    # --- engine glue, one decision per method -------------------------------------------------

    def write_kv(self, batch: Batch) -> None:
        """Store this forward's new K/V at `out_cache_loc` (translated on a hybrid SWA layer)."""
        if batch.k_new.shape[0]:
            batch.pool.write(self.layer_slots(batch, batch.out_cache_loc), batch.k_new, batch.v_new)

    def layer_slots(self, batch: Batch, slots: torch.Tensor) -> torch.Tensor:
        """Full-pool slots -> this layer's pool (the SWA pool on a hybrid SWA layer)."""
        return translate_slots(slots, batch.full_to_swa)

    def window_left(self, batch: Batch) -> int:
        """The layer's window for the paged pass (-1: none)."""
        return batch.case.window_left

    def ragged_window_left(self, batch: Batch) -> int:
        """The window the ragged pass over the new tokens gets: the same as the paged pass's."""
        return self.window_left(batch)

    def prefix_query_positions(self, batch: Batch, r: int) -> torch.Tensor:
        """Where the paged pass places request r's queries for its window: their true positions."""
        q0, q1 = batch.query_span(r)
        return batch.positions[q0:q1].long()

    def paged_range(self, batch: Batch, r: int) -> tuple[int, int]:
        """Keys lo..hi-1 the paged pass reads: the prefix (two-pass modes), all keys (DECODE), or the
        encoder (CROSS); from the first query's window start on, as the hybrid pool frees older pages."""
        if batch.mode == Mode.CROSS:
            return 0, batch.cpu_list("encoder_lens")[r]
        hi = batch.cpu_list("prefix_lens" if self.two_pass(batch) else "seq_lens")[r]
        w = self.window_left(batch)
        lo = max(0, batch.first_position(r) - w) if w >= 0 else 0
        return min(lo, hi), hi

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
        """Modes with new tokens attended in flight (ragged) next to the cached prefix (paged)."""
        return batch.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY)

    # --- the passes ---------------------------------------------------------------------------

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, batch: Batch
    ) -> Partial:
        """Every split at once: q [E, Hq, D], k/v [splits, n, Hkv, D], mask [splits, E, n] -> Partial
        with a leading split dimension (base-2 LSE). Each split rounds its probabilities to the case
        dtype relative to its own maximum before P @ V, as a GPU kernel's tile does."""
        case = batch.case
        e, hq, d = q.shape
        hkv = k.shape[2]
        qh = q.float().permute(1, 0, 2).reshape(1, hkv, hq // hkv, e, d)
        kh = k.float().permute(0, 2, 1, 3).unsqueeze(2)  # [splits, Hkv, 1, n, D]
        vh = v.float().permute(0, 2, 1, 3).unsqueeze(2)
        s = torch.matmul(qh, kh.transpose(-1, -2)) * case.scale  # [splits, Hkv, G, E, n]
        if case.soft_cap > 0:
            s = case.soft_cap * torch.tanh(s / case.soft_cap)
        s = s.masked_fill(~mask[:, None, None], float("-inf")) * LOG2E
        top = s.amax(-1)
        base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
        p = torch.exp2(s - base.unsqueeze(-1))
        total = p.sum(-1)
        o = torch.matmul(p.to(TORCH_DTYPES[case.dtype]).float(), vh)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        o = o / safe.unsqueeze(-1)
        lse2 = torch.where(total > 0, base + torch.log2(safe), top)
        splits = k.shape[0]
        return Partial(
            o.reshape(splits, hq, e, d).permute(0, 2, 1, 3), lse2.reshape(splits, hq, e).permute(0, 2, 1)
        )

    def paged_pass(self, batch: Batch, r: int) -> Partial:
        """The cached keys from the pool, in splits merged inside the 'kernel' (base 2). Non-causal, as
        engines call it: every key read here precedes every query (DECODE's own key sits at its
        position), so only the window masks."""
        q0, q1 = batch.query_span(r)
        q = batch.q[q0:q1]
        lo, hi = self.paged_range(batch, r)
        if hi <= lo:
            return Partial(
                torch.zeros(q.shape, dtype=torch.float32, device=batch.device),
                torch.full(q.shape[:2], -math.inf, device=batch.device),
            )
        with phase("plan"):  # gather, window mask and split layout
            k, v = batch.pool.read(self.layer_slots(batch, row_slots(batch, r, lo, hi)))
            mask = torch.ones(q1 - q0, hi - lo, dtype=torch.bool, device=batch.device)
            w = self.window_left(batch)
            if w >= 0 and batch.mode != Mode.CROSS:
                qpos = self.prefix_query_positions(batch, r)
                mask &= torch.arange(lo, hi, device=batch.device)[None, :] >= qpos[:, None] - w
            size = self.split_size(batch, hi - lo)
            splits = -(-(hi - lo) // size)
            pad = splits * size - (hi - lo)  # the last split is padded with masked-out zero keys
            k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)).reshape(splits, size, *t.shape[1:]) for t in (k, v))
            mask = F.pad(mask, (0, pad)).reshape(q1 - q0, splits, size).transpose(0, 1)
        return merge_base2(self.attend(q, k, v, mask, batch))

    def ragged_pass(self, batch: Batch, r: int) -> Partial:
        """This forward's new tokens over their own in-flight K/V: causal, windowed, tree-masked."""
        q0, q1 = batch.query_span(r)
        with phase("plan"):  # the causal / window / tree mask
            pos = batch.positions[q0:q1].long()
            mask = pos[None, :] <= pos[:, None]
            w = self.ragged_window_left(batch)
            if w >= 0:
                mask &= pos[None, :] >= pos[:, None] - w
            if batch.mode == Mode.TARGET_VERIFY:
                mask &= batch.tree_mask[r]
        k, v = batch.k_new[q0:q1].unsqueeze(0), batch.v_new[q0:q1].unsqueeze(0)
        return merge_base2(self.attend(batch.q[q0:q1], k, v, mask.unsqueeze(0), batch))

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
        outs, lses = [], []
        for r in range(batch.batch_size):
            parts = [self.paged_pass(batch, r)] + ([self.ragged_pass(batch, r)] if two else [])
            out, lse = merge_states([(p.out, self.natural_lse(p.lse2)) for p in parts])
            outs.append(self.apply_sinks(out, lse, batch))
            lses.append(lse)
        if two:
            self.write_kv(batch)  # the ragged path writes after attending over the in-flight K/V
        dt = TORCH_DTYPES[batch.case.dtype]
        return BackendOutput(out=torch.cat(outs).to(dt), lse=torch.cat(lses))


BACKENDS = {"torch_split": TorchSplit}
