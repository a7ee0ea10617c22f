"""A CUDA check's isolation worker, spawned as soon as its pytest process starts.

Each pytest process of a CUDA `check` sends its cases to an isolation worker (harness/run/
isolation.py): a spawned interpreter that imports torch and the harness before its first case. Spawned
on that first case, the worker's imports come after the pytest process's own imports and collection,
one after the other. `check` loads this module first (`-p harness.run.speed.prestart`, ahead of the
harness's plugin, which imports torch) with $ATTN_HARNESS_PRESTART=1, and importing it then spawns
the worker without waiting for it, so both processes import at once. Once ready, the worker also
loads the part's backends (their kernel libraries import) and creates its CUDA context (`warm`),
which its first case would otherwise pay for. The isolation layer takes that worker (`claim`) when
it makes its runner, if it was started for the same GPU; otherwise it is stopped and the runner
spawns its own, as without this module.

Importing this module costs only the standard library. The variable is removed as it is read, so
the worker and anything else the process starts later spawn nothing.
"""

from __future__ import annotations

import os

from harness.run.speed.settings import PRESTART_ENV
from harness.run.workers import Worker

OPTIONS = ("-p", "harness.run.speed.prestart")  # pytest's: load this module before any other plugin
# What an isolation worker imports before it reports ready: the checks its cases run.
PRELOAD = ("harness.checks.numeric", "harness.checks.replay")
_EARLY: list[Worker] = []  # the worker spawned at import, until claimed
_WARMED: list[str] = []  # in the worker: the backends `warm` loaded


def listed_gpus(listed: str) -> list[str]:
    """The entries of a CUDA_VISIBLE_DEVICES value; as CUDA does, they stop at a negative one (`-1`:
    no GPU) or an empty one."""
    out = []
    for entry in (g.strip() for g in listed.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def worker_env(gpu: str | None) -> dict[str, str]:
    """The variables an isolation worker pinned to `gpu` (None: not pinned) starts with."""
    return {} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu}


def start() -> Worker | None:
    """Spawn this process's isolation worker if $ATTN_HARNESS_PRESTART is 1 (and remove it): pinned
    to the first visible GPU, as the isolation layer pins a process outside pytest-xdist. Nothing
    under xdist or with no GPU visible."""
    if os.environ.pop(PRESTART_ENV, None) != "1" or os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = ["0"] if listed is None else listed_gpus(listed)  # unset: every GPU, the first is 0
    if not gpus:
        return None
    worker = Worker(env=worker_env(gpus[0]), preload=PRELOAD, warm=(warm, ()))
    worker.spawn()
    _EARLY.append(worker)
    return worker


def warm() -> None:
    """In the early worker, before its first case: load the backends its part checks (every backend
    when the part names none), so their libraries import, then create the CUDA context. Errors are
    left to the cases, which meet them again and report them."""
    import torch

    from harness import backends

    for name in backends.selected():
        try:
            backends.load(name).available("cuda")
        except Exception:  # noqa: BLE001 - a broken backend is its tests' error, not this one's
            continue
        _WARMED.append(name)
    torch.zeros(1, device="cuda")


def warmed() -> list[str]:
    """In a worker: the backends `warm` loaded before its first call."""
    return list(_WARMED)


def claim(env: dict[str, str]) -> Worker | None:
    """The worker spawned at import if it was started with `env`; one started with another is
    stopped. None when there is none (any more)."""
    if not _EARLY:
        return None
    worker = _EARLY.pop()
    if worker.env == env:
        return worker
    worker.stop(kill=True)
    return None


start()
