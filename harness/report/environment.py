"""The environment a run checked: GPU and driver, and the versions of every library that matters.

Versions come from package metadata, not imports, so listing them never initialises a kernel
library; a package that is absent says "not installed". A kernel library with a supported range
(harness/backends/versions.py) says where its release stands: "0.6.18.post1 (tested)".
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import harness
from harness.backends import ENTRY_POINT_GROUP
from harness.backends.engines.sglang.engine import SGLANG
from harness.backends.flash_attn_versions import FA4_RANGE
from harness.backends.flashinfer_versions import RANGE as FLASHINFER_RANGE

NOT_INSTALLED = "not installed"
# (report label, distribution names to look for)
PACKAGES = (
    ("torch", ("torch",)),
    ("flashinfer", ("flashinfer-python", "flashinfer")),
    ("flash-attn", ("flash-attn-4", "flash-attn", "flash-attn-3")),
    ("transformers", ("transformers",)),
    ("sglang", ("sglang",)),
    ("hypothesis", ("hypothesis",)),
)
# distribution -> supported range
RANGES = {r.distribution: r for r in (FLASHINFER_RANGE, FA4_RANGE, SGLANG.supported)}


def package_version(names: tuple[str, ...]) -> str:
    """'1.2.3', or 'dist 1.2.3; other 4.5' when several are installed, or 'not installed'; a release
    of a library with a supported range carries its standing, '0.7.2.post1 (tested)'."""
    found = []
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append((name, f"{version} ({RANGES[name].status(version)})" if name in RANGES else version))
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


def harness_version() -> str:
    """The harness's own version and, from a git checkout, its commit ('+ changes' if the tree differs)."""
    root = Path(harness.__file__).resolve().parent.parent
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return f"{harness.__version__} (not a git checkout)"
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, timeout=20)

    try:
        head = run("rev-parse", "--short=12", "HEAD")
        dirty = run("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{harness.__version__} (git: {type(e).__name__})"
    if head.returncode != 0:
        return f"{harness.__version__} (git: {head.stderr.strip() or 'no commit'})"
    changes = " + uncommitted changes" if dirty.stdout.strip() else ""
    return f"{harness.__version__} (git {head.stdout.strip()}{changes})"


def plugin_versions() -> str:
    """The installed backend plugins: 'name = module:factory (distribution version)', '; '-separated."""
    found = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
        found.append(f"{ep.name} = {ep.value} ({dist})")
    return "; ".join(found) or f"none (no entry points in {ENTRY_POINT_GROUP})"


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
    env["attn-harness"] = harness_version()
    env["backend plugins"] = plugin_versions()
    env["compile cache"] = cache_directory()
    return env
