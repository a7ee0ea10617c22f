"""The bench's op counts: torch operations and host syncs per check phase (harness/core/timing.py).

A small check on a GPU is bound by launches (several microseconds each) and by the host waiting for
the device, not by arithmetic, so these counts say where a check's time goes on any machine, the CPU
included. Counted in a pass of its own (the counting slows every operation down):
- ops: every aten operation dispatched (torch's dispatch mode): about one launch each on a GPU, and
  host dispatch time on every device (a library calling its kernels through its own bindings, not
  torch's dispatcher, launches kernels this does not see: FlashInfer's, in `kernel` and `plan`);
- syncs: reads of a tensor's values by the host: `_local_scalar_dense` (item, float, int, bool,
  index), operations whose output shape depends on the values (nonzero, a boolean index, ...) and
  device-to-host copies (tolist, cpu). On a GPU only reads of device tensors count, each a wait for
  the device, and so do uploads from pageable host memory (CUDA waits for the stream before one). On
  the CPU every read counts (tolist and numpy of host tensors included, which on a GPU may be
  host-side data and cost no wait): an upper bound, comparable between two versions of the code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.backends.base import Backend
from harness.checks.numeric import check_case
from harness.core import timing
from harness.core.case import Case

OTHER = "other"  # ops outside every phase (availability and support checks, the result record)
aten = torch.ops.aten
# Operations that read values back on every device: a scalar, or an output sized by the values.
VALUE_READS = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.equal.default,
        aten._unique2.default,
        aten.unique_consecutive.default,
        aten.unique_dim.default,
    }
)
BOOL_INDEXED = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default})
COPIES = frozenset({aten._to_copy.default, aten.copy_.default})
HOST_READS = ("tolist", "numpy")  # no aten operation on a CPU tensor: counted where they are called


class Counter(timing.Recorder):
    """Ops and syncs per phase name: a Recorder that keeps the open phases, not their time."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.on_gpu = torch.device(device).type != "cpu"
        self.ops: dict[str, int] = defaultdict(int)
        self.syncs: dict[str, int] = defaultdict(int)

    def _switch(self, to: str | None) -> None:
        if to is None:
            self._stack.pop()
        else:
            self._stack.append(to)

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else OTHER

    def is_sync(self, func, args: tuple, kwargs: dict) -> bool:  # noqa: ANN001 - an aten overload
        """Whether an aten operation reads values back (on a GPU: from a device tensor)."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        on_device = [t for t in tensors if t.device.type != "cpu"] if self.on_gpu else tensors
        if func in COPIES:  # between the host and the device: a download, or an upload from pageable memory
            dest = args[0] if func is aten.copy_.default else kwargs.get("device")
            src = args[1] if func is aten.copy_.default else args[0]
            if dest is None or not self.on_gpu:
                return False
            to_host = torch.device(getattr(dest, "device", dest)).type == "cpu"
            from_host = src.device.type == "cpu"
            return (not from_host and to_host) or (from_host and not to_host and not src.is_pinned())
        if not on_device:
            return False
        if func in VALUE_READS:
            return True
        if func in BOOL_INDEXED:
            indices = args[1] if len(args) > 1 else []
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        return False


class _Ops(TorchDispatchMode):
    """Counts each aten operation. A higher-order operator (flex_attention's) counts as one, as a
    library kernel does: without the flag it has no rule for this mode and raises, so every flex case
    crashed while counted and its reference and compare went uncounted."""

    supports_higher_order_operators = True

    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        c = self.counter
        c.ops[c.current] += 1
        c.syncs[c.current] += c.is_sync(func, args, kwargs)
        return func(*args, **kwargs)


class _HostReads(TorchFunctionMode):
    """tolist and numpy of a CPU tensor dispatch nothing: counted here, on the CPU only."""

    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if getattr(func, "__name__", "") in HOST_READS and args and args[0].device.type == "cpu":
            self.counter.syncs[self.counter.current] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(device: str) -> Iterator[Counter]:
    """Count the enclosed code's ops and syncs per phase (not re-entrant, like timing.recording)."""
    counter = Counter(device)
    with timing.recording(counter), _Ops(counter):
        if counter.on_gpu:
            yield counter
        else:
            with _HostReads(counter):
                yield counter


def count_cases(
    backend: Backend, device: str, cases: list[Case], statuses: list[str]
) -> tuple[dict, dict, str]:
    """(ops, syncs) per checked case, per phase name (and `other`), over one pass of `cases`, and ""; or
    ({}, {}, why) when a case ends otherwise than in the timed pass (`statuses`): counting broke it,
    and its phases after the break would go uncounted."""
    checked = 0
    with counting(device) as counter:
        for i, (c, timed) in enumerate(zip(cases, statuses, strict=True)):
            res = check_case(backend, c, device)
            if res.status != timed:
                why = (res.reason.splitlines() or [""])[0][:300]
                return {}, {}, f"case {i} ({c.mode}) was {timed} when timed, {res.status} when counted: {why}"
            checked += res.status != "skip"
    n = max(checked, 1)
    return (
        {p: k / n for p, k in sorted(counter.ops.items())},
        {p: k / n for p, k in sorted(counter.syncs.items())},
        "",
    )
