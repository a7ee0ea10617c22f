"""Old import paths kept for one release: a module-level __getattr__ that forwards to the new home.

`from harness.batch import Batch` still works and warns (DeprecationWarning, at the importing line)
that the name now lives in harness.api, or where it moved when harness.api does not export it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def forward(old: str, new: str) -> Callable[[str], Any]:
    """The __getattr__ of the old module `old`, resolving names from module `new`."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's __getattr__
        if name.startswith("__"):
            raise AttributeError(name)
        target = importlib.import_module(new)
        try:
            value = getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (nor has {new})") from None
        api = importlib.import_module("harness.api")
        home = "harness.api" if name in api.__all__ else new
        warnings.warn(
            f"{old}.{name} is deprecated and goes in the next release: import it from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__
