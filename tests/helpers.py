"""Small builders shared by the self-tests."""

from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request


def case(mode="EXTEND", reqs=((3, 4),), **kw) -> Case:
    """A Case from (prefix, extend[, encoder[, tree]]) tuples."""
    return Case(mode=mode, requests=tuple(Request(*r) for r in reqs), **kw)


def batch_of(c: Case, whole_page_loads: bool = False):
    return build_batch(c, make_inputs(c), "cpu", whole_page_loads)


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
