"""The report writers: results.json schema, the summary matrix, index.html, junit.xml, pictures.

Every status a record can have shows in every view of a run: the terminal summary, results.json,
junit.xml and index.html. Each status gets a count of its own (pass 1, xfail 2, ... skip 8), so a
view that drops a status, counts it under another or counts one twice shows a wrong number."""

import json
import math
import xml.etree.ElementTree as ET

import pytest

from harness.core.results import CaseResult, summary_table
from harness.core.vocab import CHECKED, PROBLEMS, STATUSES
from harness.report import (
    environment,
    html,
    junit,
    matrix,
    pictures,
    render_views,
    results_json,
    write_run,
)
from harness.report.progress import Progress
from tests.helpers import case
from tests.report_helpers import sample_document, sample_document_text
from tests.test_report_browser import decode


def by_status(doc, status):
    return [r for r in doc["results"] if r["status"] == status]


def test_results_json_is_strict_json_and_round_trips_non_finite_numbers():
    text = sample_document_text()

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    raw = json.loads(text, parse_constant=refuse)
    assert raw["format"] == "attn-harness-results" and raw["version"] == 1
    nan_fail = [r for r in raw["results"] if r["backend"].endswith("_SwaUntranslated")][0]
    assert nan_fail["verdict"]["err"] == "NaN" and nan_fail["verdict"]["ratio"] == "Infinity"
    doc = results_json.loads(text)
    v = [r for r in doc["results"] if r["backend"].endswith("_SwaUntranslated")][0]["verdict"]
    assert math.isnan(v["err"]) and v["ratio"] == math.inf
    assert results_json.dumps(doc) == text


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d.update(format="other"), "not an attn-harness results file"),
        (lambda d: d.update(version=99), "schema version 99 is not supported"),
        (lambda d: d.update(results={}), "field 'results' must be a JSON list"),
        (lambda d: d["results"][0].pop("status"), "results[0] lacks field(s): status"),
        (lambda d: d["results"][1].update(status="meh"), "results[1].status='meh' is not one of"),
    ],
)
def test_results_json_rejects_documents_off_the_schema(mutate, needle):
    doc = sample_document()
    mutate(doc)
    with pytest.raises(results_json.ResultsError) as e:
        results_json.loads(results_json.dumps(doc))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_matrix_counts_each_case_under_all_its_features_and_colours_cells():
    rows = matrix.build(sample_document()["results"])
    native = rows[("torch_native", "cpu", "prefix")]
    assert native["all"].counts["pass"] == 1 and native["window"].counts["pass"] == 1
    assert (
        native["none"].counts == dict.fromkeys(native["none"].counts, 0) and native["none"].state == "empty"
    )
    assert native["window"].state == "ok" and native["window"].worst < 1
    ignored = rows[("harness.mutants.torch_native:_WindowIgnored", "cpu", "prefix")]
    assert ignored["window"].state == "bad" and ignored["window"].worst > 1
    untranslated = rows[("harness.mutants.torch_native:_SwaUntranslated", "cpu", "prefix")]
    assert untranslated["hybrid_pool"].counts["fail"] == 1 and untranslated["hybrid_pool"].worst == math.inf
    cuda = rows[("torch_native", "cuda", "prefix")]
    assert cuda["all"].counts["crash"] == 1 and cuda["all"].state == "bad"
    assert rows[("torch_native", "cuda", "verify")]["none"].state == "skipped"
    families = [k[2] for k in rows if k[:2] == ("torch_native", "cuda")]
    assert families == ["prefix", "verify"]  # the suite's family order


def test_a_passing_cell_close_to_its_budget_is_marked():
    cell = matrix.Cell()
    cell.add({"status": "pass", "verdict": {"ratio": 0.8}})
    assert cell.state == "close"
    cell.add({"status": "skip", "verdict": None})
    assert cell.state == "close" and cell.counts["skip"] == 1


def test_html_has_the_matrix_failures_skips_and_environment():
    page = html.render(sample_document())
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    for anchor in (
        'id="summary-matrix"',
        'id="failure-1"',
        'id="failure-2"',
        'id="failure-3"',
        'id="skip-table"',
    ):
        assert anchor in page
    assert 'id="failure-4"' not in page
    assert page.count('class="cell bad"') >= 3
    assert "attn-harness report: FAILED" in page
    # The window failure: its probe lines, its probe picture and heatmap, its repro command.
    assert "attended keys 0..22, outside its window [23, 30]" in page
    assert page.count('class="picture probe"') >= 2 and page.count('class="picture heatmap"') == 2
    assert "--backend harness.mutants.torch_native:_WindowIgnored --device cpu" in page
    assert "request 0, token" in page and "fraction of elements over budget" in page
    # The crash, escaped; skips with their reason and count; versions, including absent ones.
    assert "illegal memory access &lt;sim&gt;" in page and "<sim>" not in page
    assert '<pre class="traceback">Traceback (most recent call last):' in page
    assert "no CUDA device: torch.cuda.is_available() is False" in page
    assert "<th>flashinfer</th><td>not installed</td>" in page


