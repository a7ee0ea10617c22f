"""Host values onto a device without making the host wait for the GPU.

A copy from pageable host memory (`torch.tensor(values, device=...)`, `.to(device)` of a CPU tensor)
synchronises the stream: the host waits until the GPU has run everything queued before it. Beside
other processes on the same GPU, each wait also sits out their time slices: on an H200 with 7 other
processes running model checks, a GPT-OSS check that synchronised 17,898 times took 21-23 s, and
2.9 s once it synchronised 1,310 times (docs/performance.md). Staged through pinned memory, the copy is
queued like a kernel and the host goes on; the caching host allocator keeps the pinned block until
the copy has run. On the CPU both are the plain copy.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(host: np.ndarray | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` (a numpy array or a CPU tensor) as a tensor on `device`, queued without a sync on CUDA.
    On the CPU a numpy array's tensor shares its memory."""
    t = _as_tensor(host)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, host: np.ndarray | torch.Tensor) -> None:
    """Overwrite `dst` with host values (same number of elements), queued without a sync on CUDA."""
    t = _as_tensor(host)
    if dst.device.type == "cuda":
        dst.copy_(t.pin_memory(), non_blocking=True)
    else:
        dst.copy_(t)


def _as_tensor(host: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(host) if isinstance(host, np.ndarray) else host


def settle(device: torch.device | str) -> None:
    """Wait until the device has run everything queued, so that a kernel's asynchronous fault (an
    illegal address) is raised here. The checks call it at the end of a backend's work, inside the
    block that makes a raise the backend's crash: no copy in the glue waits for the device any more,
    and a fault would otherwise surface later, in the references' code, as the harness's own error."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
