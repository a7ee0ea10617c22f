"""The mask probe: which keys did a backend actually attend to, compared with the reference mask.

The failing case is rerun through `backend.run` with zero queries and one-hot V, so the output is
the attention weights themselves; a key counts as attended when its weight exceeds 1/16 of its
row's largest. It works for every backend, and cannot see bugs that change values but not the
support (scale, soft cap, sinks, GQA mapping, LSE). Why zero queries and this threshold:
docs/reports.md, "The mask probe".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.core.batch import Inputs, build_batch, kv_len, make_inputs
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES
from references.masks import RequestMask, case_masks

RELATIVE_THRESHOLD = 1.0 / 16
MAX_ELEMENTS = 50_000_000  # [queries, heads, keys] probabilities held at once
MAX_GRID_ROWS = 160
MAX_GRID_COLS = 640
MAX_LINES_PER_REQUEST = 8
MAX_LINES = 40
# Picture cells, from least to most severe; a binned cell shows the most severe cell inside it.
CELLS = ".#-+?!"
CELL_MEANING = {
    ".": "not visible, not attended",
    "#": "visible and attended",
    "-": "visible but NOT attended (missed)",
    "+": "attended but NOT visible (wrongly attended)",
    "?": "weight outside [0, 1]: data that is not this request's keys was mixed in",
    "!": "NaN/Inf: poisoned (unowned) memory was read",
}
CLEAN_LINE = (
    "every query attended exactly the keys the reference mask allows: the error is not in the mask "
    "(look at scores, scale, soft cap, sinks, GQA head mapping, LSE or merge)"
)
THRESHOLD_RULE = "q = 0 (uniform weights over visible keys); attended iff p > row max / 16"


@dataclass(kw_only=True)
class RequestProbe:
    request: int
    queries: int
    keys: int
    row_bin: int  # queries per picture row
    col_bin: int  # keys per picture column
    grid: list[str]  # one string per picture row, characters from CELLS
    extra: int  # (query, head, key) triples attended but not visible
    missed: int  # (query, head, key) triples visible but not attended
    nonfinite_rows: int  # (query, head) rows with NaN/Inf
    out_of_range: int  # probabilities outside [0, 1]
    summary: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class ProbeResult:
    backend: str
    device: str
    runs: int  # backend runs (chunks of head_dim keys)
    lines: list[str]
    requests: list[RequestProbe] = field(default_factory=list)
    error: str | None = None  # why the probe could not run

    @property
    def clean(self) -> bool:
        """The support matches the reference mask exactly and nothing unowned was read."""
        return self.error is None and not any(
            r.extra or r.missed or r.nonfinite_rows or r.out_of_range for r in self.requests
        )

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "device": self.device,
            "rule": THRESHOLD_RULE,
            "runs": self.runs,
            "clean": self.clean,
            "error": self.error,
            "lines": self.lines,
            "legend": CELL_MEANING,
            "requests": [r.to_dict() for r in self.requests],
        }


def one_hot_values(case: Case, chunk: int) -> list[torch.Tensor]:
    """V per request for one chunk: key t carries e_(t - chunk*D) if it is in the chunk, else 0."""
    d = case.head_dim
    out = []
    for r in range(case.batch_size):
        t = kv_len(case, r)
        v = torch.zeros(t, case.num_kv_heads, d, dtype=TORCH_DTYPES[case.dtype])
        lo, hi = chunk * d, min(t, (chunk + 1) * d)
        if lo < hi:
            idx = torch.arange(lo, hi)
            v[idx, :, idx - lo] = 1
        out.append(v)
    return out


def attention_probabilities(backend: Backend, case: Case, device: str) -> tuple[list[torch.Tensor], int]:
    """Per request [E, Hq, T] float32 probabilities as the backend computed them, and the run count.
    An FP8 cache is probed with v_scale 1, where one-hot V is stored exactly (1 / v_scale would round:
    weights up to 6% off, read as values from elsewhere); zero queries make K, and k_scale, moot."""
    if case.kv_dtype is not None:
        case = case.replace(v_scale=1.0)
    base = make_inputs(case)
    zero_q = [torch.zeros_like(q) for q in base.q]
    d = case.head_dim
    lens = [kv_len(case, r) for r in range(case.batch_size)]
    runs = -(-max(lens) // d)
    probs = [torch.zeros(req.extend_len, case.num_q_heads, t) for req, t in zip(case.requests, lens)]
    for c in range(runs):
        inputs = Inputs.from_requests(zero_q, base.k, one_hot_values(case, c), base.sinks)
        batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
        out = backend.run(batch).out.detach().float().cpu()
        q0 = 0
        for r, t in enumerate(lens):
            e = case.requests[r].extend_len
            lo, hi = c * d, min(t, (c + 1) * d)
            if lo < hi:
                probs[r][:, :, lo:hi] = out[q0 : q0 + e, :, : hi - lo]
            q0 += e
    return probs, runs


def attended(p: torch.Tensor) -> torch.Tensor:
    """[E, H, T] probabilities -> bool: above RELATIVE_THRESHOLD of its row's maximum (NaN: False)."""
    clean = torch.nan_to_num(p, nan=0.0, posinf=0.0, neginf=0.0)
    row_max = clean.amax(-1, keepdim=True)
    return (clean > row_max * RELATIVE_THRESHOLD) & (row_max > 0)


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0..2, 5, 7..8'."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}..{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _keys_phrase(case: Case, mask: RequestMask, keys: list[int]) -> str:
    """Name keys by position; verify drafts as 'draft i' (they sit at their depth, not their index)."""
    noun = "encoder key" if case.mode == Mode.CROSS else "key"
    prefix = [k for k in keys if k < mask.num_prefix]
    drafts = [k - mask.num_prefix for k in keys if k >= mask.num_prefix]
    parts = []
    if prefix:
        parts.append(f"{noun}{'s' if len(prefix) > 1 else ''} {_ranges(prefix)}")
    if drafts:
        parts.append(f"draft{'s' if len(drafts) > 1 else ''} {_ranges(drafts)}")
    return " and ".join(parts)


