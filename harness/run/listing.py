"""`list`: what each backend declares (its capabilities, as the suite is generated from them) and
whether it runs here, device by device: available, unavailable with the reason, or broken."""

from __future__ import annotations

from harness.run.check import load_backend


def describe_backend(name: str) -> tuple[list[str], bool]:
    """`list`'s lines for one backend (its capabilities and whether it runs here), and whether its
    library is broken here."""
    from harness.backends.versions import describe, installed_version
    from harness.core.vocab import FEATURES
    from harness.run.check import availability

    b = load_backend(name)
    c = b.capabilities
    feats = [f for f in FEATURES if getattr(c, f)]
    lines = [f"{name}  ({b.library})"]
    if getattr(b, "supported", None) is not None:  # a library with a supported range: its release
        lines.append(f"  release: {describe(b.supported, installed_version(b.supported))}")
    lines.append(f"  modes: {', '.join(sorted(str(m) for m in c.modes))}")
    dims = ", ".join(map(str, sorted(c.head_dims))) if c.head_dims else "any multiple of 8"
    lines.append(
        f"  dtypes: {', '.join(sorted(c.dtypes))}; head dims: {dims}; page sizes: "
        f"{', '.join(map(str, sorted(c.page_sizes)))}; kv layouts: {', '.join(sorted(c.kv_layouts))}"
    )
    fp8 = ", ".join(sorted(c.kv_dtypes)) or "-"
    lines.append(f"  features: {', '.join(feats) or '-'}; FP8 KV caches: {fp8}")
    if c.fp8_queries:
        whose = "" if c.fp8_query_rows == "all" else " (the prefill requests' only)"
        lines.append(f"  FP8 queries: cast to the cache's dtype{whose}, judged over them so: {c.fp8_queries}")
    if c.fp8_probabilities:
        whose = "" if c.fp8_query_rows == "all" else ", the prefill requests' only"
        lines.append(
            f"  FP8 probabilities: times {c.fp8_probability_scale}, rounded to the cache's dtype before P @ V"
            f"{whose}, counted in the budget: {c.fp8_probabilities}"
        )
    graph = ", ".join(sorted(str(m) for m in c.graph_modes))
    lines.append(f"  CUDA graph: {graph}" if graph else f"  CUDA graph: none: {c.graph_reason()}")
    mode_reason = getattr(b, "graph_mode_reason", lambda mode: None)  # the environment's, not the backend's
    for m in sorted(c.graph_modes, key=str):
        if why := mode_reason(m):
            lines.append(f"  CUDA graph: no {m} here: {why}")
    broken = False
    for device in sorted(c.devices):
        state, why = availability(b, device)
        broken |= state == "broken"
        lines.append(f"  {device}: {state}" + (f": {why}" if why else ""))
    lines += [f"  no {feature}: {why}" for feature, why in sorted(c.why_not.items()) if feature != "graph"]
    return lines, broken
