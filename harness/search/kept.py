"""A pins file: the failing cases a search found, kept so that every later run checks them first.

A nightly run (the thorough profile, not derandomized) explores new draws; a case it fails on would
be gone the next night. `check --keep-failures FILE` adds every failing case of its results to FILE
(`add_failures`), and `check --pins FILE` (the PR run, derandomized) replays FILE's cases first, as
explicit examples beside harness/search/pinned.py's, so a failure found once is checked on every
later run until it is fixed and the file pruned (docs/ci.md). The suite reads the file named by
PINS_ENV when it builds a search's examples (`cases`, `graphs`).

The file is JSON: {"format": FORMAT, "cases": {family: [Case, ...]}, "graphs": {graph family:
[GraphCase, ...]}}, each list in the order the failures were found, without repeats.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness.core.case import Case, CaseError
from harness.core.graph_case import GraphCase
from harness.core.modes import family_of
from harness.core.results import GRAPH_CHECK

FORMAT = "attn-harness-pins"
PINS_ENV = "ATTN_HARNESS_PINS"
FAILING = ("fail", "error", "crash", "hang")


class PinsError(ValueError):
    """A pins file that cannot be read; the message is one line naming the file and the problem."""


def empty() -> dict:
    return {"format": FORMAT, "cases": {}, "graphs": {}}


def read(path: str | Path) -> dict:
    """The pins file at `path` (an empty one where it does not exist yet), checked."""
    p = Path(path)
    if not p.exists():
        return empty()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise PinsError(f"pins file {p}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PinsError(f"pins file {p}: not an attn-harness pins file (format must be {FORMAT!r})")
    for key, parse in (("cases", Case.from_dict), ("graphs", GraphCase.from_dict)):
        groups = data.get(key, {})
        if not isinstance(groups, dict) or not all(isinstance(v, list) for v in groups.values()):
            raise PinsError(f"pins file {p}: {key!r} must map a family to a list")
        for family, items in groups.items():
            for i, item in enumerate(items):
                try:
                    parse(item)
                except (CaseError, TypeError) as e:
                    raise PinsError(f"pins file {p}: {key}[{family!r}][{i}]: {e}") from None
    return {"format": FORMAT, "cases": data.get("cases", {}), "graphs": data.get("graphs", {})}


def failures(results: dict) -> dict:
    """The failing cases of a results document, as a pins document: a replay record's whole GraphCase
    (by its mode's family), any other record's Case (by its family)."""
    out = empty()
    for rec in results["results"]:
        if rec.get("status") not in FAILING or not rec.get("case"):
            continue
        extra = rec.get("extra") or {}
        if extra.get("check") == GRAPH_CHECK and extra.get("graph_case"):
            g = GraphCase.from_dict(extra["graph_case"])
            _add(out["graphs"], family_of(g.mode, [0]), g.to_dict())
        else:
            _add(out["cases"], rec["family"], Case.from_dict(rec["case"]).to_dict())
    return out


def _add(groups: dict, family: str, item: dict) -> bool:
    """Append `item` to its family's list unless it is there already; whether it was added."""
    items = groups.setdefault(family, [])
    if item in items:
        return False
    items.append(item)
    return True


def add_failures(results: dict, path: str | Path) -> int:
    """Add the failing cases of `results` to the pins file at `path` (created if missing); returns
    how many were new."""
    data = read(path)
    found = failures(results)
    added = sum(_add(data[key], fam, item) for key in ("cases", "graphs") for fam, items in found[key].items()
                for item in items)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return added


def read_results(path: str | Path) -> dict:
    """A results.json as far as `failures` reads it: an object with a list of records."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PinsError(f"results file {path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise PinsError(f"results file {path}: not an attn-harness results file (no list of results)")
    return data


def _active() -> dict:
    path = os.environ.get(PINS_ENV)
    return read(path) if path else empty()


def cases(family: str) -> list[Case]:
    """The kept Cases of a suite family, from the pins file PINS_ENV names (none without one)."""
    return [Case.from_dict(d) for d in _active()["cases"].get(family, [])]


def graphs(graph_family: str) -> list[GraphCase]:
    """The kept GraphCases of a graph family, from the pins file PINS_ENV names."""
    return [GraphCase.from_dict(d) for d in _active()["graphs"].get(graph_family, [])]


def main(argv: list[str]) -> int:
    """`python -m harness.search.kept PINS RESULTS...`: add the failing cases of each results.json (a
    merged nightly's) to the pins file PINS; exits 2 with one line on a bad file."""
    if len(argv) < 2:
        print("usage: python -m harness.search.kept PINS RESULTS [RESULTS ...]", file=sys.stderr)
        return 2
    try:
        for path in argv[1:]:
            added = add_failures(read_results(path), argv[0])
            print(f"{path}: {added} new failing case(s) kept in {argv[0]}")
    except PinsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
