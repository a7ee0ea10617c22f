"""The environment a run checked: GPU and driver, and the versions of every library that matters.

Versions come from package metadata, not imports, so listing them never initialises a kernel
library; a package that is absent says "not installed".
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata

NOT_INSTALLED = "not installed"
# (report label, distribution names to look for)
PACKAGES = (
    ("torch", ("torch",)),
    ("flashinfer", ("flashinfer-python", "flashinfer")),
    ("flash-attn", ("flash-attn-4", "flash-attn", "flash-attn-3")),
    ("transformers", ("transformers",)),
    ("hypothesis", ("hypothesis",)),
)


def package_version(names: tuple[str, ...]) -> str:
    """'1.2.3', or 'dist 1.2.3; other 4.5' when several are installed, or 'not installed'."""
    found = []
    for name in names:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    if not found:
        return NOT_INSTALLED
    if len(found) == 1 and found[0][0] == names[0]:
        return found[0][1]
    return "; ".join(f"{n} {v}" for n, v in found)


def driver_version() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown (nvidia-smi not found)"
    try:
        res = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    lines = sorted(set(res.stdout.split()))
    return (
        ", ".join(lines) if res.returncode == 0 and lines else f"unknown (nvidia-smi exit {res.returncode})"
    )


def cache_directory() -> str:
    """Where the compile caches are (harness/run/cache_dir.py), and any a user variable moved."""
    from harness.run import cache_dir

    return cache_dir.summary()


def collect() -> dict[str, str]:
    """label -> version or description, in the order the report shows them."""
    import torch

    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        gpu = torch.cuda.get_device_name(0) + (f" (x{n})" if n > 1 else "")
        driver = driver_version()
    else:
        gpu, driver = "none (torch.cuda.is_available() is False)", "n/a"
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": gpu,
        "driver": driver,
        "cuda": torch.version.cuda or "none (CPU build of torch)",
    }
    for label, names in PACKAGES:
        env[label] = package_version(names)
    env["compile cache"] = cache_directory()
    return env
