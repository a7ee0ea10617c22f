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
