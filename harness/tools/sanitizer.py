"""Replaying a case under NVIDIA compute-sanitizer (memcheck): where a CRASH read or wrote.

`python -m harness repro --sanitize case.json` reruns the same repro in a child process under
`compute-sanitizer --tool memcheck`, with PyTorch's caching allocator off so that an access past
the end of a tensor lands outside any allocation and is reported. Where the tool is not installed,
it says so and where it looked, and runs nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

TOOL = "compute-sanitizer"


def candidates() -> list[str]:
    """Where compute-sanitizer is looked for, in order."""
    places = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            places.append(os.path.join(os.environ[var], "bin", TOOL))
    places.append(f"/usr/local/cuda/bin/{TOOL}")
    site = sysconfig.get_paths()["purelib"]
    places += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", TOOL)))
    places += sorted(glob.glob(os.path.join(site, "nvidia", "*", TOOL, TOOL)))
    return places


def find() -> str | None:
    """The compute-sanitizer executable: on PATH, under CUDA_HOME, /usr/local/cuda, or a pip wheel."""
    on_path = shutil.which(TOOL)
    if on_path:
        return on_path
    for path in candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def not_installed() -> str:
    return f"{TOOL} is not installed: not on PATH, nor at {', '.join(candidates())}"


def command(tool: str, case: str, backend: str) -> list[str]:
    """memcheck around `python -m harness repro CASE --backend BACKEND --device cuda`."""
    repro = [sys.executable, "-m", "harness", "repro", case, "--backend", backend, "--device", "cuda"]
    return [tool, "--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "20", *repro]


def run(case: str, backend: str) -> int:
    """Run the repro under memcheck and return its exit status (86: memcheck found errors)."""
    tool = find()
    if tool is None:
        raise FileNotFoundError(not_installed())
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    cmd = command(tool, case, backend)
    print(f"compute-sanitizer: {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, env=env).returncode


def repro(case: str, backend: str, device: str | None) -> int:
    """`repro --sanitize`: the repro under memcheck; a RequestError where it cannot run (a GraphCase,
    the CPU, no compute-sanitizer)."""
    from harness.run.check import RequestError, load_backend
    from harness.run.repro import read_case

    if not hasattr(read_case(case), "seed"):
        raise RequestError("--sanitize takes a Case, not a GraphCase")
    load_backend(backend)
    if device == "cpu":
        raise RequestError("--sanitize checks CUDA memory accesses: use it with --device cuda")
    if find() is None:
        raise RequestError(not_installed())
    code = run(case, backend)
    print(f"compute-sanitizer memcheck: exit {code}" + (" (memory errors found)" if code == 86 else ""))
    return code
