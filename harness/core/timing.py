"""Phase timing for the benchmark: where a check's wall time goes (build, plan, kernel, ...).

`with phase("plan"):` marks a span of harness or adapter code. It costs one global lookup unless a
`Recorder` is active (`with recording() as rec:`), so the suite pays nothing for the marks. While
recording, time is exclusive: a phase nested in another (an adapter's `plan` inside the check's
`kernel`) is charged to itself and taken out of its parent. On CUDA every boundary synchronises
the device while recording, so asynchronous kernel work is charged to the phase that launched it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Recorder:
    """Exclusive seconds per phase name, summed over every span recorded while it was active."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[str] = []
        self._since = 0.0

    def _switch(self, to: str | None) -> None:
        """Charge the time since the last boundary to the innermost open phase, then move on."""
        if torch.cuda.is_initialized():  # only a process that has used CUDA has work in flight
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._since
        self._since = now
        if to is None:
            self._stack.pop()
        else:
            self._stack.append(to)


_active: Recorder | None = None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Charge the enclosed code's time to `name` while a recorder is active; a no-op otherwise."""
    rec = _active
    if rec is None:
        yield
        return
    rec._switch(name)
    try:
        yield
    finally:
        rec._switch(None)


@contextmanager
def recording(recorder: Recorder | None = None) -> Iterator[Recorder]:
    """Activate `recorder` (a fresh one by default) for the enclosed code (not re-entrant: one bench at
    a time). A subclass may keep something else per phase (the bench's op counts)."""
    global _active
    previous, _active = _active, recorder or Recorder()
    try:
        yield _active
    finally:
        _active = previous