def test_matrix_cells_link_to_their_first_failure():
    doc = sample_document()
    page = html.render(doc)
    problems = [r for r in doc["results"] if r["status"] in ("fail", "error", "crash", "hang")]
    rows = page[page.index('id="summary-matrix"') : page.index("</table>")].split("<tr>")[2:]
    linked = 0
    for i, rec in enumerate(problems, 1):
        family = matrix.family_label(rec["family"])
        head = f"<th>{rec['backend']}</th><td>{rec['device']}</td><td>{family}</td>"
        (row,) = [r for r in rows if head in r]
        first_cell = row.split('<td class="cell')[1]  # the "all" column
        assert f'href="#failure-{i}" class="n-{rec["status"]}">1 {rec["status"]}</a>' in first_cell
        linked += 1
    assert linked == 3 and page.count('href="#failure-') >= 3


def test_zero_counts_in_the_header_are_not_alarming():
    doc = sample_document()
    doc["results"] = [r for r in doc["results"] if r["status"] in ("pass", "skip")]
    totals = html.render(doc).split('id="totals">')[1].split("</p>")[0]
    for status in ("fail", "error", "crash", "hang"):
        assert f'<span class="n-zero">0 {status}</span>' in totals and f'class="n-{status}"' not in totals
    assert '<span class="n-pass">1 pass</span>' in totals


def test_skip_only_rows_that_share_a_reason_collapse_into_one_line():
    doc = sample_document()
    skip = next(r for r in doc["results"] if r["status"] == "skip" and r["case"] is None)
    others = [r for r in doc["results"] if r["device"] == "cpu"]
    backends, families = ("fa3", "flashinfer_paged"), ("decode", "verify")
    skips = [skip | {"backend": b, "family": f} for b in backends for f in families]
    odd = skip | {"backend": "fa4", "reason": "flash-attn-4 not installed"}
    doc["results"] = others + skips + [odd]
    page = html.render(doc)
    matrix_html = page[page.index('id="summary-matrix"') : page.index("</table>")]
    assert matrix_html.count('<tr class="collapsed">') == 1
    assert "4 rows on cuda skipped" in matrix_html and "(2 backends: fa3, flashinfer_paged)" in matrix_html
    assert "<th>fa3</th>" not in matrix_html and "<th>fa4</th>" in matrix_html  # a lone reason stays a row
    assert "<th>harness.mutants.torch_native:_WindowIgnored</th>" in matrix_html


def test_a_one_token_heatmap_is_wide_has_axis_ticks_and_outlines_its_worst_cell():
    doc = sample_document()
    fail = next(r for r in doc["results"] if r["status"] == "fail")
    em = {"quantity": "q", "budget": 0.01, "tokens": 1, "heads": 4, "token_bin": 1, "request_starts": [0]}
    fail["error_map"] = em | {"values": [[0.001, 0.2, 0.05, 0.0]]}  # head 1: 20x its budget
    doc["results"] = [fail]
    page = html.render(doc)
    figure = page[page.index('<div class="axes">') : page.index("</figure>")]
    img = figure[figure.index("<img") : figure.index(">", figure.index("<img"))]
    width, height = (int(img.split(f'{k}="')[1].split('"')[0]) for k in ("width", "height"))
    assert width >= pictures.HEATMAP_MIN_WIDTH and height == 6 * 16  # 4 heads + the start strip, 16px rows
    box = f"left:1px;top:17px;width:{width}px;height:16px"  # one column; head 1 is the second row
    assert f'<span class="worst-cell" style="{box}"></span>' in figure
    assert [f'class="ytick" style="top:{1 + 16 * y + 8}px">{y}<' in figure for y in range(4)] == [True] * 4
    assert figure.count('class="xtick"') == 1 and '">0</span>' in figure  # token 0 (first and last)
    assert "Outlined: the worst cell (token 0, head 1: 20× the budget)" in page
    em["token_bin"], em["tokens"] = 2, 600
    fail["error_map"] = em | {"values": [[0.0] * 4] * 299 + [[0.0, 0.0, None, 0.0]]}  # NaN at the end
    page = html.render(doc)
    assert "Outlined: the worst cell (tokens 598..599, head 2: NaN/Inf)" in page


