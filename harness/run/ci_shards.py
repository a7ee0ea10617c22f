"""`check --shard I/N`: deal the selected tests into N shares, one per CI runner.

The deal reads only what all runners share (the collected ids, the costs in harness/run/speed/costs.py
or `--costs FILE`, N), never a local timing cache, so runners agree. A digest of profile and ids
keys each share's results, so the merge refuses shares of different checks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from harness.run.speed.costs import DEFAULT_SECONDS, UNKNOWN_SECONDS

ENV = "ATTN_HARNESS_SHARD"


class ShareError(ValueError):
    """A bad share or cost table; one line naming it."""


def parse(text: str) -> tuple[int, int]:
    """`I/N` (1-based, as CI matrices count) as (I, N)."""
    expected = f"--shard {text!r}: expected I/N with integers 1 <= I <= N, e.g. 1/4"
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShareError(expected) from None
    if count < 1 or not 1 <= index <= count:
        raise ShareError(expected)
    return index, count


def load_costs(path: str | Path) -> dict[str, float]:
    """A results.json (its `run.test_s`) or a JSON object of test id or backend -> seconds."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ShareError(f"--costs {path}: cannot read a JSON cost table ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("run"), dict):
        data = data["run"].get("test_s", {})
    if not isinstance(data, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in data.values()
    ):
        raise ShareError(f"--costs {path}: expected an object of test id or backend -> seconds >= 0")
    return {str(k): float(v) for k, v in data.items()}


def item_costs(
    tests: list[tuple[str, str | None]], table: dict[str, float] | None = None
) -> dict[str, float]:
    """Seconds per test: its entry, else its backend's (the table's, else the shipped default) split
    over that backend's tests, else 1 s."""
    table = table or {}
    per_backend: dict[str, int] = {}
    for _, backend in tests:
        if backend:
            per_backend[backend] = per_backend.get(backend, 0) + 1
    costs = {}
    for test_id, backend in tests:
        if test_id in table:
            costs[test_id] = table[test_id]
        elif backend:
            whole = table.get(backend, DEFAULT_SECONDS.get(backend, UNKNOWN_SECONDS))
            costs[test_id] = whole / per_backend[backend]
        else:
            costs[test_id] = 1.0
    return costs


def deal(costs: dict[str, float], count: int) -> dict[str, int]:
    """Test id -> share (1..count): costliest first, each to the least loaded (ties: lower share, id)."""
    loads = [0.0] * count
    dealt = {}
    for test_id in sorted(costs, key=lambda t: (-costs[t], t)):
        share = min(range(count), key=lambda s: (loads[s], s))
        loads[share] += costs[test_id]
        dealt[test_id] = share + 1
    return dealt


def key(test_ids: Iterable[str], profile: str) -> str:
    digest = hashlib.sha256(profile.encode())
    for test_id in sorted(test_ids):
        digest.update(b"\0" + test_id.encode())
    return digest.hexdigest()[:16]


def write_collected(path: str | Path, tests: list[tuple[str, str | None]]) -> None:
    Path(path).write_text(json.dumps([list(t) for t in tests]))


def read_collected(path: str | Path) -> list[tuple[str, str | None]]:
    return [(str(t), b) for t, b in json.loads(Path(path).read_text())]


def write_share(path: str | Path, index: int, count: int, split_key: str, tests: list[str]) -> None:
    Path(path).write_text(json.dumps({"index": index, "count": count, "key": split_key, "tests": tests}))


def read_share(path: str | Path) -> tuple[dict, frozenset[str]]:
    """(the `run.shard` object, the test ids) of a `write_share` file."""
    data = json.loads(Path(path).read_text())
    return {k: data[k] for k in ("index", "count", "key")}, frozenset(data["tests"])
