"""SIGTERM as Ctrl-C: what `timeout` and CI runners send at a time limit, to the command's process alone.

A check stopped that way used to die with every record lost. Handled as a SIGINT (a
KeyboardInterrupt in the main thread), it stops as on Ctrl-C: it passes the interrupt on to its
pytest processes, writes what it checked so far under a report headed INTERRUPTED, and exits 130.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def as_ctrl_c() -> Iterator[None]:
    """Within the block a SIGTERM raises KeyboardInterrupt; the caller's handler is back after it.
    Only the main thread may set a handler: elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