def _window_text(case: Case, p: int, mask: RequestMask) -> str:
    """The positions a query at p may see: up to itself (causal), up to p + R (a two-sided encoder
    window), or up to the request's last key (an encoder's left window)."""
    if mask.causal:
        right = p
    elif case.window_right >= 0:
        right = min(p + case.window_right, mask.num_keys - 1)
    else:
        right = mask.num_keys - 1
    return f"its window [{max(0, p - case.window_left)}, {right}]"


def _why_invisible(case: Case, mask: RequestMask, j: int, k: int) -> str:
    p = int(mask.query_pos[j])
    if mask.draft_visible is not None and k >= mask.num_prefix:
        if not bool(mask.draft_visible[j, k - mask.num_prefix]):
            return "not itself or an ancestor in its draft tree"
    if mask.causal and int(mask.key_pos[k]) > p:
        return "after its own position (causal mask)"
    return f"outside {_window_text(case, p, mask)}"


def _why_visible(case: Case, mask: RequestMask, j: int) -> str:
    p = int(mask.query_pos[j])
    if case.mode == Mode.CROSS:
        return "cross-attention sees every encoder key"
    if case.mode == Mode.ENCODER_ONLY and case.window_left < 0:
        return f"visible to it (encoder-only, no window: positions [0, {mask.num_keys - 1}])"
    if case.window_left >= 0:
        return f"inside {_window_text(case, p, mask)}"
    return f"visible to it (causal, no window: positions [0, {p}])"


def _heads_text(heads: list[int], total: int) -> str:
    if len(heads) == total:
        return f"all {total} heads" if total > 1 else "its only head"
    return f"head{'s' if len(heads) > 1 else ''} {_ranges(heads)} of {total}"


def _query_lines(
    case: Case, r: int, mask: RequestMask, j: int, att: torch.Tensor, vis: torch.Tensor, nan: torch.Tensor
) -> list[str]:
    """Lines for query j of request r: att [H, T] attended, vis [T] reference visibility, nan [H]
    heads whose row is NaN (reported on their own line, not as missed keys)."""
    p = int(mask.query_pos[j])
    who = f"request {r}, query {j} (position {p})"
    groups: dict[tuple, list[int]] = {}
    for h in range(att.shape[0]):
        if bool(nan[h]):
            continue
        extra = tuple((att[h] & ~vis).nonzero().flatten().tolist())
        missed = tuple((vis & ~att[h]).nonzero().flatten().tolist())
        if extra or missed:
            groups.setdefault((extra, missed), []).append(h)
    lines = []
    for (extra, missed), heads in groups.items():
        on = _heads_text(heads, att.shape[0])
        by_reason: dict[str, list[int]] = {}
        for k in extra:
            by_reason.setdefault(_why_invisible(case, mask, j, k), []).append(k)
        for why, keys in by_reason.items():
            lines.append(f"{who} attended {_keys_phrase(case, mask, keys)}, {why} ({on})")
        if missed:
            lines.append(
                f"{who} did not attend {_keys_phrase(case, mask, list(missed))}, "
                f"{_why_visible(case, mask, j)} ({on})"
            )
    return lines


