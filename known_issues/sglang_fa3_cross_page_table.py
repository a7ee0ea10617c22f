"""sglang's FA3 backend: cross attention gives FA3 the encoder's token slots as its page table.

FlashAttentionBackend.init_forward_metadata (flashattention_backend.py, 0.5.17 and 0.5.23) plans
a cross layer over `encoder_page_table = req_to_token[req_pool_indices, :encoder_max_seq_len_k]`:
one token slot per encoder token, never reduced to pages (the self-attention table is, with
`[:, strided_indices] // page_size`). The forward views the cache as [pages, page_size, heads, dim]
and FA3 reads key j of a request from page `page_table[j // page_size]`, offset `j % page_size`:
with pages of one token that is the slot itself, with larger pages another part of the pool.

One CROSS forward through sglang's own pools, ForwardBatch, RadixAttention (is_cross_attention)
and FlashAttentionBackend: two requests whose encoders hold 5 and 20 tokens (bf16, 4 query heads
over 2 KV heads, head_dim 64) on shuffled pages, each with one new decoder token, against a torch
reference over the same encoder K/V. Per page size it prints the largest error and whether the
encoder page table FA3 is given addresses the encoder's keys. The serving process's parts the
backend reads are stand-ins, as the harness's sglang_fa3 builds them: a model runner over the real
pools, a model config, sglang's ServerArgs for a one-layer model directory (config.json only)
published as a scheduler publishes them, and a one-rank parallel state.

Needs sglang with its CUDA kernels (sgl_kernel) on a Hopper GPU; prints the versions; exits 1 while
the bug is there (a page size above 1 wrong), 0 once every page size is right.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace

import torch

if torch.version.cuda is None:  # a CPU torch: torchvision's operator schemas, as sglang's import needs
    _tv = torch.library.Library("torchvision", "FRAGMENT")
    for _schema in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, _schema):
            _tv.define(f"{_schema}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.configs.model_config import AttentionArch  # noqa: E402
from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

HQ, HKV, D = 4, 2, 64
ENCODER = (5, 20)  # encoder tokens per request
PREFIX = (0, 6)  # decoder tokens already cached per request; one new decoder token each
PAGE_SIZES = (1, 16)
TOLERANCE = 0.03  # bf16 output of values ~1: its rounding is ~0.008


def model_path() -> str:
    """A one-layer Llama of this geometry (config.json only): what ServerArgs reads of a model."""
    path = Path(tempfile.mkdtemp(prefix="sglang-fa3-cross-"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HQ * D,
        "num_attention_heads": HQ,
        "num_key_value_heads": HKV,
        "head_dim": D,
        "num_hidden_layers": 1,
        "intermediate_size": 4 * HQ * D,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
    }
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def model_runner(r2t: ReqToTokenPool, kv: MHATokenToKVPool, args: ServerArgs, page_size: int, device: str):  # noqa: ANN201
    """What FlashAttentionBackend reads of a ModelRunner at construction (0.5.17 .. 0.5.23)."""
    config = SimpleNamespace(
        num_attention_heads=HQ,
        get_num_kv_heads=lambda tp_size: HKV,
        get_max_num_attention_heads=lambda: HQ,
        head_dim=D,
        v_head_dim=D,
        context_len=r2t.req_to_token.shape[1],
        is_encoder_decoder=True,
        is_multimodal=False,
        is_local_attention_model=False,
        attention_arch=AttentionArch.MHA,
        attention_chunk_size=None,
        hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]),
        hf_text_config=SimpleNamespace(num_attention_heads=HQ, attn_logit_softcapping=None),
    )
    allocator = TokenToKVPoolAllocator(
        size=kv.size, dtype=kv.dtype, device=device, kvcache=kv, need_sort=False
    )
    runner = SimpleNamespace(
        device=device,
        dtype=torch.bfloat16,
        page_size=page_size,
        req_to_token_pool=r2t,
        token_to_kv_pool=kv,
        token_to_kv_pool_allocator=allocator,
        kv_cache_dtype=kv.dtype,
        kv_cache_dtype_str="auto",
        sliding_window_size=None,
        attention_chunk_size=None,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.from_string(args.speculative_algorithm),
        ps=runtime_context.get_parallel(),
        server_args=args,
        model_config=config,
        prefill_attention_backend_str="fa3",  # read from 0.5.18
        decode_attention_backend_str="fa3",
        attn_cp_size=1,  # read by 0.5.21
    )
    if importlib.util.find_spec("sglang.srt.mem_cache.kv_index_translator") is not None:  # 0.5.19 on
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=r2t.req_to_token,
            token_to_kv_pool_allocator=allocator,
            token_to_kv_pool=kv,
            page_size=page_size,
            device=device,
        )
    return runner


@contextlib.contextmanager
def serving(args: ServerArgs) -> Iterator[None]:
    """The server args published and a one-rank parallel state, as a scheduler holds them."""
    set_global_server_args_for_scheduler(args)
    listed = getattr(runtime_context, "_parallel_fields", None)  # a function from 0.5.21
    fields = listed() if callable(listed) else runtime_context._PARALLEL_FIELDS
    one_rank = {f: 1 if f.endswith("_size") else 0 for f in fields if f.endswith(("_size", "_rank"))}
    with runtime_context.get_parallel().override(**one_rank):
        yield


def layout(page_size: int) -> list[list[int]]:
    """Each request's req_to_token row (encoder tokens, then decoder tokens) on shuffled pages from
    page 1 on (page 0 is sglang's padding), the encoder's pages first."""
    needed = sum(-(-(enc + pre + 1) // page_size) for enc, pre in zip(ENCODER, PREFIX))
    shuffled = torch.randperm(needed + 3, generator=torch.Generator().manual_seed(1))[:needed] + 1
    rows, pages = [], iter(shuffled.tolist())
    for enc, pre in zip(ENCODER, PREFIX):
        n = enc + pre + 1
        own = [next(pages) for _ in range(-(-n // page_size))]
        rows.append([own[j // page_size] * page_size + j % page_size for j in range(n)])
    return rows


def check(page_size: int, device: str) -> tuple[float, bool]:
    """One CROSS forward on pages of `page_size`: (largest error against the reference, whether the
    encoder page table FA3 is given addresses every encoder key)."""
    gen = torch.Generator().manual_seed(0)
    rows = layout(page_size)
    width = max(len(r) for r in rows)
    # The pool reaches every page a token slot read as a page id points at (no read past its end).
    slots = (max(max(r) for r in rows) + 2) * page_size
    args = ServerArgs(
        model_path=model_path(), attention_backend="fa3", device=device, skip_tokenizer_init=True
    )
    with serving(args):
        r2t = ReqToTokenPool(size=len(rows), max_context_len=width, device=device, enable_memory_saver=False)
        req_pool_indices = torch.arange(len(rows), 0, -1, device=device)  # rows 2, 1 (0 is padding)
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=device)
        r2t.write(req_pool_indices, table.to(r2t.req_to_token.dtype))
        kv = MHATokenToKVPool(
            size=slots, page_size=page_size, dtype=torch.bfloat16, head_num=HKV, head_dim=D, layer_num=1,
            device=device, enable_memory_saver=False,
        )  # fmt: skip
        for buf in (kv.get_key_buffer(0), kv.get_value_buffer(0)):  # every slot a distinct draw
            buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
        backend = FlashAttentionBackend(model_runner(r2t, kv, args, page_size, device))
        seq = [pre + 1 for pre in PREFIX]

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(rows), input_ids=ints([0] * len(rows)),
            req_pool_indices=req_pool_indices, seq_lens=ints(seq), seq_lens_sum=sum(seq),
            seq_lens_cpu=torch.tensor(seq), out_cache_loc=ints([r[-1] for r in rows]),
            positions=ints(list(PREFIX)), extend_prefix_lens=ints(list(PREFIX)),
            extend_seq_lens=ints([1] * len(rows)), extend_prefix_lens_cpu=list(PREFIX),
            extend_seq_lens_cpu=[1] * len(rows), encoder_lens=ints(list(ENCODER)),
            encoder_lens_cpu=list(ENCODER),
        )  # fmt: skip
        translator = getattr(backend, "kv_index_translator", None)
        if translator is not None and hasattr(translator, "own_plan"):  # 0.5.22 on: ForwardBatch.init_new's
            translator.own_plan(fb).bind(fb, translator)
        layer = RadixAttention(HQ, D, D**-0.5, HKV, layer_id=0, is_cross_attention=True)
        backend.init_forward_metadata(fb)
        pt = backend.forward_metadata.encoder_page_table.cpu()
        addressed = all(
            int(pt[b, j // page_size]) * page_size + j % page_size == rows[b][j]
            for b in range(len(rows))
            for j in range(ENCODER[b])
        )
        q = torch.randn(len(rows), HQ * D, generator=gen).to(device, torch.bfloat16)
        out = backend.forward(q, None, None, layer, fb).view(len(rows), HQ, D).float()
    k_all, v_all = kv.get_key_buffer(0).float(), kv.get_value_buffer(0).float()
    err = 0.0
    for b, enc in enumerate(ENCODER):
        k, v = (x[rows[b][:enc]].repeat_interleave(HQ // HKV, dim=1) for x in (k_all, v_all))
        p = torch.einsum("hd,khd->hk", q[b].view(HQ, D).float(), k).mul(D**-0.5).softmax(-1)
        err = max(err, float((out[b] - torch.einsum("hk,khd->hd", p, v)).abs().max()))
    return err, addressed


def installed(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    kernel = installed("sglang-kernel")
    print(f"sglang {installed('sglang')}, sglang-kernel {kernel}, torch {torch.__version__}, {where}")
    wrong = []
    for page_size in PAGE_SIZES:
        err, addressed = check(page_size, device)
        ok = err <= TOLERANCE and addressed
        table = "addresses" if addressed else "does not address"
        print(
            f"page_size {page_size:2}: CROSS over encoders of {ENCODER} tokens: max err {err:.4g} "
            f"(tolerance {TOLERANCE}); the encoder page table {table} the encoder's keys: "
            f"{'right' if ok else 'WRONG'}"
        )
        if not ok:
            wrong.append(page_size)
    if any(ps > 1 for ps in wrong):
        print(
            "BUG: FlashAttentionBackend gives FA3 the encoder's token slots (req_to_token) as its page "
            "table; FA3 reads them as pages"
        )
        return 1
    if wrong:
        print(f"wrong on pages of {wrong}, which the known issue does not describe")
        return 1
    print("fixed: cross attention reads the encoder's keys on every page size")
    return 0


if __name__ == "__main__":
    sys.exit(main())
