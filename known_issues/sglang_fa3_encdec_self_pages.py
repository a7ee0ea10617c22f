"""sglang's FA3 backend: an encoder-decoder batch's decoder self-attention misreads its keys on pages above 1.

FlashAttentionBackend.init_forward_metadata (flashattention_backend.py, 0.5.17 and 0.5.23) plans the
decoder's text table of a batch with `encoder_lens` as

    page_table = req_to_token[req_pool_indices[i], encoder_lens[i] + arange(max_seq_len_k)]

and, on pages above one token, reduces it to pages with `[:, strided_indices] // page_size`. sglang
allocates a request's row, encoder then text, from a page boundary (row position p at offset
p % page_size of its page), so the text's first token sits at offset encoder_lens[i] % page_size.
FA3 reads text key j from page `page_table[j // page_size]`, offset `j % page_size`: unless the encoder
fills whole pages, a self-attention layer reads other slots (encoder tokens, the text shifted, or
another page's) in place of its own keys.

One EXTEND of a decoder self-attention layer (not cross) planned through sglang's own pools,
ForwardBatch (with encoder_lens, as ScheduleBatch.prepare_encoder_info_extend leaves it: the text alone
in seq_lens and out_cache_loc) and FlashAttentionBackend: two requests, encoders of 5 and 20 tokens
with texts of 7 and 12, on shuffled pages. Per layout it prints how many text keys the page table
addresses, read as the forward views the pool: pages of 1 right, pages of 16 wrong, and pages of 16
with encoders of 16 and 32 tokens (whole pages: the control) right. It stops after
init_forward_metadata: no kernel runs. What the backend reads of a serving process are stand-ins, as
the harness's sglang_fa3 builds them.

Runs on a GPU and on a CPU, where sgl_kernel's module is replaced by one whose kernels raise (the plan
calls none). Prints the versions; exits 1 while the bug is there, 0 once every layout addresses the
text's keys.
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
from types import ModuleType, SimpleNamespace

import torch

if torch.version.cuda is None:  # a CPU torch: torchvision's operator schemas, as sglang's import needs
    _tv = torch.library.Library("torchvision", "FRAGMENT")
    for _schema in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, _schema):
            _tv.define(f"{_schema}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

try:
    import sgl_kernel.flash_attn  # noqa: F401
except ImportError:  # no CUDA kernels here: the plan calls none

    def _no_kernel(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no CUDA kernel on this machine")

    _fa = ModuleType("sgl_kernel.flash_attn")
    _fa.flash_attn_varlen_func = _fa.flash_attn_with_kvcache = _no_kernel
    _fa.get_scheduler_metadata = None
    _root = ModuleType("sgl_kernel")
    _root.merge_state_v2, _root.flash_attn = _no_kernel, _fa
    sys.modules.update({"sgl_kernel": _root, "sgl_kernel.flash_attn": _fa})

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
TEXT = (7, 12)  # decoder tokens per request (all new: a first extend)
LAYOUTS = ((1, (5, 20)), (16, (5, 20)), (16, (16, 32)))  # (page size, encoder tokens per request)


def model_path() -> str:
    """A one-layer Llama of this geometry (config.json only): what ServerArgs reads of a model."""
    path = Path(tempfile.mkdtemp(prefix="sglang-fa3-encdec-"))
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


def layout(page_size: int, encoder: tuple[int, ...]) -> list[list[int]]:
    """Each request's req_to_token row as sglang's paged allocator places a first extend (see above),
    on shuffled pages from page 1 on (page 0 is sglang's padding)."""
    lengths = [e + t for e, t in zip(encoder, TEXT)]
    needed = sum(-(-n // page_size) for n in lengths)
    shuffled = torch.randperm(needed + 3, generator=torch.Generator().manual_seed(1))[:needed] + 1
    rows, pages = [], iter(shuffled.tolist())
    for n in lengths:
        own = [next(pages) for _ in range(-(-n // page_size))]
        rows.append([own[p // page_size] * page_size + p % page_size for p in range(n)])
    return rows


def addressed(page_size: int, encoder: tuple[int, ...], device: str) -> tuple[int, int]:
    """Plan the decoder self-attention EXTEND: (text keys the page table addresses, text keys)."""
    rows = layout(page_size, encoder)
    width = max(len(r) for r in rows)
    new_slots = [s for r, e in zip(rows, encoder) for s in r[e:]]
    args = ServerArgs(
        model_path=model_path(), attention_backend="fa3", device=device, skip_tokenizer_init=True
    )
    with serving(args):
        r2t = ReqToTokenPool(size=len(rows), max_context_len=width, device=device, enable_memory_saver=False)
        req_pool_indices = torch.arange(len(rows), 0, -1, device=device)  # rows 2, 1 (0 is padding)
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
        r2t.write(req_pool_indices, table.to(r2t.req_to_token.dtype))
        kv = MHATokenToKVPool(
            size=(max(max(r) for r in rows) // page_size + 2) * page_size, page_size=page_size,
            dtype=torch.bfloat16, head_num=HKV, head_dim=D, layer_num=1, device=device,
            enable_memory_saver=False,
        )  # fmt: skip
        backend = FlashAttentionBackend(model_runner(r2t, kv, args, page_size, device))

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(rows), input_ids=ints([0] * sum(TEXT)),
            req_pool_indices=req_pool_indices, seq_lens=ints(list(TEXT)), seq_lens_sum=sum(TEXT),
            seq_lens_cpu=torch.tensor(TEXT), out_cache_loc=ints(new_slots),
            positions=ints([j for t in TEXT for j in range(t)]), extend_prefix_lens=ints([0] * len(rows)),
            extend_seq_lens=ints(list(TEXT)), extend_prefix_lens_cpu=[0] * len(rows),
            extend_seq_lens_cpu=list(TEXT), encoder_lens=ints(list(encoder)), encoder_lens_cpu=list(encoder),
        )  # fmt: skip
        translator = getattr(backend, "kv_index_translator", None)
        if translator is not None and hasattr(translator, "own_plan"):  # 0.5.22 on: ForwardBatch.init_new's
            translator.own_plan(fb).bind(fb, translator)
        RadixAttention(HQ, D, D**-0.5, HKV, layer_id=0)  # the decoder self-attention layer it plans for
        backend.init_forward_metadata(fb)
        read = backend.page_size  # the forward views the pool as [-1, page_size, heads, dim]
        pt = backend.forward_metadata.page_table.cpu()
    right = sum(
        int(pt[b, j // read]) * read + j % read == rows[b][e + j]
        for b, (e, t) in enumerate(zip(encoder, TEXT))
        for j in range(t)
    )
    return right, sum(TEXT)


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
    for page_size, encoder in LAYOUTS:
        right, keys = addressed(page_size, encoder, device)
        print(
            f"page_size {page_size:2}, encoders of {encoder} tokens, texts of {TEXT}: the self-attention "
            f"page table addresses {right} of {keys} text keys: {'right' if right == keys else 'WRONG'}"
        )
        if right != keys:
            wrong.append((page_size, encoder))
    aligned = [(ps, enc) for ps, enc in wrong if ps == 1 or all(e % ps == 0 for e in enc)]
    if aligned:
        print(f"wrong on {aligned}, where the text starts at a page boundary, not the known issue")
        return 1
    if wrong:
        print(
            "BUG: FlashAttentionBackend gathers the text's page table from column encoder_lens[i] and "
            "reduces it to pages; the text does not start at a page boundary, so FA3 reads other slots"
        )
        return 1
    print("fixed: a decoder self-attention layer reads its text keys on every layout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
