"""First contact of the CUDA sglang adapters with a GPU: each adapter is built, then one small decode, one
small extend (with a cached prefix), a verify chain, a verify tree and a draft extend run against the
reference, through the harness's own check_case; then, for each mode the adapter captures, sglang's
CUDA-graph path replays a sequence of batches through the harness's replay check (sizes 1, 2 and 4
captured; a batch of 3 padded to 4, then batches of 1 and 2), each replay judged against the reference.
Every failure prints its step (capture, or replay i) and its full traceback, and the smoke goes on, so
a single try on a GPU machine says as much as it can.

    python engines/sglang-gpu-smoke.py [ADAPTER ...]     # default: sglang_flashinfer sglang_fa3

Exit status 0 when every case passes, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's harness first

from harness.api import Case, Request, check_case  # noqa: E402 - after the path
from harness.checks.replay import replay_result  # noqa: E402
from harness.core.graph_case import GraphCase  # noqa: E402
from harness.tools.engine_smoke import ready_adapter, show, step  # noqa: E402

ADAPTERS = ("sglang_flashinfer", "sglang_fa3")
CASES = {
    "decode": Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16),
    "extend": Case(mode="EXTEND", requests=(Request(19, 6), Request(0, 9)), page_size=16),
    "verify chain": Case(
        mode="TARGET_VERIFY",
        requests=(Request(21, 3, tree=(-1, 0, 1)), Request(4, 3, tree=(-1, 0, 1))),
        page_size=16,
    ),
    "verify tree": Case(
        mode="TARGET_VERIFY",
        requests=(Request(21, 4, tree=(-1, 0, 0, 1)), Request(4, 4, tree=(-1, 0, 0, 1))),
        page_size=16,
    ),
    "draft extend": Case(mode="DRAFT_EXTEND_V2", requests=(Request(21, 3), Request(4, 3)), page_size=16),
}


def graph_sequence(mode: str, queries: int, tree: tuple[int, ...] | None = None, **layer: int) -> GraphCase:
    """Three batches of one layer: 3 requests (replayed padded to 4), then 1, then 2."""

    def batch(prefixes: tuple[int, ...], seed: int) -> Case:
        reqs = tuple(Request(p, queries, tree=tree) for p in prefixes)
        return Case(mode=mode, requests=reqs, page_size=16, seed=seed, **layer)

    return GraphCase((batch((37, 5, 20), 0), batch((9,), 1), batch((50, 2), 2)), max_batch=3, max_kv=96)


GRAPHS = {
    "graph decode": graph_sequence("DECODE", 1),
    "graph decode, window 8": graph_sequence("DECODE", 1, window_left=8),
    "graph verify chain": graph_sequence("TARGET_VERIFY", 3, (-1, 0, 1)),
    "graph verify tree": graph_sequence("TARGET_VERIFY", 4, (-1, 0, 0, 1)),
    "graph draft extend": graph_sequence("DRAFT_EXTEND_V2", 3),
}


def smoke_graphs(backend) -> bool:  # noqa: ANN001 - a harness Backend
    """Replay each sequence of a mode the adapter captures; print each outcome; True when all passed."""
    ok = True
    for label, g in GRAPHS.items():
        ran, result = step(label, lambda g=g: replay_result(backend, g, "cuda"))
        if ran:
            show(label, result)
        ok = ok and ran and result.status in ("pass", "skip")
    return ok


def smoke(name: str) -> bool:
    """Build the adapter and run each case; print what happened; True when everything passed."""
    backend = ready_adapter(name, "cuda")
    if backend is None:
        return False
    ok = True
    for label, case in CASES.items():
        ran, result = step(label, lambda case=case: check_case(backend, case, "cuda"))
        if ran:
            show(label, result)
        ok = ok and ran and result.status == "pass"
    return smoke_graphs(backend) and ok


def main(argv: list[str]) -> int:
    results = [smoke(name) for name in (argv or ADAPTERS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
