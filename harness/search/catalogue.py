"""The catalogue: small named batches, each the shape of one situation a serving engine meets.

A reader's first look at what a batch is, and the first thing every backend runs (cases/
test_catalogue.py) before the hypothesis search draws its own. Each entry is a plain Case: print
one with `entry.case.to_json()`, replay it with `python -m harness repro`. They stay small enough
for a CPU check and name no suite family or `swa` in their names, so `pytest -k decode` (or `-k swa`)
still selects exactly the searches.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.case import Case, Request
from harness.core.modes import Mode


@dataclass(frozen=True)
class Entry:
    """A named Case and the engine situation it models, in one line."""

    name: str
    models: str
    case: Case


def _entry(name: str, models: str, mode: Mode, requests: list[Request], **layer: object) -> Entry:
    return Entry(name, models, Case(mode=mode, requests=tuple(requests), **layer))


def _chain(n: int) -> tuple[int, ...]:
    """A verify chain of n drafts: each the child of the one before."""
    return tuple(range(-1, n - 1))


CATALOGUE: tuple[Entry, ...] = (
    _entry(
        "mixed_step",
        "a decode step over requests of mixed context lengths, one of them with an empty cache",
        Mode.DECODE,
        [Request(0, 1), Request(15, 1), Request(16, 1), Request(33, 1)],
    ),
    _entry(
        "long_context_step",
        "one request generating after 300 cached tokens in 64-token pages laid out in order",
        Mode.DECODE,
        [Request(300, 1)],
        page_size=64,
        page_layout="contiguous",
    ),
    _entry(
        "windowed_step",
        "a decode step on a sliding-window layer: only the last W + 1 keys of each request count",
        Mode.DECODE,
        [Request(40, 1), Request(5, 1)],
        window_left=8,
    ),
    _entry(
        "fresh_prompts",
        "the first forward of three new prompts: no cached tokens, one of them a single token",
        Mode.EXTEND,
        [Request(0, 1), Request(0, 17), Request(0, 40)],
    ),
    _entry(
        "cache_hit_chunk",
        "new tokens after a prefix-cache hit: each request reads its cached pages, then its own keys",
        Mode.EXTEND,
        [Request(33, 5), Request(16, 16)],
    ),
    _entry(
        "chunk_over_window",
        "the next chunk of a chunked prompt on a sliding-window layer: the window binds in cache and chunk",
        Mode.EXTEND,
        [Request(40, 30), Request(3, 20)],
        window_left=7,
    ),
    _entry(
        "window_past_context",
        "a sliding window longer than every context: the layer must behave as full attention",
        Mode.EXTEND,
        [Request(10, 6)],
        window_left=64,
    ),
    _entry(
        "drafts_over_page_edge",
        "a draft model's extend (DRAFT_EXTEND_V2, seq_lens bumped by the drafts) whose drafts cross a page",
        Mode.DRAFT_EXTEND_V2,
        [Request(30, 4), Request(14, 4)],
    ),
    _entry(
        "chain_candidates",
        "target verify of a chain of three drafts per request (speculative decoding with topk 1)",
        Mode.TARGET_VERIFY,
        [Request(20, 3, tree=_chain(3)), Request(7, 3, tree=_chain(3))],
    ),
    _entry(
        "tree_candidates",
        "target verify of a draft tree (topk > 1): siblings share a depth; a draft sees its ancestors only",
        Mode.TARGET_VERIFY,
        [Request(50, 5, tree=(-1, 0, 0, 1, 2))],
    ),
    _entry(
        "tree_in_window",
        "a draft tree on a sliding-window layer: the window counts a draft's depth, not its index",
        Mode.TARGET_VERIFY,
        [Request(30, 5, tree=(-1, 0, 0, 1, 1))],
        window_left=6,
    ),
    _entry(
        "hybrid_pool_window",
        "a hybrid pool: a windowed layer reads its own smaller pool through the full-to-window slot map",
        Mode.EXTEND,
        [Request(45, 6), Request(12, 3)],
        window_left=9,
        hybrid_swa_pool=True,
    ),
    _entry(
        "hybrid_pool_tree",
        "a draft tree on a hybrid pool: the verify's page table must be translated to the layer's pool",
        Mode.TARGET_VERIFY,
        [Request(50, 5, tree=(-1, 0, 0, 1, 2))],
        window_left=9,
        hybrid_swa_pool=True,
    ),
    _entry(
        "seq2seq_attention",
        "a seq2seq generator's queries over its input's keys (CROSS): keys cached ahead, none written",
        Mode.CROSS,
        [Request(0, 4, 9), Request(6, 1, 20)],
    ),
    _entry(
        "bidirectional_input",
        "an encoder-only model (ENCODER_ONLY): every token sees the whole input, before and after it",
        Mode.ENCODER_ONLY,
        [Request(0, 12), Request(0, 5)],
    ),
    _entry(
        "two_sided_window",
        "an encoder-only layer with a two-sided window: keys from p - 4 to p + 2",
        Mode.ENCODER_ONLY,
        [Request(0, 20)],
        window_left=4,
        window_right=2,
    ),
    _entry(
        "fp8_cache",
        "an FP8 (e4m3) KV cache with calibrated per-tensor scales, read after a cache hit",
        Mode.EXTEND,
        [Request(24, 4), Request(9, 1)],
        kv_dtype="float8_e4m3fn",
        k_scale=0.5,
        v_scale=0.0173,
    ),
    _entry(
        "soft_capped_logits",
        "a logit soft cap of 30 (Gemma 2) under large queries, so the cap binds",
        Mode.EXTEND,
        [Request(8, 6)],
        soft_cap=30.0,
        q_amplitude=8.0,
    ),
    _entry(
        "attention_sinks",
        "per-head sink logits (gpt-oss) on a sliding-window layer",
        Mode.EXTEND,
        [Request(20, 4)],
        sinks=True,
        window_left=8,
    ),
    _entry(
        "grouped_heads",
        "grouped-query attention: 16 query heads over 2 KV heads of 128",
        Mode.DECODE,
        [Request(17, 1), Request(2, 1)],
        num_q_heads=16,
        num_kv_heads=2,
        head_dim=128,
    ),
    _entry(
        "one_kv_head",
        "multi-query attention: every query head reads the one KV head",
        Mode.EXTEND,
        [Request(5, 7)],
        num_q_heads=4,
        num_kv_heads=1,
    ),
    _entry(
        "batch_invariant",
        "deterministic mode: a request's output may not depend on its neighbours in the batch",
        Mode.EXTEND,
        [Request(19, 3), Request(40, 1), Request(0, 9)],
        deterministic=True,
    ),
    _entry(
        "token_pages",
        "pages of one token (sglang's default page size), allocated out of order",
        Mode.EXTEND,
        [Request(6, 3), Request(2, 2)],
        page_size=1,
        page_layout="nonmonotonic",
    ),
    _entry(
        "head_major_pages",
        "a head-major (HND) page layout of 32-token pages, interleaved between requests",
        Mode.DECODE,
        [Request(40, 1), Request(31, 1)],
        page_size=32,
        kv_layout="HND",
        page_layout="interleaved",
    ),
    _entry(
        "half_precision_scaled",
        "a float16 model with its own softmax scale (not 1/sqrt(head_dim))",
        Mode.EXTEND,
        [Request(12, 4)],
        dtype="float16",
        sm_scale=0.3,
    ),
    _entry(
        "logits_below_every_sentinel",
        "every logit about -30000, below any finite mask sentinel, each row carried by one key",
        Mode.EXTEND,
        [Request(10, 6)],
        logits="dominant",
        logit_offset=-3e4,
    ),
    _entry(
        "tied_top_keys",
        "four keys tied at the top of every row that sees them, every logit past exp's float32 range",
        Mode.EXTEND,
        [Request(12, 5)],
        logits="ties",
        logit_offset=120.0,
    ),
)

BY_NAME: dict[str, Entry] = {e.name: e for e in CATALOGUE}


def entry(name: str) -> Entry:
    """A catalogue entry by name; a ValueError lists the names."""
    if name not in BY_NAME:
        raise ValueError(f"no catalogue entry {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]
