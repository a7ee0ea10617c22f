"""sglang's speculative inputs built from a Batch: the EagleVerifyInput of a TARGET_VERIFY forward and
the EagleDraftExtendInput of a DRAFT_EXTEND_V2 forward, with sglang's own classes.

A serving process builds them in its EAGLE worker from the tree its draft model drew (eagle_worker_common:
build_eagle_verify_input, prepare_for_draft_extend); the harness has the tree already, in each request's
`tree` (docs/engines.md, "Stand-ins"). The backends plan a verify from the custom mask and
`draft_token_num` (FlashInfer: generate_attn_arg_prefill; FA3: its tree-mask extraction when topk > 1),
and a draft-extend from the ForwardBatch alone in their eager path.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from harness.backends.engines.base import StandIn
from harness.core.batch import Batch
from harness.core.modes import tree_depths

SPEC_INPUTS = StandIn(
    "speculative inputs",
    "sglang's EagleVerifyInput (TARGET_VERIFY: custom_mask, positions, draft_token_num, topk, spec_steps, "
    "seq_lens_sum, seq_lens_cpu from the Batch; draft_token zeros; retrieve_* -1) and EagleDraftExtendInput "
    "(DRAFT_EXTEND_V2: num_tokens_per_req, every draft accepted, positions, seq_lens, req_pool_indices); "
    "the server args' speculative_algorithm EAGLE, speculative_eagle_topk, speculative_num_steps and "
    "speculative_num_draft_tokens of the batch's trees",
    "an EAGLE worker builds them from the tree its draft model drew; token ids and the retrieve_* "
    "indices feed the sampler's acceptance, which no attention backend reads",
)


def tree_topk(parents: tuple[int, ...]) -> int:
    """sglang's topk of one verify tree: the most children of one node, the last accepted token
    (parent -1) included; 1 for a chain."""
    children = [0] * (len(parents) + 1)
    for p in parents:
        children[p + 1] += 1
    return max(children)


def spec_shape(batch: Batch) -> tuple[int, int, int]:
    """(topk, spec_steps, draft_token_num) of the batch, as the server args name them: the widest
    branching and deepest tree over its requests (every request has num_draft drafts)."""
    trees = batch.draft_parents or ((),)
    topk = max((tree_topk(t) for t in trees if t), default=1)
    steps = max((max(tree_depths(t)) + 1 for t in trees if t), default=1)
    return topk, steps, batch.num_draft


def verify_custom_mask(batch: Batch) -> torch.Tensor:
    """EAGLE's flat verify mask: for each request, num_draft rows of seq_len + num_draft columns (every
    cached key, then the drafts that are the row's ancestors or itself), request after request."""
    n = batch.num_draft
    rows = []
    for r, seq in enumerate(batch.cpu_list("seq_lens")):
        prefix = torch.ones(n, seq, dtype=torch.bool, device=batch.device)
        rows.append(torch.cat([prefix, batch.tree_mask[r]], dim=1).reshape(-1))
    return torch.cat(rows)


def verify_input(eagle: ModuleType, capture: Any, batch: Batch) -> Any:
    """sglang's EagleVerifyInput of a TARGET_VERIFY Batch (`eagle`: sglang.srt.speculative.eagle_info;
    `capture`: its CaptureHiddenMode)."""
    topk, steps, n = spec_shape(batch)
    seq = batch.cpu_list("seq_lens")
    none = torch.full((batch.batch_size, n), -1, dtype=torch.int64, device=batch.device)
    return eagle.EagleVerifyInput(
        draft_token=torch.zeros(batch.q.shape[0], dtype=torch.int64, device=batch.device),
        custom_mask=verify_custom_mask(batch),
        positions=batch.positions.to(torch.int64),
        retrieve_index=none,
        retrieve_next_token=none.clone(),
        retrieve_next_sibling=none.clone(),
        retrieve_cum_len=None,
        spec_steps=steps,
        topk=topk,
        draft_token_num=n,
        capture_hidden_mode=capture.FULL,
        seq_lens_sum=sum(seq),
        seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
    )


def draft_extend_input(eagle: ModuleType, batch: Batch, rows: torch.Tensor) -> Any:
    """sglang's EagleDraftExtendInput of a DRAFT_EXTEND_V2 Batch: num_draft tokens per request, every
    one accepted, over the bumped seq_lens; kv_indptr None, so the backends plan from the ForwardBatch."""
    n, b, dev = batch.num_draft, batch.batch_size, batch.device
    seq = batch.cpu_list("seq_lens")
    accepted = torch.full((b,), n, dtype=torch.int32, device=dev)
    return eagle.EagleDraftExtendInput(
        num_correct_drafts=accepted - 1,
        num_accept_tokens=accepted,
        num_accept_tokens_cpu=[n] * b,
        input_ids=torch.zeros(batch.q.shape[0], dtype=torch.int64, device=dev),
        seq_lens=torch.tensor(seq, dtype=torch.int64, device=dev),
        seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
        req_pool_indices=rows,
        positions=batch.positions.to(torch.int64),
        num_tokens_per_req=n,
    )


def capture_verify_input(
    eagle: ModuleType, capture: Any, shape: tuple[int, int, int], mask: torch.Tensor
) -> Any:
    """The EagleVerifyInput a graph of TARGET_VERIFY is captured with (DecodeCudaGraphRunner.get_spec_info):
    the server's (topk, spec_steps, draft_token_num), the custom-mask buffer, nothing per batch."""
    topk, steps, n = shape
    return eagle.EagleVerifyInput(
        draft_token=None,
        custom_mask=mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=steps,
        topk=topk,
        draft_token_num=n,
        capture_hidden_mode=capture.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def capture_draft_extend_input(
    eagle: ModuleType, correct: torch.Tensor, accepted: torch.Tensor, width: int
) -> Any:
    """The EagleDraftExtendInput a graph of DRAFT_EXTEND_V2 is captured with (the draft-extend runner's
    capture_one_shape): views of its accepted-count buffers, `width` tokens per request."""
    return eagle.EagleDraftExtendInput(
        hidden_states=None, num_correct_drafts=correct, num_accept_tokens=accepted, num_tokens_per_req=width
    )
