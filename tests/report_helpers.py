"""Shared inputs of the report tests: one real check run with an injected window bug (run once per
test session), and a small results document built from real case results in-process."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from harness.backends import load
from harness.checks.numeric import check_case
from harness.checks.probe import probe
from harness.core.results import CaseResult
from harness.report import results_json
from tests.helpers import case

ROOT = Path(__file__).resolve().parent.parent
WINDOW_IGNORED = "harness.mutants.torch_native:_WindowIgnored"
# The pinned SWA extend-with-prefix case (harness/search/pinned.py), the suite's first example for `prefix`.
PINNED_QUERY_LINE = "request 0, query 0 (position 40) attended keys 0..32, outside its window [33, 40]"


@cache
def mutant_run() -> tuple[Path, subprocess.CompletedProcess]:
    """`python -m harness check` of the window-ignored mutant on the prefix family: (run dir, process)."""
    reports = Path(tempfile.mkdtemp(prefix="attn-harness-reports-"))
    atexit.register(shutil.rmtree, reports, True)
    cmd = [sys.executable, "-m", "harness", "check", "--backend", WINDOW_IGNORED, "--family", "prefix"]
    cmd += ["-k", "swa", "--device", "cpu", "--profile", "ci", "--reports", str(reports)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_HARNESS")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    latest = reports / "latest"
    assert latest.is_symlink(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return latest.resolve(), proc


def sample_results() -> list[dict]:
    """A pass, a probed window failure, a NaN failure, a skip, a crash and a whole-test skip."""
    native = load("torch_native")
    ignored = load(WINDOW_IGNORED)
    untranslated = load("harness.mutants.torch_native:_SwaUntranslated")
    windowed = case("EXTEND", ((30, 12),), window_left=7, head_dim=16, page_size=16)
    hybrid = case("EXTEND", ((40, 4),), window_left=5, head_dim=16, hybrid_swa_pool=True)
    out = []
    for backend, c in ((native, windowed), (ignored, windowed), (untranslated, hybrid)):
        res = check_case(backend, c, "cpu")
        if res.status == "fail":
            res.probe = probe(backend, c, "cpu").to_dict()
        out.append(res.to_dict() | {"test_id": f"cases/test_extend.py::test_prefix[{backend.name}-cpu-swa]"})
    out.append(check_case(native, c.replace(dtype="float32"), "cuda").to_dict())
    crash = CaseResult(
        status="crash",
        backend="torch_native",
        device="cuda",
        case=windowed,
        reason="illegal memory access <sim>",
        extra={"traceback": "Traceback (most recent call last):\nRuntimeError: illegal memory access"},
    )
    out.append(crash.to_dict())
    out.append(
        {
            "status": "skip",
            "backend": "torch_native",
            "device": "cuda",
            "family": "verify",
            "mode": "verify",
            "features": [],
            "case": None,
            "verdict": None,
            "reason": "no CUDA device: torch.cuda.is_available() is False",
            "seconds": 0.0,
            "test_id": "cases/test_verify.py::test_verify[torch_native-cuda-full]",
            "repro": None,
            "error_map": None,
            "probe": None,
        }
    )
    return out


@cache
def sample_document_text() -> str:
    run = {
        "id": "sample-run",
        "started": "2026-01-01T00:00:00+0000",
        "elapsed_s": 1.5,
        "profile": "ci",
        "command": "pytest cases",
        "exit_status": 1,
    }
    env = {"torch": "2.13.0", "flashinfer": "not installed", "gpu": "none"}
    return results_json.dumps(results_json.build(sample_results(), run, env))


def sample_document() -> dict:
    """A fresh (mutable) copy of the sample results document, as read back from its JSON."""
    return results_json.loads(sample_document_text())
