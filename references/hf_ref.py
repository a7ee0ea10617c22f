"""The Hugging Face reference: transformers' own mask functions and eager attention.

A second reference, independent of references/masks.py and torch_ref.py (it imports neither):
visibility from `transformers.masking_utils`' long-standing mask functions, attention from
GPT-OSS's eager function (sinks) with Gemma2's cap lines, all in float64. HF `sliding_window = S`
is `window_left = S - 1`; its bidirectional (encoder) `sliding_window = S` is `|p - k| <= S`, a
two-sided window with `window_left = window_right = S`. A row with no visible key returns 0. Why
each choice: docs/hf_and_models.md.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from transformers import masking_utils as hf_masks
from transformers.models.gpt_oss import modeling_gpt_oss

QUERY_BLOCK = 64  # query rows per eager call: bounds the [Hq, rows, T] float64 score matrix


def hf_sliding_window(window_left: int) -> int | None:
    """This harness's `window_left = W` (W + 1 keys) as HF's `sliding_window` (S keys): S = W + 1."""
    return None if window_left < 0 else window_left + 1


def hf_bidirectional_sliding_window(window_left: int, window_right: int) -> int | None:
    """An encoder's symmetric window (L = R) as HF's bidirectional `sliding_window`: S = L (|p - k| <= S);
    None for any other window (HF has no function for it)."""
    return window_left if window_left == window_right >= 0 else None


def _mirrored(mask_function: Callable) -> Callable:
    """A mask function with the query and key indices swapped: HF's left-edge overlay as a right edge."""

    def inner(batch_idx, head_idx, q_idx, kv_idx):  # noqa: ANN001, ANN202 - HF's mask signature
        return mask_function(batch_idx, head_idx, kv_idx, q_idx)

    return inner


def encoder_mask_function(window_left: int, window_right: int) -> Callable:
    """An ENCODER_ONLY request's visibility over its own positions, from HF's functions: the plain
    bidirectional mask; HF's bidirectional sliding window where the window is symmetric; otherwise
    the bidirectional mask with `sliding_window_overlay(L + 1)` (k > p - (L + 1)) for the left edge
    and, for a right edge, the same overlay mirrored (p > k - (R + 1), i.e. k <= p + R)."""
    symmetric = hf_bidirectional_sliding_window(window_left, window_right)
    if symmetric is not None:
        return hf_masks.sliding_window_bidirectional_mask_function(symmetric)
    fn = hf_masks.bidirectional_mask_function
    if window_left >= 0:
        fn = hf_masks.and_masks(fn, hf_masks.sliding_window_overlay(window_left + 1))
    if window_right >= 0:
        fn = hf_masks.and_masks(fn, _mirrored(hf_masks.sliding_window_overlay(window_right + 1)))
    return fn


