"""Join the results of a check split across CI runners (`check --shard I/N`) into one document.

Each share's results.json carries `run.shard`: its index and count and the key of what was split
(the selection, the profile and the source). The merge refuses, in one line, shares that do not
belong together (a different key or count) or a share given twice; a missing share is not an
error but the merged report is headed INCOMPLETE and its exit status is non-zero. The environment
of every share (GPU kind, library releases) is kept in `run.shares`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.report import results_json

# What each share's `run.shard` must hold; `key` names the selection, profile and source.
SHARD_FIELDS = ("index", "count", "key")
INCOMPLETE_STATUS = 3  # a merge missing shares: not a pass, whatever the present shares say
NO_TESTS = 5  # pytest's exit status when it collected nothing


class MergeError(ValueError):
    """Shares that cannot be merged; the message is one line naming the problem."""


@dataclass(frozen=True, kw_only=True)
class Share:
    """One runner's results: where it was read from, and its place in the split."""

    path: str
    index: int
    count: int
    key: str
    data: dict


def read_share(path: str | Path) -> Share:
    """Load one share's results.json; a file without `run.shard` is not a share."""
    try:
        data = results_json.load(path)
    except results_json.ResultsError as e:
        raise MergeError(f"{path}: {e}") from None
    shard = data["run"].get("shard")
    if not isinstance(shard, dict) or any(f not in shard for f in SHARD_FIELDS):
        raise MergeError(f"{path}: not a share of a split check (its run has no shard {list(SHARD_FIELDS)})")
    index, count = shard["index"], shard["count"]
    if not (isinstance(index, int) and isinstance(count, int) and 1 <= index <= count):
        raise MergeError(f"{path}: run.shard index {index!r} of {count!r} is not 1 <= I <= N")
    return Share(path=str(path), index=index, count=count, key=str(shard["key"]), data=data)


def check_set(shares: list[Share]) -> list[int]:
    """Refuse shares that do not belong together or repeat; return the missing indices (1-based)."""
    if not shares:
        raise MergeError("no shares to merge")
    first = shares[0]
    for share in shares[1:]:
        if share.key != first.key:
            raise MergeError(
                f"{share.path} is a share of another check than {first.path} "
                f"(selection, profile or source differ: {share.key} vs {first.key})"
            )
        if share.count != first.count:
            raise MergeError(
                f"{share.path} splits into {share.count} shares, {first.path} into {first.count}"
            )
    seen: dict[int, str] = {}
    for share in shares:
        if share.index in seen:
            raise MergeError(
                f"share {share.index}/{share.count} given twice: {seen[share.index]} and {share.path}"
            )
        seen[share.index] = share.path
    return [i for i in range(1, first.count + 1) if i not in seen]


def merge(shares: list[Share], command: str) -> dict:
    """One results document over all shares, in share order; `run.incomplete` lists missing ones."""
    missing = check_set(shares)
    ordered = sorted(shares, key=lambda s: s.index)
    runs = [s.data["run"] for s in ordered]
    codes = [_status(s) for s in ordered]
    worst = max(codes) if any(codes) else 0
    run = {
        "id": "merged-" + "-".join(str(r.get("id", "?")) for r in runs[:1]),
        "started": min(str(r.get("started", "")) for r in runs),
        "elapsed_s": max(float(r.get("elapsed_s") or 0.0) for r in runs),
        "profile": runs[0].get("profile"),
        "command": command,
        "exit_status": INCOMPLETE_STATUS if missing and not worst else worst,
        "shard": {"count": ordered[0].count, "key": ordered[0].key},
        "incomplete": missing,
        "shares": [_share_summary(s) for s in ordered],
    }
    results = [rec for s in ordered for rec in s.data["results"]]
    return results_json.build(results, run, _environment(ordered))


def _status(share: Share) -> int:
    """A share's exit status; pytest's "no tests collected" (5) of a share with no records is the
    share that had nothing to check, which is not a failure."""
    code = int(share.data["run"].get("exit_status", 1))
    return 0 if code == NO_TESTS and not share.data["results"] else code


def _share_summary(share: Share) -> dict:
    run = share.data["run"]
    return {
        "index": share.index,
        "path": share.path,
        "id": run.get("id"),
        "exit_status": run.get("exit_status"),
        "elapsed_s": run.get("elapsed_s"),
        "records": len(share.data["results"]),
        "environment": share.data["environment"],
    }


def _environment(shares: list[Share]) -> dict[str, str]:
    """Labels every share agrees on keep their value; a label that differs lists each share's."""
    labels = {label for s in shares for label in s.data["environment"]}
    merged = {}
    for label in sorted(labels):
        values = [str(s.data["environment"].get(label, "absent")) for s in shares]
        if len(set(values)) == 1:
            merged[label] = values[0]
        else:
            merged[label] = "; ".join(f"share {s.index}: {v}" for s, v in zip(shares, values))
    return merged


def write(paths: list[str], out: str | Path, previous: str | None, command: str) -> tuple[Path, int]:
    """Merge the shares at `paths` into `out` (results.json, index.html, junit.xml), with tonight's
    verdicts against `previous` where given; returns (the page, the merged exit status)."""
    from harness.report import trend, write_run

    doc = merge([read_share(p) for p in paths], command)
    if previous:
        try:
            last = results_json.load(previous)
        except (OSError, results_json.ResultsError) as e:
            raise MergeError(f"--previous {previous}: {e}") from None
        doc["run"]["trend"] = trend.compare(doc, last).to_dict()
    try:
        return write_run(out, doc), doc["run"]["exit_status"]
    except OSError as e:
        raise MergeError(f"cannot write the merged report to {out}: {e}") from None
