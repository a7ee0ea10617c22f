"""The fingerprint of the cases a run drew: whether two runs checked the same set.

A PR run draws a fixed set for a given source and release (a derandomized profile); a nightly run
explores new draws. The fingerprint is a hash over every recorded case (or GraphCase) with the
test that drew it, so two runs that drew the same set carry the same fingerprint, and the report's
comparison with the last run (harness/report/trend.py) says when they did not.
"""

from __future__ import annotations

import hashlib
import json

from harness.core.results import GRAPH_CHECK


def drawn(rec: dict) -> str | None:
    """One record's line: its test, backend and device, and what it checked (None: no case)."""
    extra = rec.get("extra") or {}
    target = extra.get("graph_case") if extra.get("check") == GRAPH_CHECK else rec.get("case")
    if not target:
        return None
    test = rec.get("test_id") or rec.get("family", "")
    return f"{rec.get('backend')}@{rec.get('device')} {test} {json.dumps(target, sort_keys=True)}"


def fingerprint(results: list[dict]) -> dict:
    """{"fingerprint": 16 hex digits over the sorted, distinct drawn lines, "cases": how many}."""
    lines = sorted({line for rec in results if (line := drawn(rec)) is not None})
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return {"fingerprint": digest, "cases": len(lines)}


def same_set(tonight: dict, last: dict) -> str:
    """One clause on whether two runs (their `run` objects) drew the same set of cases."""
    a, b = tonight.get("draws") or {}, last.get("draws") or {}
    if not a or not b:
        return "the draws cannot be compared (a run without a draws fingerprint)"
    if a.get("fingerprint") == b.get("fingerprint"):
        return f"the same {a.get('cases')} cases drawn (fingerprint {a.get('fingerprint')})"
    return (
        f"another set of cases drawn: {a.get('cases')} (fingerprint {a.get('fingerprint')}) against "
        f"{b.get('cases')} ({b.get('fingerprint')})"
    )
