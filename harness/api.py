"""The harness's public surface for a backend plugin: import from here, not from the modules behind it.

What a plugin needs to write an adapter (Backend, Capabilities, BackendOutput, BackendBroken, the
shared engine glue), to read one forward (Batch and its Metadata, the Case and its Requests, the
modes, the paged pool), to find itself in the registry (load, names, the entry-point group, the
environment variable a plain pytest run reads), and to check a case directly (check_case, the
catalogue of named batches). Names here keep their meaning across releases; a move behind them
is not a break. docs/backends.md is the guide.
"""

from __future__ import annotations

from harness.backends import BACKENDS_ENV, ENTRY_POINT_GROUP, BackendError, load, names
from harness.backends.base import ALL_CAPABILITIES, Backend, BackendBroken, BackendOutput, Capabilities
from harness.backends.glue import EngineGlue, dequantized
from harness.backends.versions import import_library
from harness.checks.declarations import refused_declarations
from harness.checks.numeric import check_case
from harness.core.batch import Batch, Inputs, build_batch, make_inputs
from harness.core.case import Case, CaseError, Request
from harness.core.compare import Verdict
from harness.core.metadata import Metadata
from harness.core.modes import Mode, kv_extent
from harness.core.pool import PagedPool, translate_slots
from harness.core.results import CaseResult
from harness.search import catalogue

__all__ = [
    "ALL_CAPABILITIES",
    "BACKENDS_ENV",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendBroken",
    "BackendError",
    "BackendOutput",
    "Batch",
    "Capabilities",
    "Case",
    "CaseError",
    "CaseResult",
    "EngineGlue",
    "Inputs",
    "Metadata",
    "Mode",
    "PagedPool",
    "Request",
    "Verdict",
    "build_batch",
    "catalogue",
    "check_case",
    "dequantized",
    "import_library",
    "kv_extent",
    "load",
    "make_inputs",
    "names",
    "refused_declarations",
    "translate_slots",
]
