"""Backends for the parallel bench's tests, loaded by their `module:factory` spec in each worker
process (named bench-worker-W): the parent gets plain torch_native, a worker gets the misbehaviour."""

from __future__ import annotations

import multiprocessing
import os
import time

from harness.backends import Backend, load
from harness.mutants import by_name

LATE_S = 4.0


def _worker() -> int | None:
    name = multiprocessing.current_process().name
    return int(name.rsplit("-", 1)[1]) if name.startswith("bench-worker-") else None


def dies_in_worker_0() -> Backend:
    """Worker 0 exits at once, without a word; worker 1 warms up and waits at the barrier."""
    if _worker() == 0:
        os._exit(3)
    return load("torch_native")


def raises_in_worker_1() -> Backend:
    if _worker() == 1:
        raise RuntimeError("no backend in worker 1")
    return load("torch_native")


def late_worker_1() -> Backend:
    """Worker 1 starts LATE_S seconds after worker 0: only the barrier keeps that out of a pass."""
    if _worker() == 1:
        time.sleep(LATE_S)
    return load("torch_native")


def broken_in_workers() -> Backend:
    """Correct in the parent's passes, the window bug in the workers'."""
    return by_name("torch_native~window_ignored").make() if _worker() is not None else load("torch_native")
