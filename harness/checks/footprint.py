"""How much memory a check of a Case needs, against what the device has free: a bound on a case's size.

A case is plain data, so a prefix of 10^9 tokens is a valid Case; checking it would fail seconds or
minutes later with an allocation traceback (or take the machine's memory from everything else).
`fits` refuses it first, with one line naming the estimate and the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.checks import crossref
from harness.core.batch import kv_len
from harness.core.case import Case, CaseError
from harness.core.vocab import TORCH_DTYPES
from references.torch_ref import NATIVE_KEEP_BYTES, PADDED_MAX_ELEMENTS

HF_QUERY_BLOCK = 64  # references/hf_ref.py's QUERY_BLOCK (not imported: that imports transformers)
GIB = 1 << 30


def estimate(case: Case, device: str) -> dict[str, int]:
    """Bytes a check of `case` on `device` needs at its peak, by part: `pool` (the paged K/V pool with
    its spare quarter, and the SWA pool of a hybrid case), `inputs` (Q, K and V drawn in float32, kept
    in the case dtype, copied into the batch and the pool's writes; the padded [batch, longest row]
    slot tables) and `reference` (the longest request upcast to float64 on the CPU, float32 on a GPU,
    both references' outputs, the native pass's kept scores; on a GPU the padded batch; on the CPU
    the HF reference, which repeats K and V per query head). An estimate from the fields alone, on
    the high side. The backend's own working memory is not in it: that depends on the kernel."""
    item, ps = TORCH_DTYPES[case.dtype].itemsize, case.page_size
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    queries = [r.extend_len for r in case.requests]
    keys = [kv_len(case, i) for i in range(case.batch_size)]
    rows = [r.encoder_len + r.prefix_len + r.extend_len for r in case.requests]  # req_to_token's rows
    pages = sum(-(-n // ps) for n in rows)
    pool_pages = 1 + pages + max(2, pages // 4) + (pages if case.hybrid_swa_pool else 0)
    elements = (sum(queries) * hq + 2 * sum(keys) * hkv) * d
    tables = 6 * len(rows) * -(-max(rows) // ps) * ps * 8
    acc = 8 if device == "cpu" else 4
    e, t = max(queries), max(keys)
    reference = (e * hq + 2 * t * hkv) * d * acc + 3 * sum(queries) * hq * d * acc
    reference += min(NATIVE_KEEP_BYTES, hq * e * t * 4)
    if device != "cpu":  # a small batch is one padded computation: about four [B, Hq, E, T] float32 tensors
        reference += 16 * min(PADDED_MAX_ELEMENTS, len(rows) * hq * e * t)
    elif crossref.hf_available():
        reference += 2 * t * (hkv + hq) * d * 8 + 6 * hq * min(e, HF_QUERY_BLOCK) * t * 8
    return {
        "pool": 2 * pool_pages * ps * hkv * d * item,
        "inputs": elements * (4 + 3 * item) + tables,
        "reference": reference,
    }


def available(device: str) -> int | None:
    """Bytes free for a check now: the current CUDA device's free memory (torch.cuda.mem_get_info), or
    the host's available RAM (MemAvailable, within a cgroup's memory limit where one is set). None
    where it cannot be known (then there is no bound)."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    free = _meminfo_available()
    limit = _cgroup_room()
    return free if limit is None else limit if free is None else min(free, limit)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _cgroup_room() -> int | None:
    """What a cgroup v2 memory limit leaves (memory.max - memory.current), or None where unlimited."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        return None if limit == "max" else max(0, int(limit) - int(used))
    except (OSError, ValueError):
        return None


def fits(case: Case, device: str) -> None:
    """Raise CaseError, naming the estimate and the limit, when `case` needs more than `device` has free."""
    limit = available(device)
    parts = estimate(case, device)
    need = sum(parts.values())
    if limit is None or need <= limit:
        return
    queries = sum(r.extend_len for r in case.requests)
    keys = sum(kv_len(case, i) for i in range(case.batch_size))
    detail = ", ".join(f"{name} {_gib(n)}" for name, n in parts.items())
    raise CaseError(
        f"case too large for {device}: {case.batch_size} requests, {queries} queries, {keys} keys need "
        f"about {_gib(need)} ({detail}; see harness/checks/footprint.py), more than the {_gib(limit)} free"
    )


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"
