"""`make check`'s GPU set-up: on a machine with a GPU, install the `gpu` extra or fail naming what failed.

Run by the Makefile with the venv's Python, after torch and the project are installed. With a GPU,
each requirement of the `gpu` extra (pyproject.toml) is installed on its own, so a failure names its
package, and the set-up ends with the CUDA backends it made available. Without a GPU (or with --gpu
no) it installs nothing and says so, so a fresh GPU runner cannot pass green with every FlashInfer
and FA4 test a "not installed" skip.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata

DISTRIBUTION = "attn-harness"
EXTRA = re.compile(r";\s*extra\s*==\s*['\"]gpu['\"]\s*$")


def gpu_present(nvidia_smi: str | None, cuda_available: Callable[[], bool]) -> bool:
    """Whether this machine has a GPU."""
    if nvidia_smi is not None:
        try:
            res = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            res = None
        if res is not None and res.returncode == 0 and "GPU" in res.stdout:
            return True
    return cuda_available()


def gpu_requirements(requires: list[str] | None) -> list[str]:
    """The `gpu` extra's requirements, from the installed project's metadata (`Requires-Dist`)."""
    return [EXTRA.sub("", r).strip() for r in requires or [] if EXTRA.search(r)]


def install(requirements: list[str], pip: list[str], run: Callable[[list[str]], int]) -> list[str]:
    """pip-install each requirement on its own; the failed ones, with pip's exit status."""
    failed = []
    for req in requirements:
        rc = run([*pip, "install", "-q", req])
        if rc != 0:
            failed.append(f"{req} (pip exit {rc})")
    return failed


def cuda_summary() -> str:
    """One line: the CUDA backends available here, and why each other one is not."""
    from harness import backends
    from harness.run.check import availability

    importlib.invalidate_caches()  # the packages pip just installed are importable in this process
    ready, other = [], []
    for name in backends.names():
        b = backends.load(name)
        if "cuda" not in b.capabilities.devices:
            continue
        state, why = availability(b, "cuda")
        if state == "available":
            ready.append(name)
        else:
            other.append(f"gpu set-up:   {name} {state}: {why}")
    return "\n".join([f"gpu set-up: CUDA backends available: {', '.join(ready) or 'none'}", *other])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tools.gpu_setup", description=__doc__.split("\n")[0])
    p.add_argument("--gpu", choices=("auto", "no"), default="auto", help="no: never install the gpu extra")
    p.add_argument("--pip", nargs="+", default=[sys.executable, "-m", "pip"], help="the pip command")
    args = p.parse_args(argv)

    def cuda_available() -> bool:
        import torch

        return torch.cuda.is_available()

    if args.gpu == "no" or not gpu_present(shutil.which("nvidia-smi"), cuda_available):
        why = "GPU=no" if args.gpu == "no" else "no GPU here (nvidia-smi lists none, torch sees no CUDA)"
        print(f"gpu set-up: {why}: the gpu extra (FlashInfer, flash-attn-4) is not installed")
        return 0
    requirements = gpu_requirements(metadata.requires(DISTRIBUTION))
    if not requirements:
        print(f"gpu set-up: {DISTRIBUTION} is not installed with a gpu extra (pip install -e . first)")
        return 1
    print(f"gpu set-up: a GPU is here; installing {', '.join(requirements)}")
    failed = install(requirements, args.pip, lambda cmd: subprocess.run(cmd).returncode)
    if failed:
        print(f"gpu set-up: could not install {'; '.join(failed)}: its GPU backends would only skip")
        return 1
    print(cuda_summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
