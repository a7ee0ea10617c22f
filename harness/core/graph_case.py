"""The GraphCase: a CUDA-graph replay sequence as plain, JSON-serialisable data, validated.

An engine allocates its metadata buffers for a largest batch and context, captures its forward at
the padded batch sizes, then replays one graph after another on batches of one layer. A GraphCase
is that: the limits (`max_batch` requests, `max_kv` keys per request) and the batches replayed in
order, each a Case. The batches share the layer (every Case field but the per-batch ones:
`requests`, `seed`, `page_layout`, `q_amplitude`) and their mode's queries per request (the captured
shape); each must fit the limits. Printed as JSON it is a complete, replayable bug report
(`python -m harness repro`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from harness.core import modes
from harness.core.batch import kv_len
from harness.core.case import INT32_MAX, Case, CaseError, load_json, shown
from harness.core.modes import Mode

GRAPH_MODES = (Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2)  # what engines capture
PER_BATCH_FIELDS = ("requests", "seed", "page_layout", "q_amplitude")
MAX_BATCHES = 16
SEQ_LEN_FILL = 1  # seq_lens of a padding request (sglang's get_cuda_graph_seq_len_fill_value)


@dataclass(frozen=True)
class GraphCase:
    """Buffers for `max_batch` requests of up to `max_kv` keys; `batches` replayed in order."""

    batches: tuple[Case, ...]
    max_batch: int
    max_kv: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", tuple(self.batches))
        validate(self)

    @property
    def layer(self) -> Case:
        """The first batch: the layer's shape every batch shares."""
        return self.batches[0]

    @property
    def mode(self) -> Mode:
        return self.layer.mode

    @property
    def requests(self) -> tuple:
        """Every replayed request, batch after batch (what a hunt's family and size read)."""
        return tuple(r for c in self.batches for r in c.requests)

    @property
    def queries(self) -> int:
        """Queries per request: 1 in DECODE, num_draft otherwise (the captured shape)."""
        return self.layer.requests[0].extend_len

    def replace_layer(self, **changes: Any) -> GraphCase:
        """Every batch with these Case fields changed (layer fields: the batches keep sharing them)."""
        return GraphCase(tuple(c.replace(**changes) for c in self.batches), self.max_batch, self.max_kv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_batch": self.max_batch,
            "max_kv": self.max_kv,
            "batches": [c.to_dict() for c in self.batches],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphCase:
        if not isinstance(d, dict):
            raise CaseError(f"a GraphCase is a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {"max_batch", "max_kv", "batches"})
        if unknown:
            raise CaseError(f"unknown GraphCase field(s): {', '.join(unknown)}")
        for name in ("max_batch", "max_kv", "batches"):
            if name not in d:
                raise CaseError(f"GraphCase field '{name}' is missing")
        if not isinstance(d["batches"], list):
            raise CaseError(f"batches={d['batches']!r:.80} must be a list of Cases")
        batches = []
        for i, c in enumerate(d["batches"]):
            try:
                batches.append(Case.from_dict(c))
            except (CaseError, TypeError) as e:
                raise CaseError(f"batches[{i}]: {e}") from None
        return cls(tuple(batches), d["max_batch"], d["max_kv"])

    @classmethod
    def from_json(cls, text: str) -> GraphCase:
        return cls.from_dict(load_json(text))


def layer_fields(case: Case) -> dict[str, Any]:
    """The Case fields a graph's batches must share (all but PER_BATCH_FIELDS)."""
    return {f.name: getattr(case, f.name) for f in dataclasses.fields(case) if f.name not in PER_BATCH_FIELDS}


def kv_extents(case: Case) -> list[int]:
    """Keys each request of a graph-mode batch reads (P + E in every graph mode)."""
    return [kv_len(case, r) for r in range(case.batch_size)]


def padding_extent(mode: Mode, queries: int) -> int:
    """The KV extent of a padding request: its seq_lens hold the engine's fill value SEQ_LEN_FILL
    (bumped by num_draft in DRAFT_EXTEND_V2, as every request of that batch is)."""
    seq = SEQ_LEN_FILL + (queries if mode == Mode.DRAFT_EXTEND_V2 else 0)
    return modes.kv_extent(mode, seq, queries if mode != Mode.DECODE else 0, 0)


def validate(g: GraphCase) -> None:
    """Raise CaseError naming the first bad field."""
    for name in ("max_batch", "max_kv"):
        value = getattr(g, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
            raise CaseError(
                f"{name}={shown(value)} must be an integer in [1, {INT32_MAX}] (int32, as engines use)"
            )
    if not 1 <= len(g.batches) <= MAX_BATCHES:
        raise CaseError(f"batches has {len(g.batches)} entries: a GraphCase replays 1 to {MAX_BATCHES}")
    for i, c in enumerate(g.batches):
        if not isinstance(c, Case):
            raise CaseError(f"batches[{i}]={c!r:.80} is not a Case")
    first = g.layer
    if first.mode not in GRAPH_MODES:
        raise CaseError(f"batches[0].mode={first.mode} is not captured: {', '.join(map(str, GRAPH_MODES))}")
    layer = layer_fields(first)
    queries = g.queries
    for i, c in enumerate(g.batches):
        other = layer_fields(c)
        diff = next((k for k in layer if layer[k] != other[k]), None)
        if diff:
            raise CaseError(
                f"batches[{i}].{diff}={other[diff]!r} differs from batches[0].{diff}={layer[diff]!r}: "
                "the batches of a graph share the layer"
            )
        if c.requests[0].extend_len != queries:
            raise CaseError(
                f"batches[{i}] has {c.requests[0].extend_len} queries per request, batches[0] {queries}: "
                "the captured shape is fixed"
            )
        if c.batch_size > g.max_batch:
            raise CaseError(f"batches[{i}] has {c.batch_size} requests, past max_batch={g.max_batch}")
        longest = max(kv_extents(c))
        if longest > g.max_kv:
            raise CaseError(f"batches[{i}] has a request of {longest} keys, past max_kv={g.max_kv}")
    padding = padding_extent(first.mode, queries)
    if g.max_kv < padding:
        raise CaseError(f"max_kv={g.max_kv} cannot hold a padding request's {padding} keys")
    if first.swa_pool_exact:
        raise CaseError(
            "swa_pool_exact=true: a graph's static pool holds every batch's pool, so it is larger than one"
        )
