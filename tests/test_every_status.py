"""Every status a record can have, in every view of a run: the terminal summary, results.json,
junit.xml and index.html. Each status gets a count of its own (pass 1, xfail 2, ... skip 8), so a
view that drops a status, counts it under another or counts one twice shows a wrong number."""

import xml.etree.ElementTree as ET

import pytest

from harness.core.results import CaseResult, summary_table
from harness.core.vocab import CHECKED, PROBLEMS, STATUSES
from harness.report import html, junit, results_json
from tests.helpers import case

COUNTS = {status: i for i, status in enumerate(STATUSES, 1)}
RUN = {
    "id": "every-status",
    "started": "2026-01-01T00:00:00+0000",
    "elapsed_s": 2.0,
    "profile": "ci",
    "command": "pytest cases",
    "exit_status": 1,
}
ENV = {"torch": "2.13.0", "gpu": "none"}


def records() -> list[dict]:
    c = case("EXTEND", ((30, 12),), window_left=7, head_dim=16)
    out = []
    for status, n in COUNTS.items():
        for i in range(n):
            res = CaseResult(
                status=status,
                backend="torch_native",
                device="cpu",
                case=c.replace(seed=i),
                reason=f"why {status} {i}",
                test_id=f"cases/test_extend.py::test_prefix[{status}]",
            )
            out.append(res.to_dict())
    return out


@pytest.fixture(scope="module")
def document() -> dict:
    """The document as read back from its JSON, as every view is rendered."""
    return results_json.loads(results_json.dumps(results_json.build(records(), RUN, ENV)))


def test_results_json_keeps_every_status(document):
    seen = [r["status"] for r in document["results"]]
    assert {s: seen.count(s) for s in STATUSES} == COUNTS


def test_the_terminal_summary_counts_every_status(document):
    lines = summary_table(document["results"]).splitlines()
    head = lines[0].split()
    row = dict(zip(head, next(line for line in lines if line.startswith("torch_native")).split()))
    for status, n in COUNTS.items():
        assert row[status] == str(n), (status, lines)
    assert row["checked"] == str(sum(COUNTS[s] for s in CHECKED))


def test_junit_counts_every_status(document):
    root = ET.fromstring(junit.render(document))
    assert root.get("tests") == str(sum(COUNTS.values()))
    assert root.get("failures") == str(COUNTS["fail"])
    assert root.get("errors") == str(COUNTS["error"] + COUNTS["crash"] + COUNTS["hang"])
    assert root.get("skipped") == str(COUNTS["skip"] + COUNTS["refused"] + COUNTS["xfail"])
    cases = root.iter("testcase")
    by_kind: dict[str, int] = {}
    for tc in cases:
        child = next(iter(tc), None)
        kind = "pass" if child is None else child.get("type") or child.tag
        by_kind[kind] = by_kind.get(kind, 0) + 1
    for status in PROBLEMS:  # each problem is a <failure> or <error> whose type names its status
        assert by_kind[status] == COUNTS[status], (status, by_kind)
    assert by_kind["xfail"] == COUNTS["xfail"]
    assert by_kind["skipped"] == COUNTS["skip"] + COUNTS["refused"]
    assert by_kind["pass"] == COUNTS["pass"]


def test_index_html_counts_every_status(document):
    page = html.render(document)
    for status, n in COUNTS.items():
        assert f'class="n-{status}">{n} {status}</' in page, status
