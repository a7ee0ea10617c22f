"""The bench's scale section: time and peak memory of the reference on one long request, each run
in a fresh child process (harness/run/workers.py) under a time limit, so that the peak is its own."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.core.batch import make_inputs
from harness.core.case import Case, Request
from harness.core.modes import Mode
from harness.run.workers import run_child

# One EXTEND request without a prefix, the shape of a long-context GQA model's layer.
SCALE_SHAPE = {"num_q_heads": 8, "num_kv_heads": 1, "head_dim": 128, "dtype": "bfloat16"}
SCALE_TOKENS = (8192, 32768, 131072)
SCALE_WINDOW = 4095  # window_left: 4096 keys, a common sliding-window size
GIB = 1 << 30


@dataclass(kw_only=True)
class ScaleRow:
    device: str
    tokens: int
    window_left: int
    status: str  # ok, timeout (the exact or native run exceeded the limit), error
    exact_seconds: float | None = None
    exact_peak_bytes: int | None = None
    native_seconds: float | None = None
    native_peak_bytes: int | None = None
    check_seconds: float | None = None  # exact + native: what a check of this request costs
    peak_bytes: int | None = None  # the larger of the two peaks
    target: str = ""
    verdict: str = ""  # met, MISSED, or "" where no target applies
    reason: str = ""


def scale_case(tokens: int, window_left: int) -> Case:
    """One EXTEND request of `tokens` new tokens, no prefix, in SCALE_SHAPE."""
    return Case(mode=Mode.EXTEND, requests=(Request(0, tokens),), window_left=window_left, **SCALE_SHAPE)


def _peak_reset() -> None:
    """Reset the kernel's peak-RSS mark (Linux); elsewhere the peak includes making the inputs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _rss(field_name: str) -> int:
    """VmRSS (now) or VmHWM (peak) in bytes. /proc rather than getrusage: a spawned child's
    ru_maxrss starts at its parent's peak (Linux keeps it across fork and exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def scale_child(spec: str) -> None:
    """In a fresh process: one reference run of a scale case; writes {"seconds", "peak_bytes"} as
    JSON to the spec's `out` path."""
    from references.torch_ref import reference

    s = json.loads(spec)
    device = torch.device(s["device"])
    case = scale_case(s["tokens"], s["window_left"])
    inputs = make_inputs(case)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        _peak_reset()
        before = _rss("VmRSS")
    start = time.perf_counter()
    reference(case, inputs, s["precision"], device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _rss("VmHWM") - before
    got = {"seconds": time.perf_counter() - start, "peak_bytes": max(0, peak)}
    Path(s["out"]).write_text(json.dumps(got))


def _run_child(device: str, tokens: int, window: int, precision: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="attn-harness-scale-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "child.log"
        spec = {
            "device": device,
            "tokens": tokens,
            "window_left": window,
            "precision": precision,
            "out": str(out),
        }
        code = "import sys; from harness.tools.bench.scale import scale_child; scale_child(sys.argv[1])"
        status = run_child([sys.executable, "-c", code, json.dumps(spec)], log, timeout)
        if status is None:
            return {"status": "timeout", "reason": f"timeout after {timeout:g}s ({precision})"}
        if status != 0 or not out.is_file():
            tail = (log.read_text(errors="replace").strip().splitlines() or [f"exit {status}"])[-1]
            return {"status": "error", "reason": f"{precision}: {tail}"}
        return {"status": "ok", **json.loads(out.read_text())}


def scale_target(device: str, tokens: int, window: int) -> tuple[str, float, int | None] | None:
    """The issue's targets: (text, seconds, bytes or None) for the rows they apply to."""
    if device == "cpu" and tokens == 32768:
        return "< 120 s, < 4 GiB", 120.0, 4 * GIB
    if device == "cuda" and tokens == 131072 and window >= 0:
        return "< 10 s, no OOM", 10.0, None
    return None


def scale_row(device: str, tokens: int, window: int, timeout: float) -> ScaleRow:
    """Exact, then native (a check needs both), each in its own child process under `timeout`."""
    row = ScaleRow(device=device, tokens=tokens, window_left=window, status="ok")
    for precision in ("exact", "native"):
        got = _run_child(device, tokens, window, precision, timeout)
        if got["status"] != "ok":
            row.status, row.reason = got["status"], got["reason"]
            break
        setattr(row, f"{precision}_seconds", got["seconds"])
        setattr(row, f"{precision}_peak_bytes", got["peak_bytes"])
    if row.status == "ok":
        row.check_seconds = row.exact_seconds + row.native_seconds
        row.peak_bytes = max(row.exact_peak_bytes, row.native_peak_bytes)
    target = scale_target(device, tokens, window)
    if target:
        row.target, secs, limit = target
        met = row.status == "ok" and row.check_seconds < secs and (limit is None or row.peak_bytes < limit)
        row.verdict = "met" if met else "MISSED"
    return row