def _grid(codes: torch.Tensor) -> tuple[list[str], int, int]:
    """[E, T] cell codes -> picture rows, binned to at most MAX_GRID_ROWS x MAX_GRID_COLS."""
    e, t = codes.shape
    rb, cb = max(1, -(-e // MAX_GRID_ROWS)), max(1, -(-t // MAX_GRID_COLS))
    if t == 0:
        return ["" for _ in range(-(-e // rb))], rb, cb
    padded = torch.zeros(-(-e // rb) * rb, -(-t // cb) * cb, dtype=codes.dtype)
    padded[:e, :t] = codes
    binned = padded.view(padded.shape[0] // rb, rb, padded.shape[1] // cb, cb).amax(dim=(1, 3))
    return ["".join(CELLS[int(c)] for c in row) for row in binned.tolist()], rb, cb


def _compare_request(
    case: Case, r: int, mask: RequestMask, p: torch.Tensor
) -> tuple[RequestProbe, list[str]]:
    vis = mask.dense()  # [E, T]
    att = attended(p)  # [E, H, T]
    nonfinite = ~torch.isfinite(p)
    nan_rows = nonfinite.any(-1)  # [E, H]
    out_of_range = torch.isfinite(p) & ((p < -0.01) | (p > 1.01))
    visb = vis.unsqueeze(1).expand_as(att)
    extra = att & ~visb
    missed = visb & ~att & ~nan_rows.unsqueeze(-1)
    codes = torch.zeros(att.shape, dtype=torch.int8)
    codes[att & visb] = 1
    codes[missed] = 2
    codes[extra] = 3
    codes[out_of_range] = 4
    codes[nan_rows] = 5
    grid, rb, cb = _grid(codes.amax(1))
    lines = []
    for j in range(att.shape[0]):
        if bool(nan_rows[j].any()):
            heads = nan_rows[j].nonzero().flatten().tolist()
            lines.append(
                f"request {r}, query {j} (position {int(mask.query_pos[j])}): NaN/Inf on "
                f"{_heads_text(heads, att.shape[1])}: poisoned (unowned) memory was read"
            )
        if bool(out_of_range[j].any()):
            lines.append(
                f"request {r}, query {j} (position {int(mask.query_pos[j])}): weights outside [0, 1]: "
                "values that are not this request's keys were mixed in"
            )
        lines += _query_lines(case, r, mask, j, att[j], vis[j], nan_rows[j])
    bad_q = int((extra.any(-1).any(-1) | missed.any(-1).any(-1) | nan_rows.any(-1)).sum())
    summary = (
        f"request {r}: {bad_q} of {att.shape[0]} queries differ from the reference mask "
        f"({int(extra.sum())} wrongly attended, {int(missed.sum())} missed (query, head, key) "
        f"triples, {int(nan_rows.sum())} NaN rows)"
    )
    probe = RequestProbe(
        request=r,
        queries=att.shape[0],
        keys=att.shape[2],
        row_bin=rb,
        col_bin=cb,
        grid=grid,
        extra=int(extra.sum()),
        missed=int(missed.sum()),
        nonfinite_rows=int(nan_rows.sum()),
        out_of_range=int(out_of_range.sum()),
        summary=summary,
    )
    return probe, lines


def probe(backend: Backend, case: Case, device: str = "cpu") -> ProbeResult:
    """Rerun `backend` on `case` with one-hot V and zero q; compare its support with the reference mask."""
    why = backend.available(device) or backend.supports(case)
    size = sum(r.extend_len * case.num_q_heads * kv_len(case, i) for i, r in enumerate(case.requests))
    if not why and size > MAX_ELEMENTS:
        why = f"case too large to probe ({size} probabilities > {MAX_ELEMENTS})"
    if why:
        return ProbeResult(backend=backend.name, device=device, runs=0, lines=[], error=why)
    try:
        probs, runs = attention_probabilities(backend, case, device)
    except Exception as e:  # a backend that crashes on the probe's inputs: say so, like a check would
        return ProbeResult(
            backend=backend.name,
            device=device,
            runs=0,
            lines=[],
            error=f"backend raised {type(e).__name__}: {e}",
        )
    requests, lines = [], []
    for r, mask in enumerate(case_masks(case)):
        rp, rl = _compare_request(case, r, mask, probs[r])
        requests.append(rp)
        if len(rl) > MAX_LINES_PER_REQUEST:
            rl = rl[:MAX_LINES_PER_REQUEST] + [
                f"... and {len(rl) - MAX_LINES_PER_REQUEST} more for request {r}"
            ]
        lines += ([rp.summary] if rl else []) + rl
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES] + [f"... and {len(lines) - MAX_LINES} more lines"]
    if not lines:
        lines = [CLEAN_LINE]
    return ProbeResult(backend=backend.name, device=device, runs=runs, lines=lines, requests=requests)


def picture_text(result: ProbeResult, max_rows: int = 40) -> str:
    """The probe's pictures as text (rows: queries, columns: keys), for a terminal."""
    out = []
    for rp in result.requests:
        out.append(
            f"request {rp.request}: {rp.queries} queries x {rp.keys} keys"
            + (f" ({rp.row_bin} queries x {rp.col_bin} keys per cell)" if rp.row_bin * rp.col_bin > 1 else "")
        )
        out += ["  " + row for row in rp.grid[:max_rows]]
        if len(rp.grid) > max_rows:
            out.append(f"  ... {len(rp.grid) - max_rows} more rows")
    out.append("legend: " + "; ".join(f"'{c}' {m}" for c, m in CELL_MEANING.items()))
    return "\n".join(out)
