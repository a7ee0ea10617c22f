"""First contact of the CUDA vLLM adapters' graph path with a GPU: per adapter, an eager decode and extend
through the harness's check_case, then vLLM's own CUDA-graph path step by step (the graph state with
vLLM's config, layer and metadata builder; the capture of sizes 2 and 1; each replay of a real batch,
compared with the reference), then the harness's replay check over the same sequence (bitwise against
the eager run for the deterministic one).
Every step prints its name; every failure its full traceback, and the next step runs anyway, so a
single try on a GPU machine says as much as it can.

    python engines/vllm-gpu-smoke.py [ADAPTER ...]     # default: vllm_flash_attn vllm_flashinfer

Exit status 0 when every step passes, 1 otherwise.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's harness first

from harness.api import Case, Request, check_case  # noqa: E402 - after the path
from harness.checks.numeric import REFERENCES  # noqa: E402
from harness.checks.replay import GraphRunner, limits_of, replay_result  # noqa: E402
from harness.core.batch import build_batch, make_inputs  # noqa: E402
from harness.core.compare import compare  # noqa: E402
from harness.core.graph_case import GraphCase  # noqa: E402
from harness.tools.engine_smoke import ready_adapter, show, step  # noqa: E402
from references.torch_ref import references  # noqa: E402

ADAPTERS = ("vllm_flash_attn", "vllm_flashinfer")
DEVICE = "cuda"
EAGER = {
    "decode": Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16),
    "extend": Case(mode="EXTEND", requests=(Request(19, 6), Request(0, 9)), page_size=16),
}
CHAIN = (-1, 0, 1)
# Each replays a batch of 2 (at captured size 2), then one of 1 (at size 1), then 2 again.
GRAPHS = {
    "graph decode": GraphCase(
        (
            Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16),
            Case(mode="DECODE", requests=(Request(60, 1),), page_size=16, seed=1),
            Case(mode="DECODE", requests=(Request(3, 1), Request(50, 1)), page_size=16, seed=2),
        ),
        max_batch=2,
        max_kv=64,
    ),
    "graph decode window": GraphCase(
        (
            Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16, window_left=9),
            Case(mode="DECODE", requests=(Request(60, 1),), page_size=16, window_left=9, seed=1),
        ),
        max_batch=2,
        max_kv=64,
    ),
    "graph decode deterministic": GraphCase(
        (
            Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16, deterministic=True),
            Case(mode="DECODE", requests=(Request(60, 1),), page_size=16, deterministic=True, seed=1),
        ),
        max_batch=2,
        max_kv=64,
    ),
    "graph verify chain": GraphCase(
        (
            Case(
                mode="TARGET_VERIFY",
                requests=(Request(21, 3, tree=CHAIN), Request(4, 3, tree=CHAIN)),
                page_size=16,
            ),
            Case(mode="TARGET_VERIFY", requests=(Request(40, 3, tree=CHAIN),), page_size=16, seed=1),
        ),
        max_batch=2,
        max_kv=64,
    ),
}


def eager(backend: object, label: str, case: Case) -> bool:
    ok, result = step(label, lambda: check_case(backend, case, DEVICE))
    if ok:
        show(label, result)
    return ok and result.status == "pass"


def graph(backend: object, label: str, g: GraphCase) -> bool:
    """vLLM's graph path step by step, then the harness's replay check of the same sequence."""
    why = backend.capabilities.graph_reason(g.mode) or next(
        filter(None, map(backend.supports, g.batches)), None
    )
    if why is not None:
        print(f"   {label}: not declared: {why}")
        return True
    inputs = [make_inputs(c, DEVICE) for c in g.batches]
    batches = [
        build_batch(c, i, DEVICE, backend.capabilities.whole_page_loads) for c, i in zip(g.batches, inputs)
    ]
    ok, runner = step(
        f"{label}: graph state (vLLM config, layer, builder, buffers)",
        lambda: GraphRunner(backend, limits_of(g), batches),
    )
    if not ok:
        return False
    config = getattr(runner.state, "config", None)
    mode = config.compilation_config.cudagraph_mode.name if config is not None else "-"
    builder = type(getattr(runner.state, "builder", None)).__name__
    print(f"   {label}: builder {builder}, sizes {runner.sizes}, cudagraph_mode {mode}")
    captured = True
    for bs in sorted(runner.sizes, reverse=True):

        def capture(bs: int = bs) -> None:
            backend.capture_metadata(runner.state, bs)
            graph = runner.factory.new()
            forward = functools.partial(backend.graph_forward, runner.state, runner.static(bs))
            runner.outputs[bs] = graph.capture(forward)
            runner.graphs[bs] = graph

        captured &= step(f"{label}: capture size {bs}", capture)[0]
    passed = captured
    if captured:
        for at, (case, batch, inp) in enumerate(zip(g.batches, batches, inputs)):
            ok, replayed = step(
                f"{label}: replay {at} ({case.batch_size} requests)", lambda b=batch: runner.replay(b)
            )
            if not ok:
                passed = False
                continue
            bs, out = replayed
            exact, native, *rounded = references(case, inp, REFERENCES[case.kv_dtype is not None], DEVICE)
            more = {"ref_rounded_kv": rounded[0].out} if rounded else {}
            v = compare(case, out, exact.out, native.out, None, None, None, **more)
            print(
                f"   {label}: replay {at} at size {bs}: {'pass' if v.passed else 'FAIL'}, "
                f"error {v.err:.3g} (budget {v.budget:.3g}){'' if v.passed else ': ' + v.reason}"
            )
            passed &= v.passed
    ok, result = step(f"{label}: replay check", lambda: replay_result(backend, g, DEVICE))
    if ok:
        show(f"{label}: replay check", result)
    return passed and ok and result.status == "pass"


def smoke(name: str) -> bool:
    """Build the adapter, run each eager case and each graph sequence; True when everything passed."""
    backend = ready_adapter(name, DEVICE)
    if backend is None:
        return False
    print(f"   graph modes {', '.join(sorted(map(str, backend.capabilities.graph_modes)))}")
    results = [eager(backend, label, case) for label, case in EAGER.items()]
    results += [graph(backend, label, g) for label, g in GRAPHS.items()]
    return all(results)


def main(argv: list[str]) -> int:
    results = [smoke(name) for name in (argv or ADAPTERS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
