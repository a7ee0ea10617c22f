"""Library bugs the harness found, each kept as a check expected to fail on the versions it names.

A known issue names the library (its distribution), the exact versions it was reproduced on, the
backends whose glue reaches the bug, the cases that reach it, and a standalone repro script under
known_issues/ (docs/known-issues.md). A failing case that matches becomes `xfail` on those versions
only: on any other version the same check is an ordinary pass or fail, so a release that fixes the
bug (or one that still has it) shows up. A matching case that passes stays a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from harness.core.case import Case
from harness.core.modes import Mode


@dataclass(frozen=True)
class KnownIssue:
    id: str
    library: str  # the distribution whose version decides, e.g. flashinfer-python
    versions: frozenset[str]
    backends: frozenset[str]
    title: str
    repro: str  # the standalone script (torch + the library only)
    reaches: Callable[[Case], bool]
    # Where the glue avoids the bug, if it does: then no backend reaches it (`backends` is empty), so
    # no suite failure is excused by it, and a GPU test runs the library itself to keep it in view.
    worked_around: str = ""


KNOWN_ISSUES = (
    KnownIssue(
        "flashinfer-noncausal-window",
        "flashinfer-python",
        frozenset({"0.7.2.post1", "0.6.18.post1"}),
        frozenset({"flashinfer_ragged", "flashinfer_paged"}),
        "fa2 prefill with causal=False and window_left >= 0 is wrong once a request has more than 256 keys",
        "known_issues/flashinfer_noncausal_window.py",
        lambda c: c.mode == Mode.ENCODER_ONLY
        and c.window_left >= 0
        and any(r.extend_len > 256 for r in c.requests),
    ),
    KnownIssue(
        "flashinfer-sink-module-name",
        "flashinfer-python",
        frozenset({"0.7.2.post1", "0.6.18.post1"}),
        frozenset(),
        "the AttentionSink JIT module is named without the KV cache dtype or head dims: a process (or a "
        "JIT directory) that built one sink variant runs it for another, reading the cache as the wrong "
        "dtype",
        "known_issues/flashinfer_sink_module_name.py",
        lambda c: c.sinks,
        worked_around="flashinfer_paged names each sink variant's module "
        "(flashinfer_glue.sink_wrapper_class); tests/test_flashinfer_gpu.py runs FlashInfer's own wrapper",
    ),
)


@cache
def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def known_issue(backend_name: str, case: Case) -> tuple[KnownIssue, str] | None:
    """The known issue (and the installed version) this backend's failure on `case` is, if any."""
    for issue in KNOWN_ISSUES:
        if backend_name in issue.backends and issue.reaches(case):
            version = installed_version(issue.library)
            if version in issue.versions:
                return issue, version
    return None


def expected_failure(backend_name: str, case: Case, reason: str) -> str | None:
    """The xfail reason for a failing case that is a known issue on the installed version, else None."""
    found = known_issue(backend_name, case)
    if found is None:
        return None
    issue, version = found
    return f"known issue {issue.id} ({issue.library} {version}, {issue.repro}): {issue.title}; {reason}"
