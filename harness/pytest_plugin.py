"""pytest plugin: records every checked case, prints the per-family summary, writes results.json.

Registered by the root conftest.py. `--harness-results PATH` writes the records; the summary table
is printed at the end of any run that checked cases. Examples hypothesis tried while shrinking a
failure are dropped except the final (minimal) one, so a failure counts once.
"""

from __future__ import annotations

import platform
import time

import pytest
import torch

from harness import profiles
from harness.results import CaseResult, summary_table, write_json
from harness.suite import Target

_RESULTS_KEY = pytest.StashKey[list]()
_ITEM_KEY = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-harness")
    group.addoption("--harness-results", default=None, help="write results.json here")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS_KEY] = []
    from harness import backends

    for line in (
        "swa: sliding-window cases",
        "prefix: EXTEND with a cached prefix",
        "prefill: EXTEND without a cached prefix",
        "decode: DECODE",
        "draft_extend_v2: DRAFT_EXTEND_V2",
        "verify: TARGET_VERIFY",
        "cross: cross-attention",
        "deterministic: determinism checks",
        "gpu: needs a CUDA device",
    ):
        config.addinivalue_line("markers", line)
    for name in backends.names():
        config.addinivalue_line("markers", f"{name}: the {name} backend")


@pytest.fixture
def record(request: pytest.FixtureRequest):  # noqa: ANN201 - a callable fixture
    """Append a CaseResult of the running test to the session's records."""
    items: list[CaseResult] = []
    request.node.stash[_ITEM_KEY] = items
    return items.append


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    items: list[CaseResult] = item.stash.get(_ITEM_KEY, [])
    kept = [r for r in items if r.status != "fail"]
    fails = [r for r in items if r.status == "fail"]
    if report.failed and fails:
        kept.append(fails[-1])
    out = item.config.stash[_RESULTS_KEY]
    for r in kept:
        d = r.to_dict()
        d["test_id"] = item.nodeid
        out.append(d)
    t = item.callspec.params.get("target") if hasattr(item, "callspec") else None
    if report.skipped and isinstance(t, Target) and not kept:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        out.append(
            {
                "status": "skip",
                "backend": t.backend_name,
                "device": t.device,
                "family": t.family,
                "mode": t.family,
                "features": ["window"] if t.window == "swa" else [],
                "case": None,
                "verdict": None,
                "reason": reason.removeprefix("Skipped: "),
                "seconds": 0.0,
                "test_id": item.nodeid,
                "repro": None,
            }
        )


def run_meta() -> dict:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "profile": profiles.current(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:  # noqa: ANN001
    results = config.stash.get(_RESULTS_KEY, [])
    if not results:
        return
    terminalreporter.write_sep("=", "attn-harness summary (examples per backend and family)")
    terminalreporter.write_line(summary_table(results))
    path = config.getoption("--harness-results")
    if path:
        write_json(path, results, run_meta())
        terminalreporter.write_line(f"results: {path}")


def session_results(config: pytest.Config) -> list[dict]:
    return config.stash.get(_RESULTS_KEY, [])
