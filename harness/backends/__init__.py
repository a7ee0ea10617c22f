"""The backend registry: built-in adapters, entry-point plugins, and `module:factory` specs.

Built-in: every module in this package (but base) exports `BACKENDS`, a dict of name -> factory;
so does every engine adapter module under harness/backends/engines (`engines.base.engine_backends`).
Importing such a module must not import its kernel library (that happens lazily, so a missing
library is a reason from `available`, not an ImportError; an installed one that fails to import
raises BackendBroken from `available`). External backends plug in through the
entry-point group `attn_harness.backends` (name -> factory) or on the command line as
`--backend package.module:factory`; a factory returns a Backend.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from harness.backends.base import Backend, BackendBroken, BackendOutput, Capabilities, contract_problem

# Comma-separated backend names or module:factory specs; set by `python -m harness check --backend`.
BACKENDS_ENV = "ATTN_HARNESS_BACKENDS"

__all__ = [
    "Backend",
    "BackendBroken",
    "BackendOutput",
    "Capabilities",
    "BackendError",
    "load",
    "names",
    "all_backends",
]

FIRST = "torch_native"  # listed first: the backend every machine has

ENTRY_POINT_GROUP = "attn_harness.backends"


class BackendError(LookupError):
    """An unknown or broken backend name; the message lists what is known."""


@cache
def builtin() -> dict[str, Callable[[], Backend]]:
    """name -> factory, from every adapter module of this package."""
    found: dict[str, Callable[[], Backend]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in ("base", "engines"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, factory in getattr(module, "BACKENDS", {}).items():
            if name in found:
                raise BackendError(f"backend name {name!r} is declared twice ({info.name})")
            found[name] = factory
    from harness.backends.engines.base import engine_backends  # the engines' adapters, lazily

    for name, factory in engine_backends().items():
        if name in found:
            raise BackendError(f"backend name {name!r} is declared twice (harness.backends.engines)")
        found[name] = factory
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != FIRST, kv[0])))


def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Built-in backend names, then plugin names."""
    known = builtin()
    return list(known) + sorted(n for n in _plugins() if n not in known)


def selected() -> list[str]:
    """The backends a suite run checks: those named in $ATTN_HARNESS_BACKENDS, else every one."""
    chosen = [n.strip() for n in os.environ.get(BACKENDS_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(chosen)) or names()  # a backend named twice is checked once


def _from_spec(spec: str, what: str) -> Backend:
    """The backend the factory `spec` (module:factory) makes; `what` names it in a BackendError's one
    line (import failure, factory failure, or the contract broken)."""
    module, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception as e:  # ImportError, AttributeError, or whatever the module raises on import
        raise BackendError(
            f"cannot load {what}: {type(e).__name__}: {_first_line(e)} (it must name an importable "
            f'module:factory that returns a harness Backend: docs/backends.md, "Registering a plugin")'
        ) from None
    try:
        backend = obj() if callable(obj) else obj
    except Exception as e:  # a plugin's own failure: one line naming the spec, not a traceback
        raise BackendError(f"{what}: its factory raised {type(e).__name__}: {_first_line(e)}") from None
    problem = contract_problem(backend)
    if problem:
        raise BackendError(f'{what}: {problem} (docs/backends.md, "The contract")')
    return backend


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0]


def _plugin_label(name: str, ep: EntryPoint) -> str:
    """How an error names an entry-point plugin: its name, the entry point and the distribution
    that registers it."""
    dist = f", registered by {ep.dist.name} {ep.dist.version}" if ep.dist is not None else ""
    return f"backend plugin {name!r} (entry point {ep.name} = {ep.value} in {ENTRY_POINT_GROUP}{dist})"


def load(name: str) -> Backend:
    """A backend by registry name, plugin name, or `module:factory`."""
    known = builtin()
    if name in known:
        return known[name]()
    plugins = _plugins()
    if name in plugins or ":" in name:
        if name in plugins:
            backend = _from_spec(plugins[name].value, _plugin_label(name, plugins[name]))
        else:
            backend = _from_spec(name, f"backend {name!r}")
        # Named as it was asked for (entry-point name or spec), whatever its class says, so a report's
        # rows and its repro command name the backend that `load` finds again.
        backend.name = name
        return backend
    raise BackendError(f"unknown backend {name!r}; known: {', '.join(names())} (or give module:factory)")


def all_backends() -> list[Backend]:
    return [load(n) for n in names()]
