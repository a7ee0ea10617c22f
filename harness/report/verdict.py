"""The word a run's report leads with, in one place: the page's heading and `check`'s exit status
read it, so a run the page calls anything but PASSED never exits 0.

FAILED: a failure, harness error, crash or hang. NOTHING CHECKED: no case passed and none failed
(every test skipped: no GPU here, a plugin's library not installed). INTERRUPTED: stopped before
its end (Ctrl-C, a time limit's SIGINT), whatever it found so far; INCOMPLETE: a merged check with
shares missing. PASSED otherwise.
"""

from __future__ import annotations

from collections import Counter

from harness.core.vocab import PROBLEMS
from harness.report import matrix


def verdict(data: dict) -> str:
    """The heading's word for a results document (results.json as loaded)."""
    tot = matrix.totals(data["results"])
    found = "FAILED" if any(tot[s] for s in PROBLEMS) else "NOTHING CHECKED" if not tot["pass"] else "PASSED"
    run = data["run"]
    if run.get("interrupted"):
        return f"INTERRUPTED ({found.lower()} so far)"
    if run.get("incomplete"):
        return f"INCOMPLETE ({found.lower()} so far)"
    return found


def unchecked(data: dict) -> list[str]:
    """What an interrupted run did not check, a line each (run.interrupted's `not_run`)."""
    return list((data["run"].get("interrupted") or {}).get("not_run", []))


def nothing_checked(data: dict) -> str:
    """Why a run that checked nothing checked nothing, in one line: the most frequent skip reason."""
    reasons = Counter(r.get("reason") or "(no reason given)" for r in data["results"])
    if not reasons:
        return "no case was checked: no test recorded a result"
    why, n = reasons.most_common(1)[0]
    return f"no case was checked: {len(data['results'])} records skipped or refused; most often ({n}): {why}"
