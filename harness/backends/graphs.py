"""Capture and replay: torch.cuda.CUDAGraph on a GPU, an emulator with the same semantics on the CPU.

A graph records a forward once and replays it on whatever its buffers hold then. What a replay
cannot see is the point of the replay check: every Python value the forward used (a length, a
window, a split size) is frozen at capture, and only memory (buffers, static inputs) is read anew.

On CUDA (`CudaGraph`) the forward runs once on a side stream (warm-up, as engines do: lazy
allocations and kernel selection happen outside the capture), then is captured into a
`torch.cuda.CUDAGraph` in a memory pool shared by every captured size.

On the CPU (`EmulatedGraph`) the forward runs once (the warm-up) and then again under a
`TorchDispatchMode` that records every aten op with its arguments: tensors by identity, every other
value as it was (frozen). A replay re-executes the ops in order and copies each out-of-place result
into the tensor the op returned at capture (in-place ops and views mutate or alias their arguments
already), so the next op reads it where the captured one did. A host sync during capture raises, as
CUDA does (`aten._local_scalar_dense`: .item(), int(t), bool(t); nonzero and friends, whose output
size is data). `.tolist()` reads CPU memory without the dispatcher and is not seen on the CPU; the
adapters plan from host copies (Metadata.host) and a GPU run catches it.

A library kernel is an opaque node: a fake (tests/flashinfer_fake.py) wraps its kernel entry in
`kernel`, and during a capture the call is recorded as one node (tensors by identity, lists and
numbers frozen), its inner ops unrecorded; a replay calls it again on its recorded
arguments, so it reads the buffers' current contents, as a real kernel reads device memory. The
wrapped function must read only its arguments (a wrapper attribute read inside it would not be
frozen).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Ops that read device memory back on the host (or size their output from it): a CUDA capture fails.
HOST_SYNCS = {
    aten._local_scalar_dense: ".item() / int() / float() / bool() of a tensor",
    aten.nonzero: "nonzero (its output size is data)",
    aten.masked_select: "masked_select (its output size is data)",
    aten.equal: "torch.equal (a host bool)",
    aten.is_nonzero: "bool() of a tensor",
}


class GraphCaptureError(RuntimeError):
    """The forward did something a CUDA graph cannot capture (a host sync)."""


def _storages(tree: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}


def _frozen(tree: Any) -> Any:
    """What a capture freezes: the containers (lists, tuples, dicts) rebuilt, so a later change to
    one is not seen; their leaves kept as they are (tensors by identity, numbers are immutable)."""
    return pytree.tree_map(lambda x: x, tree)


@dataclass
class _Node:
    """One recorded step: an aten op or an opaque kernel, its frozen arguments, and the outputs of
    the capture into which a replay copies its results (None where an output aliases an argument)."""

    fn: Callable
    args: tuple
    kwargs: dict
    targets: list[torch.Tensor | None]

    def replay(self) -> None:
        out = self.fn(*self.args, **self.kwargs)
        for target, new in zip(self.targets, pytree.tree_leaves(out)):
            if target is not None:
                target.copy_(new)


def _node(fn: Callable, args: tuple, kwargs: dict, out: Any) -> _Node:
    inputs = _storages((args, kwargs))
    targets = [
        t if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs else None
        for t in pytree.tree_leaves(out)
    ]
    return _Node(fn, args, kwargs, targets)


class _Recorder(TorchDispatchMode):
    """Records every aten op of a capture; raises on a host sync; silent inside an opaque kernel."""

    def __init__(self, nodes: list[_Node]) -> None:
        super().__init__()
        self.nodes = nodes
        self.inside_kernel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if self.inside_kernel:
            return func(*args, **kwargs)
        why = HOST_SYNCS.get(func.overloadpacket)
        if why:
            raise GraphCaptureError(
                f"operation not permitted when stream is capturing: {func} ({why}) is a host sync"
            )
        out = func(*args, **kwargs)
        self.nodes.append(_node(func, _frozen(args), _frozen(kwargs), out))
        return out


_CAPTURING: list[_Recorder] = []  # the emulated capture in progress, if any


def kernel(fn: Callable) -> Callable:
    """Mark a library kernel entry: one opaque node of an emulated capture (see the module doc)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _CAPTURING:
            return fn(*args, **kwargs)
        rec = _CAPTURING[-1]
        args, kwargs = _frozen(args), _frozen(kwargs)
        rec.inside_kernel += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            rec.inside_kernel -= 1
        rec.nodes.append(_node(fn, args, kwargs, out))
        return out

    return run


class EmulatedGraph:
    """A CPU stand-in for torch.cuda.CUDAGraph with its semantics (module doc)."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []

    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Warm up, then record `forward`; returns its output tensor (what replays write)."""
        forward()
        recorder = _Recorder(self.nodes)
        _CAPTURING.append(recorder)
        try:
            with recorder:
                return forward()
        finally:
            _CAPTURING.pop()

    def replay(self) -> None:
        for node in self.nodes:
            node.replay()


class CudaGraph:
    """torch.cuda.CUDAGraph: a warm-up on a side stream, then the capture into the shared pool."""

    def __init__(self, pool: Any) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            return forward()

    def replay(self) -> None:
        self.graph.replay()


class GraphFactory:
    """New graphs for one device; on CUDA they share one memory pool, as an engine's captured sizes do."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None

    def new(self) -> CudaGraph | EmulatedGraph:
        return CudaGraph(self.pool) if self.cuda else EmulatedGraph()