def _depths(parents: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def _ancestry(parents: tuple[int, ...]) -> torch.Tensor:
    """[n, n] bool: row j marks j itself and every ancestor of j."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for j, p in enumerate(parents):
        if p >= 0:
            anc[j] |= anc[p]
    return anc


def at_positions(mask_function: Callable, q_pos: torch.Tensor, kv_pos: torch.Tensor) -> Callable:
    """A mask function over query/key indices, from an HF mask function over absolute positions."""

    def inner(batch_idx, head_idx, q_idx, kv_idx):  # noqa: ANN001, ANN202 - HF's mask signature
        return mask_function(batch_idx, head_idx, q_pos[q_idx], kv_pos[kv_idx])

    return inner


def _tree_overlay(num_prefix: int, ancestry: torch.Tensor) -> Callable:
    """Verify: a prefix key is always allowed; draft key i only for its descendants j (and itself)."""

    def prefix_key(batch_idx, head_idx, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return kv_idx < num_prefix

    def ancestor(batch_idx, head_idx, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return ancestry[q_idx, (kv_idx - num_prefix).clamp(min=0)]

    return hf_masks.or_masks(prefix_key, ancestor)


def request_mask_function(case, r: int) -> tuple[Callable, int, int]:  # noqa: ANN001 - a harness Case
    """(mask function over (query index, key index), number of queries, number of keys) for request r."""
    req = case.requests[r]
    p, e = req.prefix_len, req.extend_len
    mode = str(case.mode)
    if mode == "CROSS":
        return hf_masks.bidirectional_mask_function, e, req.encoder_len
    if mode == "ENCODER_ONLY":  # positions 0 .. E-1 are the indices themselves
        return encoder_mask_function(case.window_left, case.window_right), e, e
    if mode == "TARGET_VERIFY":
        depth = torch.tensor(_depths(req.tree), dtype=torch.long)
        q_pos = p + depth
        kv_pos = torch.cat([torch.arange(p), q_pos])
    else:
        q_pos = torch.arange(p, p + e)
        kv_pos = torch.arange(p + e)
    by_position = hf_masks.causal_mask_function
    window = hf_sliding_window(case.window_left)
    if window is not None:
        by_position = hf_masks.and_masks(hf_masks.sliding_window_overlay(window), by_position)
    fn = at_positions(by_position, q_pos, kv_pos)
    if mode == "TARGET_VERIFY":
        fn = hf_masks.and_masks(fn, _tree_overlay(p, _ancestry(req.tree)))
    return fn, e, kv_pos.numel()


def evaluate(mask_function: Callable, q_idx: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[len(q_idx), num_keys] bool, broadcasting (batch, head, query, key) index tensors as HF does."""
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    q = q_idx.long().view(1, 1, -1, 1)
    kv = torch.arange(num_keys).view(1, 1, 1, -1)
    return mask_function(b, h, q, kv).expand(1, 1, q.shape[2], num_keys)[0, 0]


def eager_bias(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers' eager mask: 0 where visible, the dtype's minimum elsewhere; [1, 1, E, T]."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.finfo(dtype).min)[None, None]


def _capped_eager(module, query, key, value, bias, scaling, softcap):  # noqa: ANN001, ANN202
    """Gemma2's eager_attention_forward up to its mask (scale, then cap, then add the mask), then
    GPT-OSS's from its sink column on (concatenate, subtract the max, softmax in the input dtype)."""
    key_states = modeling_gpt_oss.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_gpt_oss.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = torch.tanh(attn_weights / softcap) * softcap
    if bias is not None:
        attn_weights = attn_weights + bias
    sinks = module.sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
    combined = torch.cat([attn_weights, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    return torch.matmul(probs.to(value_states.dtype), value_states).transpose(1, 2)


def eager_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: float,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """transformers' eager attention in the inputs' dtype, in HF's layout: query [B, Hq, L, D],
    key/value [B, Hkv, T, D], bias [B, 1, L, T] additive -> [B, L, Hq, D]."""
    hq, hkv = query.shape[1], key.shape[1]
    no_sink = torch.full((hq,), -torch.inf, dtype=query.dtype, device=query.device)
    module = SimpleNamespace(
        sinks=no_sink if sinks is None else sinks.to(query.dtype),
        num_key_value_groups=hq // hkv,
        training=False,
    )
    if softcap > 0:
        return _capped_eager(module, query, key, value, bias, scaling, float(softcap))
    return modeling_gpt_oss.eager_attention_forward(module, query, key, value, bias, scaling)[0]


def _attend(case, q, k, v, visible, sinks, dtype):  # noqa: ANN001, ANN202
    """q [e, Hq, D], k/v [T, Hkv, D], visible [e, T] -> [e, Hq, D]; 0 where a row sees no key."""
    query, key, value = (t.to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = eager_attention(query, key, value, eager_bias(visible, dtype), case.scale, case.soft_cap, sinks)[0]
    return torch.where(visible.any(-1)[:, None, None], out, torch.zeros((), dtype=dtype))


def reference(case, inputs, dtype: torch.dtype = torch.float64) -> torch.Tensor:  # noqa: ANN001
    """Expected output [sum E, Hq, D] of every query of the case (a harness Case and its Inputs,
    duck-typed), in `dtype` on the CPU."""
    outs = []
    for r in range(len(case.requests)):
        fn, e, t = request_mask_function(case, r)
        for q0 in range(0, e, QUERY_BLOCK):
            rows = torch.arange(q0, min(e, q0 + QUERY_BLOCK))
            visible = evaluate(fn, rows, t)
            outs.append(
                _attend(case, inputs.q[r][rows], inputs.k[r], inputs.v[r], visible, inputs.sinks, dtype)
            )
    return torch.cat(outs)
