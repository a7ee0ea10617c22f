"""A CPU backend with variant keys, for `module:factory` specs (`tests.variant_keyed:native`): the
torch_native adapter keyed by dtype and batch size (both vary in every profile), so its shards split by
variant (harness/run/speed/variant_shards.py) as flex_compiled's do on a GPU."""

from __future__ import annotations

from harness.backends.torch_native import TorchNative
from harness.core.case import Case
from harness.core.graph_case import GraphCase


class KeyedNative(TorchNative):
    def variant_key(self, case: Case | GraphCase) -> tuple:
        layer = case.layer if isinstance(case, GraphCase) else case
        return (layer.dtype, len(layer.requests))


def native() -> KeyedNative:
    return KeyedNative()
