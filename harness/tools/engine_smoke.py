"""What the engines' GPU smoke scripts (engines/*-gpu-smoke.py) share: an adapter made ready, or why not.

A smoke script is a first contact with a GPU machine: it prints every step and goes on after a
failure, so one try says as much as it can. Each starts by loading its adapter and asking whether it
runs here; the answer, and the traceback where the engine is installed but broken, is printed here.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from harness.backends import BackendBroken, load
from harness.backends.engines.base import EngineAdapter
from harness.core.results import CaseResult


def ready_adapter(name: str, device: str) -> EngineAdapter | None:
    """The adapter `name`, available on `device`; else None, once it printed why (broken: with the
    traceback) under its heading, with its engine's release and how the range judges it."""
    print(f"== {name}", flush=True)
    try:
        backend = load(name)
        why = backend.available(device)
    except BackendBroken as e:
        print(f"   broken: {e}")
        traceback.print_exc()
        return None
    if why is not None:
        print(f"   unavailable: {why}")
        return None
    release = backend.release()
    print(f"   {backend.library} {release} ({backend.supported.status(release or '')})")
    return backend


def step(label: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Run one step: (True, its value), or (False, None) once its name and full traceback are printed."""
    print(f"   {label} ...", flush=True)
    try:
        return True, fn()
    except Exception:  # noqa: BLE001 - the point is to print whatever goes wrong, then go on
        print(f"   {label}: raised")
        traceback.print_exc()
        return False, None


def show(label: str, result: CaseResult) -> None:
    """A check's result in one line (its error and budget where it has a verdict), then the backend's
    traceback where it raised."""
    v = result.verdict
    error = f", error {v.err:.3g} (budget {v.budget:.3g})" if v is not None else ""
    print(f"   {label}: {result.status}{error}: {result.reason}")
    if "traceback" in result.extra:
        print(result.extra["traceback"])
