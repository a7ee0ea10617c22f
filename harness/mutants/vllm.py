"""vLLM engine mutants: vLLM's own attention classes with one engine decision changed, as a PR would.

Each mutant is an engine adapter whose `backend_class` returns a subclass of vLLM's backend whose
metadata builder or implementation is a subclass of vLLM's own, changing one decision (the window
not passed to the kernel, the extent read from the wrong field, a decoder batch built non-causal,
the soft cap dropped). vLLM is imported only when a mutant runs, so the catalogue loads without it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from harness.backends.engines.vllm.cpu_attn import VllmCpuAttn
from harness.backends.engines.vllm.flex_attention import VllmFlex
from harness.mutants import Mutant, mutants_of

# The arguments vLLM's Attention layer passes its implementation class, in order.
IMPL_ARGUMENTS = (
    "num_heads",
    "head_size",
    "scale",
    "num_kv_heads",
    "alibi_slopes",
    "sliding_window",
    "kv_cache_dtype",
    "logits_soft_cap",
    "attn_type",
    "kv_sharing_target_layer_name",
)


def _with(base: type, builder: type | None = None, impl: type | None = None) -> type:
    """A subclass of vLLM backend `base` whose builder and/or implementation are the given subclasses."""
    overrides: dict[str, Any] = {}
    if builder is not None:
        overrides["get_builder_cls"] = staticmethod(lambda: builder)
    if impl is not None:
        overrides["get_impl_cls"] = staticmethod(lambda: impl)
    return type(f"Mutated{base.__name__}", (base,), overrides)


def _impl_without(base: type, argument: str) -> type:
    """vLLM's implementation class `base` built as if its layer never passed `argument` (None)."""

    class Impl(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(zip(IMPL_ARGUMENTS, args))
            kwargs[argument] = None
            super().__init__(**kwargs)

    return Impl


def _builder_with(base: type, change: str) -> type:
    """vLLM's metadata builder `base` building over a CommonAttentionMetadata with one field changed:
    `computed_extent` (seq_lens read as the tokens computed before the step) or `noncausal`."""

    class Builder(base):
        def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
            m = common_attn_metadata
            if change == "computed_extent":
                m = m.replace(seq_lens=m.compute_num_computed_tokens())
            elif change == "noncausal":
                m = m.replace(causal=False)
            return super().build(common_prefix_len, m, fast_build)

    return Builder


@cache
def _cpu(kind: str) -> type:
    from vllm.v1.attention.backends import cpu_attn

    backend, builder, impl = (
        cpu_attn.CPUAttentionBackend,
        cpu_attn.CPUAttentionMetadataBuilder,
        cpu_attn.CPUAttentionBackendImpl,
    )
    if kind in ("sliding_window", "logits_soft_cap"):
        return _with(backend, impl=_impl_without(impl, kind))
    return _with(backend, builder=_builder_with(builder, kind))


@cache
def _flex(kind: str) -> type:
    from vllm.v1.attention.backends import flex_attention

    backend, builder, impl = (
        flex_attention.FlexAttentionBackend,
        flex_attention.FlexAttentionMetadataBuilder,
        flex_attention.FlexAttentionImpl,
    )
    if kind == "sliding_window":
        return _with(backend, impl=_impl_without(impl, kind))
    return _with(backend, builder=_builder_with(builder, kind))


class _CpuWindowNotPassed(VllmCpuAttn):
    def backend_class(self) -> type:
        return _cpu("sliding_window")


class _CpuSoftCapNotPassed(VllmCpuAttn):
    def backend_class(self) -> type:
        return _cpu("logits_soft_cap")


class _CpuExtentFromComputed(VllmCpuAttn):
    def backend_class(self) -> type:
        return _cpu("computed_extent")


class _CpuDecoderNonCausal(VllmCpuAttn):
    def backend_class(self) -> type:
        return _cpu("noncausal")


class _FlexWindowNotPassed(VllmFlex):
    def backend_class(self) -> type:
        return _flex("sliding_window")


class _FlexExtentFromComputed(VllmFlex):
    def backend_class(self) -> type:
        return _flex("computed_extent")


class _FlexDecoderNonCausal(VllmFlex):
    def backend_class(self) -> type:
        return _flex("noncausal")


_cpu_m = mutants_of("vllm_cpu_attn")
_flex_m = mutants_of("vllm_flex")

MUTANTS: list[Mutant] = [
    _cpu_m(
        "window_not_passed",
        "CPUAttentionBackendImpl built without the layer's sliding_window: the kernel sees every key",
        "backend_class",
        ("decode", "prefix"),
        True,
        _CpuWindowNotPassed,
    ),
    _cpu_m(
        "soft_cap_not_passed",
        "CPUAttentionBackendImpl built without the layer's logits_soft_cap",
        "backend_class",
        ("prefill", "decode"),
        False,
        _CpuSoftCapNotPassed,
    ),
    _cpu_m(
        "extent_from_computed",
        "CPUAttentionMetadataBuilder reads each request's extent from the tokens computed before the "
        "step: the step's own new keys are not attended",
        "backend_class",
        ("decode", "prefix"),
        False,
        _CpuExtentFromComputed,
    ),
    _cpu_m(
        "decoder_noncausal",
        "CPUAttentionMetadataBuilder builds a decoder batch non-causal (the encoder's flag taken for it)",
        "backend_class",
        ("prefill", "prefix"),
        False,
        _CpuDecoderNonCausal,
    ),
    _flex_m(
        "window_not_passed",
        "FlexAttentionImpl built without the layer's sliding_window: no window term in the block mask",
        "backend_class",
        ("decode", "prefix"),
        True,
        _FlexWindowNotPassed,
    ),
    _flex_m(
        "extent_from_computed",
        "FlexAttentionMetadataBuilder reads each request's extent from the tokens computed before the "
        "step: the step's own new keys are not attended",
        "backend_class",
        ("decode", "prefix"),
        False,
        _FlexExtentFromComputed,
    ),
    _flex_m(
        "decoder_noncausal",
        "FlexAttentionMetadataBuilder builds a decoder batch non-causal (the bidirectional mask_mod)",
        "backend_class",
        ("prefill", "prefix"),
        False,
        _FlexDecoderNonCausal,
    ),
]
