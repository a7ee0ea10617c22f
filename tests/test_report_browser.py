"""The report in a real browser: headless Chromium renders index.html of a run with an injected
window bug; the summary matrix and the failure section (its probe picture and heatmap included)
must be laid out, unobscured, and show their colours in screenshots.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe), offline: no
websocket library, no network. Messages are JSON terminated by NUL; fd 3 carries commands to the
browser, fd 4 its replies and events. CI installs Debian's `chromium` package (.ci/run); the test
skips only if no Chromium is found.
`decode` reads PNGs (8-bit RGB or RGBA, not interlaced; ours and Chromium's) back as pixels."""

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib

import pytest

from harness.report import pictures
from tests.report_helpers import mutant_run

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--force-device-scale-factor=1",
    "--force-color-profile=srgb",
    "--hide-scrollbars",
]
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find() -> str | None:
    """CHROMIUM from the environment, else the first of NAMES on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in NAMES:
        if shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    def __init__(self, exe: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="attn-harness-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The browser's ends move above fd 9 so the shell can place them at 3 and 4 without a clash.
        to_browser_r, from_browser_w = (self._high(fd) for fd in (to_browser_r, from_browser_w))
        # The Debian launcher is a shell script: redirect inside a shell so fds 3/4 survive its exec
        # (bash, since dash's redirections take single-digit fds only).
        script = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        argv = [exe, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *argv],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self._events: list[dict] = []
        self.session = None

    @staticmethod
    def _high(fd: int) -> int:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return high

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no reply from chromium in {self.timeout:.0f}s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, page: bool = True) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if page and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self._events.append(reply)

    def wait_for(self, event: str) -> dict:
        while True:
            for i, e in enumerate(self._events):
                if e.get("method") == event:
                    return self._events.pop(i)
            self._events.append(self._read())

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, page=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, page=False)[
            "sessionId"
        ]
        self.send("Page.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):  # noqa: ANN201 - any JSON value
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self, clip: dict | None = None) -> bytes:
        params = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def close(self) -> None:
        try:
            self.send("Browser.close", page=False)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


CHROMIUM = find()
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
    b = Browser(CHROMIUM)
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
    b = Browser(CHROMIUM)
    try:
        b.open(hidden.as_uri())
        layout = json.loads(b.evaluate(LAYOUT % json.dumps(list(ELEMENTS))))
    finally:
        b.close()
    assert layout["#summary-matrix"]["shown"] and layout["#summary-matrix"]["onTop"]
    assert not layout["#failure-1"]["shown"] and not layout["#failure-1 img.probe"]["onTop"]


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(data: bytes) -> list[list[tuple[int, int, int]]]:
    """PNG bytes -> rows of (r, g, b) (alpha dropped)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = bytearray(stride)
    for y in range(height):
        filt = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if filt == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif filt == 2:
            line = bytearray((x + p) & 255 for x, p in zip(line, prev))
        elif filt == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + (left + prev[i]) // 2) & 255
        elif filt == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                c = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(a, prev[i], c)) & 255
        rows.append([tuple(line[x * bpp : x * bpp + 3]) for x in range(width)])
        prev = line
    return rows