def test_html_of_a_clean_run_says_so():
    doc = sample_document()
    doc["results"] = [r for r in doc["results"] if r["status"] == "pass"]
    page = html.render(doc)
    assert "attn-harness report: PASSED" in page and "Failures (0)" in page and 'id="failure-1"' not in page
    doc["results"] = []
    assert "NOTHING CHECKED" in html.render(doc)


def test_rendering_is_a_pure_function_of_the_results_file(tmp_path):
    page = write_run(tmp_path / "a", sample_document())
    render_views(results_json.load(tmp_path / "a" / "results.json"), tmp_path / "b")
    for name in ("index.html", "junit.xml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert page == tmp_path / "a" / "index.html"


def test_junit_has_one_testcase_per_record_with_failures_errors_and_skips():
    doc = sample_document()
    root = ET.fromstring(junit.render(doc))
    assert root.get("tests") == str(len(doc["results"]))
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("2", "1", "2")
    cases = root.findall(".//testcase")
    assert len(cases) == len(doc["results"])
    failure = root.find(".//testcase/failure")
    assert "Replay:" in failure.text and "Mask probe:" in failure.text and failure.get("type") == "fail"
    assert root.find(".//testcase/error").get("message") == "illegal memory access <sim>"
    assert all(":" not in c.get("classname") for c in cases)


def test_png_encodes_pixels_exactly():
    pixels = [[(255, 0, 0), (0, 255, 0), (0, 0, 255)], [(1, 2, 3), (250, 251, 252), (0, 0, 0)]]
    assert decode(pictures.encode(pixels)) == pixels
    with pytest.raises(ValueError, match="equal, non-empty rows"):
        pictures.encode([[(0, 0, 0)], []])


def test_heatmap_colours_follow_error_over_budget_and_mark_request_starts():
    em = {
        "budget": 0.1,
        "token_bin": 1,
        "heads": 2,
        "request_starts": [0, 2],
        "values": [[0.0, 0.05], [1.0, None], [0.2, 0.1]],
    }
    px = pictures.heatmap_pixels(em)
    assert len(px) == 2 + 2 and len(px[0]) == 3
    assert px[0][0] == pictures.WHITE and px[1][1] == pictures.NAN_COLOUR
    assert px[0][1] == pictures.ratio_colour(10.0) and px[0][1][0] > px[0][1][1]  # red-ish above budget
    assert px[1][0][1] > px[1][0][0]  # green-ish within budget
    assert px[3] == [pictures.TICK, pictures.WHITE, pictures.TICK]


def test_environment_lists_versions_and_says_not_installed():
    env = environment.collect()
    assert list(env)[:5] == ["python", "platform", "gpu", "driver", "cuda"]
    assert {"torch", "flashinfer", "flash-attn", "transformers", "hypothesis"} <= set(env)
    assert env["hypothesis"] != environment.NOT_INSTALLED
    assert environment.package_version(("no-such-distribution-xyz",)) == "not installed"


def test_environment_names_the_harness_commit_and_each_plugin_with_its_version(tmp_path, monkeypatch):
    info = tmp_path / "myattn_engine-2.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myattn-engine\nVersion: 2.3.1\n")
    (info / "entry_points.txt").write_text("[attn_harness.backends]\nmyattn = myattn_engine.glue:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = environment.collect()
    assert "myattn = myattn_engine.glue:make (myattn-engine 2.3.1)" in env["backend plugins"]
    version = env["attn-harness"]
    assert version.startswith("0.1.0 (git ") and len(version.split()[2].rstrip(")")) == 12, version


def test_progress_line_counts_examples_tests_and_failing_tests():
    now = [100.0]
    p = Progress(total_tests=4, clock=lambda: now[0], examples_per_test=10)
    p.case("pass", "t1")
    p.case("fail", "t1")
    p.case("fail", "t1")  # shrinking: still one failing test
    p.test_done("t1", True)
    p.case("skip", "t2")
    p.case("refused", "t2")  # a drawn case the backend turned down: not a failure
    now[0] = 165.0
    # expected: t1's 3 + 10 for each of the 3 tests left; done: 1 test + 2 of t2's 10 examples = 1.2 of 4
    # tests, so 65 s for 30% leaves ~152 s
    assert p.line() == (
        "[######--------------] 5/~33 records (2 skipped or refused) | 1/4 tests | 1 failing | "
        "1:05 elapsed, ~2:31 left | t2"
    )
    assert p.due(5.0) and not p.due(5.0)
    now[0] = 170.0
    assert p.due(5.0)


def test_progress_estimate_caps_a_running_test_and_ends_at_zero_left():
    now = [0.0]
    p = Progress(total_tests=2, clock=lambda: now[0], examples_per_test=4)
    for _ in range(9):  # past max_examples: shrinking
        p.case("fail", "t1")
    now[0] = 60.0
    assert p.fraction() == pytest.approx(0.95 / 2) and "left" not in p.line()  # no test has ended yet
    assert p.line().startswith("[#########-----------] 9/~13 records")  # t1's 9 so far + 4 for t2
    p.test_done("t1", True, records=1)  # the shrinking examples leave one record
    now[0] = 90.0
    assert p.fraction() == 0.5 and "~1:30 left" in p.line() and " 1/~5 records" in p.line()
    p.test_done("t2", False)
    assert p.fraction() == 1.0 and "left" not in p.line() and "[####################]" in p.line()


def test_progress_gives_no_estimate_until_it_can_be_a_sane_one():
    """A run whose start (imports, collection, the worker) takes 30 s and whose 100 tests then take
    1 s each: the first record's estimate divided that start by a thousandth of the run (hours for a
    run of two minutes). None is given until 5% of the run is done; then it is near the truth."""
    now = [0.0]
    p = Progress(total_tests=100, clock=lambda: now[0], examples_per_test=10)
    now[0] = 30.0
    shown = []
    for t in range(100):
        for e in range(10):
            now[0] = 30.0 + t + e / 10
            p.case("pass", f"t{t}")
            left = p.left()
            if left is None:
                assert "left" not in p.line()
            else:
                shown.append((t, left, 100 - t - e / 10))
        p.test_done(f"t{t}", False, records=10)
    assert shown and min(t for t, _, _ in shown) >= 4  # none before 5% of the run, one test ended
    assert all(0.8 * truth <= left <= 1.25 * truth for _, left, truth in shown if truth > 5), shown[:5]


def test_summary_columns_fit_long_names_and_a_skip_only_row_has_no_worst():
    long = "harness.mutants.torch_native:_WindowIgnored"
    rec = dict(device="cpu", reason="", verdict=None)
    records = [
        rec | {"status": "pass", "backend": long, "family": "prefix", "verdict": {"ratio": 0.25}},
        rec | {"status": "skip", "backend": "b", "family": "draft_extend_v2"},
        rec | {"status": "skip", "backend": "b", "family": "draft_extend_v2", "reason": "another"},
    ]
    head, rule, *rows = summary_table(records).splitlines()[:4]  # two reasons: the row is not collapsed
    assert len({len(head), len(rule), *map(len, rows)}) == 1  # every column ends where its header ends
    start = head.index("family")  # left-aligned; the counts and worst are right-aligned
    assert [row[start - 1 : start + 6] for row in rows] == [" draft_", " prefix"]
    for name in ("pass", "checked", "worst"):
        end = head.index(name) + len(name)
        assert all(row[end - 1] != " " and row[end : end + 1] in ("", " ") for row in rows), name
    assert rows[1].endswith(" 0.25") and rows[0].endswith(" -")


def test_summary_collapses_skip_only_rows_into_a_line_per_reason_and_counts_records():
    """On a CPU machine most rows are a CUDA backend's tests skipped for want of a device: one line
    per (device, reason), as the report's matrix does; the counts are records, said once."""
    rec = dict(device="cuda", verdict=None, reason="no CUDA device")
    pairs = [(b, f) for b in ("fa3", "fa4") for f in ("decode", "cross")]
    records = [rec | {"status": "skip", "backend": b, "family": f} for b, f in pairs]
    passed = dict(status="pass", backend="torch_native", device="cpu", family="decode", reason="")
    records += [rec | passed] * 3
    lines = summary_table(records).splitlines()
    assert [line.split()[0] for line in lines[2:3]] == ["torch_native@cpu"]  # the only row left
    assert lines[3] == "skipped only (4 rows, 4 records on cuda, 2 backends: fa3, fa4): no CUDA device"
    assert lines[4] == "7 records: 3 pass, 4 skip" and len(lines) == 5


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
