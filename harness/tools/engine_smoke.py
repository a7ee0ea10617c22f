"""What the engines' GPU smoke scripts (engines/*-gpu-smoke.py) share: an adapter made ready, or why not.

A smoke script is a first contact with a GPU machine: it prints every step and goes on after a
failure, so one try says as much as it can. Each starts by loading its adapter and asking whether it
runs here; the answer, and the traceback where the engine is installed but broken, is printed here.
"""

from __future__ import annotations

import traceback

from harness.backends import BackendBroken, load
from harness.backends.engines.base import EngineAdapter


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
