"""Is a backend's kernel library here? Absent (a skip reason), usable, or installed but broken (an error).

A library that is not installed is a fact about the machine: the backend's tests skip, saying so.
One that is installed but fails to import, or whose version the glue was not written against, must
not look the same, or a GPU runner with a broken install runs green: `import_library` raises
BackendBroken, so the backend's tests error with the import error or version message and `list`
shows it broken. Each library's supported releases are one range in its versions module
(flashinfer_versions.RANGE, flash_attn_versions.FA4_RANGE; versions.py), passed here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from harness.backends.base import BackendBroken
from harness.backends.versions import SupportedRange, module_version


def installed(name: str) -> bool:
    """Whether a top-level module is importable here, without importing it (None in sys.modules: no)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def import_library(
    module: str, supported: SupportedRange | None = None
) -> tuple[ModuleType | None, str | None]:
    """(the module, None) when it imports (at a release in `supported`, when one is given); (None, why)
    when it is not installed; raises BackendBroken when it is installed but fails to import or is at a
    release outside the range.

    A dotted module counts as absent when it or a parent package is missing (flash-attn-2 alone has
    no `flash_attn.cute`); a missing dependency of an installed package (FA4 without its CuTe DSL)
    is a broken install.
    """
    if not installed(module.partition(".")[0]):
        return None, f"{module} is not installed here"
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name in _parents(module):
            return None, f"{module} is not installed here ({e})"
        raise BackendBroken(f"{module} is installed but does not import: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001 - any failure of an installed package is a broken install
        raise BackendBroken(f"{module} is installed but does not import: {type(e).__name__}: {e}") from e
    if supported is not None:
        why = supported.why_unsupported(module_version(mod, supported.distribution))
        if why:
            raise BackendBroken(why)
    return mod, None
