"""The run's settings: one object, read from the environment once, where a process starts.

The ATTN_HARNESS_* variables are how one process tells the next how to run: `check` writes them
into each part's environment, the warm-up into its recording run's. A process reads them once
(`current()`, at its first use) and from then on the harness reads this object, never the
environment; a command that changes how it runs (`mutants --isolate`) sets it (`use`). The variables of
the compile caches are harness/run/cache_dir.py's: it points the libraries at them. Standard
library only: harness/run/speed/prestart.py imports this before torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

ISOLATE_ENV = "ATTN_HARNESS_ISOLATE"  # 1: isolate CPU cases too; 0: isolate nothing
TIMEOUT_ENV = "ATTN_HARNESS_CASE_TIMEOUT"  # seconds per case in an isolation worker
RECORD_ENV = "ATTN_HARNESS_RECORD"  # a file: record the drawn cases there, check none (record mode)
PROFILE_ENV = "ATTN_HARNESS_PROFILE"  # the hypothesis profile a suite process loads
REQUIRE_ENV = "ATTN_HARNESS_REQUIRE"  # backends `check` requires, comma-separated (as --require)
PRESTART_ENV = "ATTN_HARNESS_PRESTART"  # 1: spawn the isolation worker as the process starts
SHARD_ENV = "ATTN_HARNESS_SHARD"  # I/N: check the Ith of N CI shares (as check --shard)
DEFAULT_TIMEOUT = 120.0  # seconds per case
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How this process runs. `isolate` None: CUDA cases in a worker, CPU cases in-process."""

    isolate: bool | None = None
    case_timeout: float = DEFAULT_TIMEOUT
    record: str | None = None
    profile: str | None = None
    require: tuple[str, ...] = ()
    shard: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """The settings the variables in `environ` give (an unset or empty one: its default)."""
        flag = environ.get(ISOLATE_ENV, "").strip().lower()
        required = environ.get(REQUIRE_ENV, "").split(",")
        return cls(
            isolate=True if flag in TRUE else False if flag in FALSE else None,
            case_timeout=float(environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT),
            record=environ.get(RECORD_ENV) or None,
            profile=environ.get(PROFILE_ENV) or None,
            require=tuple(n.strip() for n in required if n.strip()),
            shard=environ.get(SHARD_ENV) or None,
        )

    def isolated(self, device: str) -> bool:
        """Whether cases on `device` run in an isolation worker."""
        return self.isolate if self.isolate is not None else device == "cuda"


_current: list[Settings] = []


def current() -> Settings:
    """This process's settings: read from the environment at the first call, unless set before."""
    if not _current:
        _current.append(Settings.from_env(os.environ))
    return _current[0]


def use(settings: Settings | None = None, **changes: object) -> Settings:
    """Make `settings` (default: the current ones) with `changes` this process's settings."""
    new = dataclasses.replace(settings or current(), **changes)
    _current[:] = [new]
    return new


def reset() -> None:
    """Forget the settings: the next `current()` reads the environment again (a test that changed it)."""
    _current.clear()
