"""The report in a real browser: headless Chromium renders index.html of a run with an injected
window bug; the summary matrix and the failure section (its probe picture and heatmap included)
must be laid out, unobscured, and show their colours in screenshots.

Chromium is driven over the DevTools protocol on a pipe (tests/browser.py), offline. CI installs
Debian's `chromium` package (.ci/run); the test skips only if no Chromium can be found at all.
"""

import json

import pytest

from harness.report import pictures
from tests import browser
from tests.pngdecode import decode
from tests.report_helpers import mutant_run

CHROMIUM = browser.find()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium found (set CHROMIUM, or `apt-get install -y chromium`; .ci/run installs it)",
)

ELEMENTS = (
    "#summary-matrix",
    "#failure-1",
    "#failure-1 img.probe",
    "#failure-1 img.heatmap",
    "#failure-1 div.axes",
)
WORST_OUTLINE = (0, 160, 255)  # harness/report/html.py's .worst-cell
# For each element: scroll it into view, then ask what is painted at a point inside its top-left corner.
LAYOUT = """JSON.stringify(Object.fromEntries(%s.map(sel => {
  const el = document.querySelector(sel);
  if (!el) return [sel, null];
  el.scrollIntoView({block: "start"});
  const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  const hit = document.elementFromPoint(r.left + Math.min(20, r.width / 2),
                                        r.top + Math.min(20, r.height / 2));
  return [sel, {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height,
                shown: s.display !== "none" && s.visibility === "visible" && Number(s.opacity) > 0,
                onTop: hit !== null && (hit === el || el.contains(hit))}];
})))"""


def near(px, colour, tol=6):
    return all(abs(a - b) <= tol for a, b in zip(px, colour))


def has_colour(pixels, colour):
    return any(near(px, colour) for row in pixels for px in row)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    run, _ = mutant_run()
    b = browser.Browser(CHROMIUM)
    try:
        b.open((run / "index.html").as_uri(), width=1280, height=900)
        layout = json.loads(b.evaluate(LAYOUT % json.dumps(list(ELEMENTS))))
        full = b.screenshot()
        clips = {sel: decode(b.screenshot(box_of(layout[sel]))) for sel in ELEMENTS if layout.get(sel)}
        text = b.evaluate("document.body.innerText")
    finally:
        b.close()
    shot = tmp_path_factory.mktemp("browser") / "report.png"
    shot.write_bytes(full)
    return layout, clips, text, shot


def box_of(item):
    return {
        "x": item["x"],
        "y": item["y"],
        "width": min(item["width"], 1200),
        "height": min(item["height"], 700),
    }


def test_matrix_and_failure_section_are_laid_out_and_unobscured(rendered):
    layout, _, text, shot = rendered
    for sel in ELEMENTS:
        item = layout[sel]
        assert item is not None, f"{sel} is missing from the page"
        assert item["width"] > 50 and item["height"] > 10, (sel, item)
        assert item["shown"] and item["onTop"], (sel, item)
    assert layout["#summary-matrix"]["y"] < layout["#failure-1"]["y"]
    assert "Summary matrix" in text and "1. FAIL" in text and "outside its window" in text
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_screenshots_show_the_matrix_colours_and_the_probe_picture(rendered):
    _, clips, _, _ = rendered
    assert has_colour(clips["#summary-matrix"], (244, 182, 176))  # the failing cell
    probe = clips["#failure-1 img.probe"]
    assert has_colour(probe, pictures.PROBE_COLOURS["+"])  # wrongly attended keys
    assert has_colour(probe, pictures.PROBE_COLOURS["#"])  # the keys inside the window
    heat = clips["#failure-1 img.heatmap"]
    assert any(px[0] > 120 and px[1] < 80 and px[2] < 60 for row in heat for px in row)  # far over budget
    assert has_colour(clips["#failure-1"], (192, 57, 43))  # the failure section's border
    assert has_colour(clips["#failure-1 div.axes"], WORST_OUTLINE)  # the worst cell, outlined


def test_the_layout_check_catches_a_hidden_failure_section(tmp_path):
    run, _ = mutant_run()
    page = (run / "index.html").read_text().replace("</style>", "#failure-1{visibility:hidden}</style>")
    hidden = tmp_path / "hidden.html"
    hidden.write_text(page)
    b = browser.Browser(CHROMIUM)
    try:
        b.open(hidden.as_uri())
        layout = json.loads(b.evaluate(LAYOUT % json.dumps(list(ELEMENTS))))
    finally:
        b.close()
    assert layout["#summary-matrix"]["shown"] and layout["#summary-matrix"]["onTop"]
    assert not layout["#failure-1"]["shown"] and not layout["#failure-1 img.probe"]["onTop"]
