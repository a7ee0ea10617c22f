"""The Case: a plain, JSON-serialisable description of one batch, validated with clear errors.

Everything else (tensors, pools, engine metadata, expected output) is derived from a Case, so a
Case printed as JSON is a complete, replayable bug report.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from harness.core import logits
from harness.core.modes import Mode, tree_depths
from harness.core.vocab import CASE_FEATURES, DTYPES, KV_DTYPES, SHAPE_TRAITS

PAGE_SIZES = (1, 16, 32, 64, 128)
PAGE_LAYOUTS = ("contiguous", "shuffled", "interleaved", "nonmonotonic")
KV_LAYOUTS = ("NHD", "HND")
MAX_SEED = 2**63 - 1
# Engines pass lengths, windows, head counts and token indices to kernels as int32 (seq_lens,
# window_left, indptr arrays): a larger value wraps or overflows there, so a Case cannot hold one.
INT32_MAX = 2**31 - 1
# A value shown in an error is cut to this many characters (a 50 MB string is not echoed whole).
SHOWN_CHARS = 80
FLOAT32_MAX = 3.4028234663852886e38  # every kernel and the references hold their logits in float32
# Drawn queries and keys stay within this many standard deviations (torch's normal sampling cannot
# pass about 9), so |logit| <= scale * q_amplitude * head_dim * DRAW_BOUND**2.
DRAW_BOUND = 10.0
# The references check a batch's requests one by one on the CPU, about 20 ms each: 1024 (the suite
# draws 8 at most) take 20 s; 200,000 would run for an hour without a word.
MAX_REQUESTS = 1024
# FP8 KV-cache scales a Case may name: kernels take them as float32, whose normal range holds these.
SCALE_RANGE = (1e-30, 1e30)
# Fields a Case without an FP8 KV cache leaves out of its JSON (their defaults), so that its JSON,
# repro command and reports read as they did before FP8 caches existed.
FP8_FIELDS = ("kv_dtype", "k_scale", "v_scale")
# Fields a Case with plain logits leaves out of its JSON, likewise (harness/core/logits.py).
LOGIT_FIELDS = ("logits", "logit_offset")


class CaseError(ValueError):
    """A Case that cannot describe a real batch; the message names the field and its value."""


def cut(text: str) -> str:
    """`text` for an error message: its first SHOWN_CHARS characters and how long it was, so that one
    line names the problem whatever the size of what it quotes."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def shown(value: Any) -> str:
    """`repr(value)`, cut for an error message."""
    return cut(repr(value))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice (json would keep the last)."""
    d: dict[str, Any] = {}
    for key, value in pairs:
        if key in d:
            raise CaseError(f"field {shown(key)} is given twice in one object: which value is meant?")
        d[key] = value
    return d


def load_json(text: str) -> Any:
    """The JSON text of a Case (or a GraphCase) parsed; malformed JSON or a duplicate key is a CaseError."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:  # a syntax error, a 5000-digit integer, deep nesting
        if isinstance(e, CaseError):
            raise
        raise CaseError(f"malformed JSON: {e}") from None


@dataclass(frozen=True)
class Request:
    """One request: P cached tokens, E new query tokens, and mode-specific extras.

    `tree` (TARGET_VERIFY only) holds the parent of each draft token in flattened order; -1 marks a
    child of the last accepted token, which sits at depth 0. A chain is (-1, 0, 1, ...).
    `encoder_len` (CROSS only) is the number of encoder keys the decoder queries attend to.
    """

    prefix_len: int = 0
    extend_len: int = 1
    encoder_len: int = 0
    tree: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"prefix_len": self.prefix_len, "extend_len": self.extend_len}
        if self.encoder_len:
            d["encoder_len"] = self.encoder_len
        if self.tree is not None:
            d["tree"] = list(self.tree)
        return d


