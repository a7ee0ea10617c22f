"""A backend's kernel library: the releases its glue supports (a range, and the releases tested),
and whether it is here: absent (a skip reason), usable, or installed but broken (an error).

A library that is not installed is a fact about the machine: the backend's tests skip, saying so.
One that is installed but fails to import, or at a version outside the range, must not look the
same, or a GPU runner with a broken install or an untested release runs green: `import_library`
raises BackendBroken, so the backend's tests error with the import error or version message and
`list` shows it broken. Inside the range a library must work: a difference between releases in it
is named in the library's versions module (flashinfer_versions.py, flash_attn_versions.py), and the
glue handles it there. `list` and the report show each library's version and whether it is in the
range (`describe`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.backends.base import BackendBroken


@dataclass(frozen=True, kw_only=True)
class SupportedRange:
    """`lowest` <= version < `below`; `tested`: the releases the GPU suite ran on; `why_lowest`: what
    the releases before `lowest` lack that the glue needs."""

    distribution: str  # the pip name, e.g. flashinfer-python
    module: str  # the import name, e.g. flashinfer
    lowest: str
    below: str
    tested: tuple[str, ...]
    why_lowest: str

    @property
    def spec(self) -> str:
        """The pip requirement of this range, e.g. 'flashinfer-python>=0.6.16,<0.8'."""
        return f"{self.distribution}>={self.lowest},<{self.below}"

    def contains(self, version: str) -> bool:
        try:
            v = Version(version)
        except InvalidVersion:
            return False
        return Version(self.lowest) <= v < Version(self.below)

    def why_unsupported(self, version: str) -> str | None:
        """None inside the range; else the one-line message of the BackendBroken it raises."""
        if self.contains(version):
            return None
        return (
            f"{self.module} {version} is installed; this glue supports {self.spec} "
            f"(tested on {', '.join(self.tested)}); before {self.lowest}: {self.why_lowest}"
        )

    def status(self, version: str) -> str:
        """'tested', 'in range (untested)' or 'outside >=lo,<hi': what `list` and the report print."""
        if version in self.tested:
            return "tested"
        if self.contains(version):
            return "in range (untested)"
        return f"outside >={self.lowest},<{self.below}"


@cache
def distribution_version(name: str) -> str | None:
    """The installed version of a pip distribution, from its metadata (imports nothing); None if absent.
    Read once per process: a metadata lookup parses the distribution's METADATA file (about 1 ms on
    the H100 host), and FA4's glue needs the version on every case (its module reports '0.0.0')."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@cache
def pinned_requirement(distribution: str, dependency: str) -> Requirement | None:
    """The installed `distribution`'s own requirement on `dependency` (its metadata's Requires-Dist
    outside any extra), or None where either is absent: what release of a library an engine release
    was built against. Read once per process, as distribution_version (asked on every graph replay)."""
    try:
        lines = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for line in lines:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(dependency) and "extra" not in str(req.marker):
            return req
    return None


def module_version(mod: ModuleType, distribution: str) -> str:
    """The version an imported library reports: its `__version__`, or, where that is missing or the
    placeholder '0.0.0' (flash-attn-4's `flash_attn.cute` asks metadata for 'fa4', which no
    distribution is called), its distribution's metadata; 'unknown' when neither says."""
    found = getattr(mod, "__version__", None)
    if found and found != "0.0.0":
        return str(found)
    return distribution_version(distribution) or "unknown"


def installed_version(rng: SupportedRange) -> str | None:
    """The library's version without importing it: the imported module's, where it is imported (a
    test's fake included), else its distribution's metadata; None where it is not installed."""
    mod = sys.modules.get(rng.module)
    if mod is not None:
        return module_version(mod, rng.distribution)
    return distribution_version(rng.distribution)


def describe(rng: SupportedRange, version: str | None) -> str:
    """'flashinfer-python 0.7.2.post1 (tested)', or '... not installed': a library's line in `list`."""
    if version is None:
        return f"{rng.distribution} not installed (supported: {rng.spec})"
    return f"{rng.distribution} {version} ({rng.status(version)})"


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
