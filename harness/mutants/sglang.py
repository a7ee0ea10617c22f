"""sglang mutants: sglang's own attention backends, each subclassed to change one engine decision the way
a pull request to sglang could (the window not passed, the window's edge off by one, the request's
row of req_to_token taken from its place in the batch instead of req_pool_indices, a mask copied into
the wrong path). The adapter stays as it is; only the class it drives differs. sglang is imported
when a mutant runs, never when the catalogue is read.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.engines.sglang.flex import SglangFlex
from harness.backends.engines.sglang.torch_native import SglangTorchNative
from harness.mutants import Mutant, mutants_of

REQ_POOL_INDICES = 5  # the place of req_pool_indices among the _run_*_forward_* arguments of both backends


def _batch_rows(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The backend's arguments with req_pool_indices replaced by each request's place in the batch."""
    rows = args[REQ_POOL_INDICES]
    place = torch.arange(rows.numel(), device=rows.device)
    return (*args[:REQ_POOL_INDICES], place, *args[REQ_POOL_INDICES + 1 :])


class _NativeWindowNotPassed(SglangTorchNative):
    def backend_class(self) -> type:
        class WindowNotPassed(super().backend_class()):
            def _run_sdpa_forward_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
                kwargs["sliding_window_size"] = None
                return super()._run_sdpa_forward_extend(*args, **kwargs)

        return WindowNotPassed


class _NativeWindowShort(SglangTorchNative):
    def backend_class(self) -> type:
        class WindowShort(super().backend_class()):
            @staticmethod
            def _make_sliding_window_mask(
                *,
                q_len: int,
                kv_len: int,
                sliding_window_size: int,
                device: torch.device,
                query_offset: int = 0,
            ) -> torch.Tensor:
                q_pos = torch.arange(query_offset, query_offset + q_len, device=device).unsqueeze(1)
                k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
                return (k_pos <= q_pos) & (k_pos > q_pos - sliding_window_size)  # W keys, not W + 1

        return WindowShort


class _NativeRowByPlace(SglangTorchNative):
    def backend_class(self) -> type:
        class RowByPlace(super().backend_class()):
            def _run_sdpa_forward_decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
                return super()._run_sdpa_forward_decode(*_batch_rows(args), **kwargs)

        return RowByPlace


class _FlexDecodeCausal(SglangFlex):
    def backend_class(self) -> type:
        class DecodeCausal(super().backend_class()):
            @staticmethod
            def _decode_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
                return q_idx >= kv_idx  # the extend mask copied into decode: the query sees key 0 only

        return DecodeCausal


class _FlexCausalStrict(SglangFlex):
    def backend_class(self) -> type:
        class CausalStrict(super().backend_class()):
            @staticmethod
            def _causal_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
                return q_idx > kv_idx  # a query no longer sees its own key

        return CausalStrict


class _FlexRowByPlace(SglangFlex):
    def backend_class(self) -> type:
        class RowByPlace(super().backend_class()):
            def _run_flex_forward_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
                return super()._run_flex_forward_extend(*_batch_rows(args), **kwargs)

        return RowByPlace


# The window mutants are hunted at a window of 2: at 0 sglang itself reads no window (known issue
# sglang-window-zero), so a catch there would be the engine's bug, not the mutant's.
WINDOW_2 = {"window_left": 2}
_native = mutants_of("sglang_native")
_flex = mutants_of("sglang_flex")

MUTANTS: list[Mutant] = [
    _native(
        "window-not-passed",
        "forward_extend drops the layer's sliding_window_size: prefill attends over the whole prefix",
        "TorchNativeAttnBackend._run_sdpa_forward_extend",
        ("prefill",),
        True,
        _NativeWindowNotPassed,
        force=WINDOW_2,
    ),
    _native(
        "window-short",
        "the sliding-window mask keeps W keys instead of W + 1 (the window convention off by one)",
        "TorchNativeAttnBackend._make_sliding_window_mask",
        ("decode",),
        True,
        _NativeWindowShort,
        force=WINDOW_2,
    ),
    _native(
        "row-by-place",
        "decode reads req_to_token at the request's place in the batch, not at req_pool_indices",
        "TorchNativeAttnBackend._run_sdpa_forward_decode",
        ("decode",),
        False,
        _NativeRowByPlace,
    ),
    _flex(
        "decode-causal-mask",
        "decode's block mask is the extend mask (q_idx >= kv_idx): the one query sees key 0 only",
        "TorchFlexAttnBackend._decode_mask",
        ("decode",),
        False,
        _FlexDecodeCausal,
    ),
    _flex(
        "causal-strict",
        "the causal mask is q_idx > kv_idx: a query no longer sees its own key",
        "TorchFlexAttnBackend._causal_mask",
        ("prefill",),
        False,
        _FlexCausalStrict,
    ),
    _flex(
        "row-by-place",
        "extend reads req_to_token at the request's place in the batch, not at req_pool_indices",
        "TorchFlexAttnBackend._run_flex_forward_extend",
        ("prefix",),
        False,
        _FlexRowByPlace,
    ),
]
