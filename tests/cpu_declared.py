"""Real adapters declared runnable on the CPU, for `module:factory` specs (`--backend
tests.cpu_declared:fa2`): their library availability is then probed on this CUDA-less machine, as on
a GPU runner, in this process or in the pytest process a `check` starts."""

from __future__ import annotations

import dataclasses

from harness.backends import Backend, load


def _on_cpu(name: str) -> Backend:
    backend = load(name)
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu"}))
    return backend


def fa2() -> Backend:
    return _on_cpu("fa2")


def flashinfer_paged() -> Backend:
    return _on_cpu("flashinfer_paged")
