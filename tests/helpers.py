"""Small builders shared by the self-tests."""

import dataclasses
import signal
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

from harness.backends.torch_native import TorchNative
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request


def sigint_as_in_a_terminal() -> None:
    """A child's SIGINT back to its default (Popen's preexec_fn): a shell that starts a job in the
    background without job control (CI runners, `make test &`) leaves SIGINT ignored for every
    process below it, and an interrupt test's Ctrl-C would then do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def case(mode="EXTEND", reqs=((3, 4),), **kw) -> Case:
    """A Case from (prefix, extend[, encoder[, tree]]) tuples."""
    return Case(mode=mode, requests=tuple(Request(*r) for r in reqs), **kw)


def batch_of(c: Case, whole_page_loads: bool = False):
    return build_batch(c, make_inputs(c), "cpu", whole_page_loads)


class AtenOps(TorchDispatchMode):
    """Records the name of every aten operation dispatched under it (`with AtenOps() as ops:`)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


class IdleGate:
    """A stand-in for harness/run/warm_gate.WarmGate in tests that fake a CUDA machine: it compiles
    nothing and opens at once. `made` lists the (profile, backends) of every gate constructed."""

    made: list[tuple[str, list[str]]] = []
    seconds: float | None = None

    def __init__(self, libraries, profile, jobs, backends, say) -> None:  # noqa: ANN001
        IdleGate.made.append((profile, list(backends)))

    def start(self) -> None:
        pass

    def ready(self, backend: str) -> bool:
        return True

    def nice(self) -> int:
        return 0

    def compiled(self) -> int:
        return 0

    def join(self) -> list[str]:
        return []


def fresh_cache(monkeypatch, tmp_path) -> Path:  # noqa: ANN001 - pytest's fixtures
    """A fresh cache directory for one test (harness/run/cache_dir.py), the environment restored
    afterwards: the `cache` fixture of the warm-up's tests."""
    from harness.run import cache_dir

    for name in (cache_dir.ENV, cache_dir.OWNED_ENV, *(v for _, v, _ in cache_dir.LIBRARIES)):
        monkeypatch.delenv(name, raising=False)
    cache_dir.apply(str(tmp_path / "cache"))
    return tmp_path / "cache"


class AttendsOverACopy(TorchNative):
    """torch_native writing and attending over its own copy of the pool, as an engine adapter's cache
    made per run: right within a forward, but the batch's pool never gets this forward's K/V."""

    def run(self, batch):
        own = dataclasses.replace(batch.pool, k=batch.pool.k.clone(), v=batch.pool.v.clone())
        return super().run(dataclasses.replace(batch, pool=own))
