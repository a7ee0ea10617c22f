"""Cases pinned as hypothesis examples: every bug ever found, and the shapes each bug class needs.

Each entry is a Case as JSON (a dict), keyed by suite family. Add the shrunk Case of every new
failure here, with a comment saying what it caught.
"""

PINNED: dict[str, list[dict]] = {
    "prefix": [
        # SWA extend-with-prefix: the window binds inside the prefix and inside the extend.
        {
            "mode": "EXTEND",
            "requests": [{"prefix_len": 40, "extend_len": 30}, {"prefix_len": 3, "extend_len": 20}],
            "window_left": 7,
            "page_size": 16,
        },
    ],
    "draft_extend_v2": [
        # DRAFT_EXTEND_V2 cache extent: the drafts must be read from the cache (seq_lens bumped).
        {
            "mode": "DRAFT_EXTEND_V2",
            "requests": [{"prefix_len": 33, "extend_len": 4}, {"prefix_len": 16, "extend_len": 4}],
            "page_size": 16,
        },
    ],
    "verify": [
        # Hybrid SWA pool in tree verify (topk > 1): the page table must be translated.
        {
            "mode": "TARGET_VERIFY",
            "requests": [{"prefix_len": 50, "extend_len": 5, "tree": [-1, 0, 0, 1, 2]}],
            "window_left": 9,
            "hybrid_swa_pool": True,
            "page_size": 16,
        },
    ],
}


# GraphCases pinned in the replay search, keyed by graph family (harness/run/graph_suite.py).
# The layer every pinned graph shares: 8 q and 8 kv heads of 128, deterministic mode.
_LAYER = {"num_kv_heads": 8, "head_dim": 128, "deterministic": True}
_VERIFY_ROWS = {"extend_len": 3, "tree": [-1, 0, 1]}

PINNED_GRAPHS: dict[str, list[dict]] = {
    "decode": [
        # Deterministic split-KV chunk (2048 keys): captured at 2049 keys (split), replayed at one key
        # (unsplit); FlashInfer keeps the capture's split bookkeeping (known issue
        # flashinfer-graph-unsplit-plan): err 3.14 on 0.6.18.post1, an illegal memory access on 0.7.2.post1.
        {
            "max_batch": 2,
            "max_kv": 2049,
            "batches": [
                {"mode": "DECODE", "requests": [{"prefix_len": 0, "extend_len": 1}] * 2, **_LAYER},
                {"mode": "DECODE", "requests": [{"prefix_len": 1984, "extend_len": 1}], **_LAYER},
            ],
        },
    ],
    "verify": [
        # The same with three verify rows per request, 3 requests padded to 4: NaN on 0.6.18.post1, a fault
        # on 0.7.2.post1.
        {
            "max_batch": 3,
            "max_kv": 2049,
            "batches": [
                {"mode": "TARGET_VERIFY", "requests": [{"prefix_len": 0, **_VERIFY_ROWS}] * 3, **_LAYER},
                {"mode": "TARGET_VERIFY", "requests": [{"prefix_len": 2046, **_VERIFY_ROWS}], **_LAYER},
            ],
        },
    ],
}