@dataclass(frozen=True, kw_only=True)
class Case:
    """One batch for one attention layer. docs/design.md, "Conventions", gives the semantics."""

    mode: str
    requests: tuple[Request, ...]
    num_q_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "bfloat16"
    window_left: int = -1
    window_right: int = -1  # ENCODER_ONLY's two-sided window: keys up to p + R; -1 none
    soft_cap: float = 0.0
    sinks: bool = False
    sm_scale: float | None = None
    page_size: int = 16
    page_layout: str = "shuffled"
    kv_layout: str = "NHD"
    hybrid_swa_pool: bool = False
    swa_pool_exact: bool = False
    deterministic: bool = False
    q_amplitude: float = 1.0
    kv_dtype: str | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    logits: str = "plain"  # a logit pattern (harness/core/logits.py): plain, offset, dominant, ties
    logit_offset: float = 0.0  # the pattern's common offset L added to every logit of every row
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        validate(self)

    @property
    def scale(self) -> float:
        """Softmax scale: sm_scale, or 1/sqrt(head_dim) when not given."""
        return self.sm_scale if self.sm_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if self.kv_dtype is None and f.name in FP8_FIELDS:
                continue
            if self.logits == "plain" and f.name in LOGIT_FIELDS:
                continue
            value = getattr(self, f.name)
            d[f.name] = [r.to_dict() for r in value] if f.name == "requests" else value
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        if not isinstance(d, dict):
            raise CaseError(f"a Case is a JSON object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise CaseError(f"unknown Case field(s): {cut(', '.join(unknown))}")
        for name in ("mode", "requests"):
            if name not in d:
                raise CaseError(f"Case field '{name}' is missing")
        if not isinstance(d["requests"], list):
            raise CaseError(f"requests={shown(d['requests'])} must be a list of objects")
        reqs = []
        req_known = {f.name for f in dataclasses.fields(Request)}
        for i, r in enumerate(d["requests"]):
            if not isinstance(r, dict):
                raise CaseError(f"requests[{i}]={shown(r)} must be an object")
            bad = sorted(set(r) - req_known)
            if bad:
                raise CaseError(f"requests[{i}] has unknown field(s): {cut(', '.join(bad))}")
            tree = r.get("tree")
            if tree is not None and not isinstance(tree, list):
                raise CaseError(f"requests[{i}].tree={shown(tree)} must be a list of parent indices")
            reqs.append(Request(**{**r, "tree": tuple(tree) if tree is not None else None}))
        return cls(**{**d, "requests": tuple(reqs)})

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls.from_dict(load_json(text))


def _int(name: str, value: Any, lo: int, hi: int = INT32_MAX) -> None:
    """An integer field in [lo, hi]; by default hi is int32's largest, the engines' range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaseError(f"{name}={shown(value)} must be an integer")
    if value < lo and hi == INT32_MAX:
        raise CaseError(f"{name}={shown(value)} must be >= {lo}")
    if not lo <= value <= hi:
        why = " (int32, as engines pass it to kernels)" if hi == INT32_MAX else ""
        raise CaseError(f"{name}={shown(value)} must be in [{lo}, {hi}]{why}")


def _number(name: str, value: Any) -> float:
    """A real-valued field as a float (an integer too large for a float: infinity); a bool, a string or
    anything else is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CaseError(f"{name}={shown(value)} must be a number")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _choice(name: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise CaseError(f"{name}={shown(value)} is not one of {', '.join(map(str, options))}")


def _validate_request(case: Case, i: int, r: Request) -> None:
    n = f"requests[{i}]"
    if not isinstance(r, Request):
        raise CaseError(f"{n}={shown(r)} is not a Request")
    _int(f"{n}.prefix_len", r.prefix_len, 0)
    _int(f"{n}.extend_len", r.extend_len, 1)
    _int(f"{n}.encoder_len", r.encoder_len, 0)
    mode = case.mode
    if mode == Mode.ENCODER_ONLY and r.prefix_len:
        raise CaseError(
            f"{n}.prefix_len={r.prefix_len} must be 0 in ENCODER_ONLY: an encoder forward caches nothing"
        )
    if mode == Mode.DECODE and r.extend_len != 1:
        raise CaseError(f"{n}.extend_len={r.extend_len} must be 1 in DECODE")
    if mode == Mode.CROSS:
        if r.encoder_len < 1:
            raise CaseError(f"{n}.encoder_len={r.encoder_len} must be >= 1 in CROSS")
    elif r.encoder_len:
        raise CaseError(f"{n}.encoder_len={r.encoder_len} is only meaningful in CROSS, not {mode}")
    if mode == Mode.TARGET_VERIFY:
        if r.tree is None:
            raise CaseError(f"{n}.tree is required in TARGET_VERIFY (a chain is [-1, 0, 1, ...])")
        if len(r.tree) != r.extend_len:
            raise CaseError(
                f"{n}.tree has {len(r.tree)} nodes but extend_len={r.extend_len}: one query per draft"
            )
        for j, p in enumerate(r.tree):
            if isinstance(p, bool) or not isinstance(p, int) or not -1 <= p < j:
                raise CaseError(f"{n}.tree[{j}]={shown(p)} must be -1 or the index of an earlier node")
        tree_depths(r.tree)
    elif r.tree is not None:
        raise CaseError(f"{n}.tree is only meaningful in TARGET_VERIFY, not {mode}")
    if mode in (Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY):
        first = case.requests[0].extend_len
        if r.extend_len != first:
            raise CaseError(
                f"{n}.extend_len={r.extend_len} differs from requests[0].extend_len={first}: "
                f"{mode} uses one num_draft for the whole batch"
            )


def _validate_logit_range(case: Case) -> None:
    """Reject a case whose logits can pass float32's range: no kernel and no reference can compute
    it. Half the range is the limit, so no rounding on the way can reach infinity."""
    pattern = logits.reach(case.logits, case.logit_offset, case.scale, case.q_amplitude, case.head_dim)
    reach = case.scale * case.q_amplitude * case.head_dim * DRAW_BOUND**2 + pattern
    if reach > FLOAT32_MAX / 2:
        raise CaseError(
            f"sm_scale={shown(case.sm_scale)} with q_amplitude={shown(case.q_amplitude)} and "
            f"head_dim={case.head_dim}: "
            f"logits can reach {reach:.3g}, past {FLOAT32_MAX / 2:.3g} (half of float32's range, "
            "in which kernels and references compute logits)"
        )


def _validate_kv_cache(case: Case) -> None:
    """kv_dtype: null (the cache holds the case dtype) or an FP8 dtype; k_scale and v_scale: the
    per-tensor scales the cache stores K / k_scale and V / v_scale with, meaningful only in FP8."""
    if case.kv_dtype is not None:
        _choice("kv_dtype", case.kv_dtype, KV_DTYPES)
    lo, hi = SCALE_RANGE
    for name in ("k_scale", "v_scale"):
        value = getattr(case, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise CaseError(f"{name}={shown(value)} must be a positive finite number in [{lo:g}, {hi:g}]")
        if case.kv_dtype is None and value != 1.0:
            raise CaseError(
                f"{name}={shown(value)} is only meaningful with an FP8 kv_dtype (kv_dtype is null)"
            )


def _validate_windows(case: Case) -> None:
    """The window fields and the hybrid SWA pool against the mode and each other."""
    if case.mode == Mode.CROSS and case.window_left != -1:
        raise CaseError(
            f"window_left={case.window_left} has no meaning in CROSS: cross-attention has no window"
        )
    if case.window_right >= 0 and case.mode != Mode.ENCODER_ONLY:
        raise CaseError(
            f"window_right={case.window_right} is only meaningful in ENCODER_ONLY, not {case.mode}: "
            "a causal query's right edge is itself"
        )
    if case.window_right >= 0 and case.window_left < 0:
        raise CaseError(
            f"window_right={case.window_right} needs window_left >= 0: a two-sided window has a left edge too"
        )
    if case.hybrid_swa_pool and case.window_left < 0:
        raise CaseError(
            "hybrid_swa_pool=true needs window_left >= 0: only sliding-window layers read the SWA pool"
        )
    if case.swa_pool_exact and not case.hybrid_swa_pool:
        raise CaseError("swa_pool_exact=true needs hybrid_swa_pool=true")


def _validate_logits(case: Case) -> None:
    """logits: a pattern of harness/core/logits.py; logit_offset: its common offset, 0 with plain
    logits, within what the case dtype resolves for `offset`. The pattern writes one component of
    the queries and keys, which an FP8 cache could not hold."""
    _choice("logits", case.logits, logits.PATTERNS)
    offset = _number("logit_offset", case.logit_offset)
    if not abs(offset) <= logits.MAX_OFFSET:
        bound = f"{logits.MAX_OFFSET:g}"
        raise CaseError(f"logit_offset={case.logit_offset!r} must be in [-{bound}, {bound}]")
    if case.logits == "plain" and offset:
        raise CaseError(f"logit_offset={case.logit_offset!r} needs a logits pattern (logits is plain)")
    if case.logits == "plain":
        return
    if case.logits == "offset" and not offset:
        raise CaseError("logits='offset' needs a nonzero logit_offset: the offset is the pattern")
    if case.kv_dtype is not None:
        raise CaseError(
            f"logits={case.logits!r} needs kv_dtype null: an FP8 cache cannot hold the key component "
            "that makes the pattern"
        )
    if case.sinks and offset < 0:
        raise CaseError(
            f"logit_offset={case.logit_offset!r} with sinks=true: a sink outweighs every key by about "
            f"e^{-offset:g}, and the output underflows the dtype (no tolerance can judge it)"
        )
    resolved = logits.OFFSET_RESOLVED[case.dtype]
    if case.logits == "offset" and abs(offset) > resolved:
        raise CaseError(
            f"logit_offset={case.logit_offset!r} with logits='offset' must be within +-{resolved:g} in "
            f"{case.dtype}: past it the dtype's rounding of every logit is more than the tolerance can judge"
        )
    largest = logits.largest_component(case.logits, offset, case.scale, case.q_amplitude, case.head_dim)
    if largest > logits.FLOAT_MAX[case.dtype] / 4:
        raise CaseError(
            f"logits={case.logits!r} with logit_offset={case.logit_offset!r} and sm_scale={case.sm_scale!r} "
            f"needs a query or key component of {largest:.3g}, past a quarter of {case.dtype}'s range"
        )


def validate(case: Case) -> None:
    """Raise CaseError naming the first bad field; a valid Case describes a real batch."""
    _choice("mode", case.mode, tuple(m.value for m in Mode))
    object.__setattr__(case, "mode", Mode(case.mode))
    if not case.requests:
        raise CaseError("requests is empty: a batch needs at least one request")
    if len(case.requests) > MAX_REQUESTS:
        raise CaseError(f"requests has {len(case.requests)} entries: a case holds at most {MAX_REQUESTS}")
    _int("num_q_heads", case.num_q_heads, 1)
    _int("num_kv_heads", case.num_kv_heads, 1)
    if case.num_q_heads % case.num_kv_heads:
        raise CaseError(
            f"num_q_heads={case.num_q_heads} is not a multiple of num_kv_heads={case.num_kv_heads}"
        )
    _int("head_dim", case.head_dim, 8, 512)
    if case.head_dim % 8:
        raise CaseError(f"head_dim={case.head_dim} must be a multiple of 8")
    _choice("dtype", case.dtype, DTYPES)
    _int("window_left", case.window_left, -1)
    _int("window_right", case.window_right, -1)
    if not 0 <= _number("soft_cap", case.soft_cap) < math.inf:
        raise CaseError(f"soft_cap={shown(case.soft_cap)} must be finite and >= 0 (0 means no cap)")
    if case.sm_scale is not None and not 0 < _number("sm_scale", case.sm_scale) < math.inf:
        raise CaseError(f"sm_scale={shown(case.sm_scale)} must be a positive number or null")
    _int("page_size", case.page_size, 1)  # 16.0 == 16 and True == 1: `in PAGE_SIZES` alone takes both
    _choice("page_size", case.page_size, PAGE_SIZES)
    _choice("page_layout", case.page_layout, PAGE_LAYOUTS)
    _choice("kv_layout", case.kv_layout, KV_LAYOUTS)
    for name in ("sinks", "hybrid_swa_pool", "swa_pool_exact", "deterministic"):
        if not isinstance(getattr(case, name), bool):
            raise CaseError(f"{name}={shown(getattr(case, name))} must be true or false")
    if not 0 < _number("q_amplitude", case.q_amplitude) <= 1000:
        raise CaseError(f"q_amplitude={shown(case.q_amplitude)} must be in (0, 1000]")
    _validate_logits(case)
    _validate_logit_range(case)
    _int("seed", case.seed, 0, MAX_SEED)
    _validate_kv_cache(case)
    _validate_windows(case)
    for i, r in enumerate(case.requests):
        _validate_request(case, i, r)
    tokens = sum(r.prefix_len + r.extend_len + r.encoder_len for r in case.requests)
    if tokens > INT32_MAX:
        raise CaseError(
            f"requests hold {tokens} tokens in all, past {INT32_MAX}: engines index the KV pool's "
            "slots and the batch's tokens as int32"
        )


def case_traits(case: Case) -> set[str]:
    """The case's features, its mode's name and its SHAPE_TRAITS: what an `exclusive` pair can name."""
    tree = case.mode == Mode.TARGET_VERIFY and any(
        p != j - 1 for r in case.requests for j, p in enumerate(r.tree or ())
    )
    cross_prefill = case.mode == Mode.CROSS and any(r.extend_len != 1 for r in case.requests)
    shape = {"tree": tree, "cross_prefill": cross_prefill}
    return {*case_features(case), str(case.mode), *(t for t in SHAPE_TRAITS if shape[t])}


def case_features(case: Case) -> list[str]:
    """The features this case uses, in CASE_FEATURES order."""
    used = {
        "window": case.window_left >= 0,
        "window_right": case.window_right >= 0,
        "soft_cap": case.soft_cap > 0,
        "sinks": case.sinks,
        "hybrid_pool": case.hybrid_swa_pool,
        "deterministic": case.deterministic,
    }
    return [f for f in CASE_FEATURES if used[f]]
