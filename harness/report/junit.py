"""junit.xml for CI dashboards, from results.json: one testcase per checked case or skipped test.

Test suites are (backend@device, family); a failure carries the verdict as its message and the
Case JSON with its repro command as its text; crashes, hangs and harness errors are errors (a harness
error with its traceback); skips and refused cases are skipped, with their reason. A model-level
record is named by its model.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from harness.core.vocab import PROBLEMS
from harness.report.matrix import totals


def _errors(counts: dict[str, int]) -> int:
    return counts["error"] + counts["crash"] + counts["hang"]


def _safe(name: str) -> str:
    """Dots and colons (module:factory specs) would read as a package path in CI dashboards."""
    return re.sub(r"[^A-Za-z0-9_@~-]+", "_", name)


def _missing_shares(root: ET.Element, run: dict) -> None:
    """A merged check missing shares (harness/report/merge.py) fails on dashboards too: an error per
    missing share, in a suite of its own."""
    missing = run.get("incomplete") or []
    if not missing:
        return
    count = run.get("shard", {}).get("count", "?")
    suite = ET.SubElement(root, "testsuite", name="attn-harness.merge", tests=str(len(missing)),
                          failures="0", errors=str(len(missing)), skipped="0", time="0.000")
    for index in missing:
        case = ET.SubElement(suite, "testcase", classname="attn_harness.merge", name=f"share {index}/{count}")
        ET.SubElement(case, "error", type="missing", message=f"share {index}/{count} is missing")
    root.set("errors", str(int(root.get("errors", "0")) + len(missing)))
    root.set("tests", str(int(root.get("tests", "0")) + len(missing)))


def render(data: dict) -> str:
    results = data["results"]
    tot = totals(results)
    root = ET.Element(
        "testsuites",
        name="attn-harness",
        tests=str(len(results)),
        failures=str(tot["fail"]),
        errors=str(_errors(tot)),
        skipped=str(tot["skip"] + tot["refused"] + tot["xfail"]),
        time=f"{float(data['run'].get('elapsed_s') or 0.0):.3f}",
    )
    suites: dict[tuple[str, str, str], list[dict]] = {}
    for rec in results:
        suites.setdefault((rec["backend"], rec["device"], rec["family"]), []).append(rec)
    for (backend, device, family), recs in suites.items():
        t = totals(recs)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"{_safe(backend)}@{device}.{family}",
            tests=str(len(recs)),
            failures=str(t["fail"]),
            errors=str(_errors(t)),
            skipped=str(t["skip"] + t["refused"] + t["xfail"]),
            time=f"{sum(float(r.get('seconds') or 0.0) for r in recs):.3f}",
        )
        for i, rec in enumerate(recs):
            _testcase(suite, rec, i)
    _missing_shares(root, data["run"])
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _testcase(suite: ET.Element, rec: dict, i: int) -> None:
    """One record as a testcase: skipped (a skip, a refusal, an expected failure), a failure or an
    error with the case, its repro command, the mask probe and any traceback, or a plain pass."""
    backend, device, family = rec["backend"], rec["device"], rec["family"]
    feats = ",".join(rec.get("features") or []) or "none"
    model = (rec.get("extra") or {}).get("model")
    case = ET.SubElement(
        suite,
        "testcase",
        classname=f"attn_harness.{_safe(backend)}.{device}",
        name=f"{family}[{model or feats}] #{i}",
        time=f"{float(rec.get('seconds') or 0.0):.3f}",
    )
    reason = rec.get("reason") or ""
    if rec["status"] == "skip":
        ET.SubElement(case, "skipped", message=reason)
    elif rec["status"] == "refused":
        ET.SubElement(case, "skipped", message=f"refused by the backend: {reason}")
    elif rec["status"] == "xfail":
        ET.SubElement(case, "skipped", type="xfail", message=f"expected failure: {reason}")
    elif rec["status"] in PROBLEMS:
        tag = "failure" if rec["status"] == "fail" else "error"
        detail = ET.SubElement(case, tag, message=reason, type=rec["status"])
        detail.text = "\n".join(_failure_body(rec, reason))


def _failure_body(rec: dict, reason: str) -> list[str]:
    body = [reason]
    if rec.get("case") is not None:
        body.append("Case:\n" + json.dumps(rec["case"], indent=1))
    if rec.get("repro"):
        body.append("Replay:\n  " + rec["repro"])
    probe = rec.get("probe") or {}
    if probe.get("lines"):
        body.append("Mask probe:\n  " + "\n  ".join(probe["lines"]))
    traceback = (rec.get("extra") or {}).get("traceback")
    if traceback:
        body.append("Traceback:\n" + traceback)
    return body
