"""The harness's shared vocabularies: dtype names, result statuses, case features.

Each is spelled once here and imported wherever it is listed, checked or reported, so that a new
dtype, status or feature cannot be known to one part of the harness and missing from another.
(references/ keeps its own dtype map: the references import nothing of harness/.)
"""

from __future__ import annotations

import torch

# A Case's dtype names and the torch dtypes they stand for.
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPES = tuple(TORCH_DTYPES)
DTYPE_NAMES = {dt: name for name, dt in TORCH_DTYPES.items()}
# A Case's FP8 KV-cache dtypes (`kv_dtype`; none means the cache holds the case dtype).
TORCH_KV_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
KV_DTYPES = tuple(TORCH_KV_DTYPES)

# What a checked case (or a skipped test) came to, in the order reports count them. `error`: the
# harness itself raised (not the backend: that is a crash), `refused`: a drawn case the backend's
# supports() turned down inside a property test, `skip`: a whole test that could not run here,
# `xfail`: a failure that is a known library bug on the installed version (checks/known_issues.py).
STATUSES = ("pass", "xfail", "fail", "error", "crash", "hang", "refused", "skip")
CHECKED = ("pass", "xfail", "fail", "crash", "hang")  # the statuses of a case the backend ran
PROBLEMS = ("fail", "error", "crash", "hang")  # the statuses that fail a run

# The optional features a Case may use, in report column order, and the words a skip reason uses.
FEATURE_WORDS = {
    "window": "a sliding window",
    "window_right": "a two-sided window (window_right)",
    "soft_cap": "a logit soft cap",
    "sinks": "attention sinks",
    "hybrid_pool": "the hybrid SWA pool",
    "deterministic": "a deterministic mode",
}
CASE_FEATURES = tuple(FEATURE_WORDS)
# The features a backend declares (Capabilities' flags): the case features, then what it offers
# besides. `whole_page_loads` is a property of the kernel, not a feature.
FEATURES = (*CASE_FEATURES, "returns_lse", "tree")


# What one side of a Capabilities `exclusive` pair may name: a case feature, a mode, `tree` (a verify
# tree with topk > 1) or `cross_prefill` (a CROSS batch in which some request has more than one query).
SHAPE_TRAITS = ("tree", "cross_prefill")
