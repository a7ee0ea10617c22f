"""sglang's FA3 backend: a cross batch's text page table is gathered past the ReqToTokenPool's row.

FlashAttentionBackend.init_forward_metadata (flashattention_backend.py, 0.5.17 and 0.5.23) plans the
decoder's text table of an encoder-decoder batch as

    text_col = encoder_lens[i] + arange(max_seq_len_k)
    page_table = req_to_token[req_pool_indices[i], text_col]

one width, the batch's longest text (max_seq_len_k), from each request's own encoder offset. A request
whose encoder plus that longest text passes the pool's row width (`max_context_len`) is gathered
past its row: an IndexError on the CPU, a device-side assert on a GPU (the serving process dies).

One CROSS forward planned through sglang's own pools, ForwardBatch, RadixAttention (is_cross_attention)
and FlashAttentionBackend: two requests, encoder 33 + text 13 and encoder 18 + text 18, on pages of
one token (the gather comes before the table's reduction to pages, so the page size does not
matter to it; on pages of one token the table stays in token slots, which the script checks). Rows of
51 columns (the first request's encoder plus the longest text: the control) plan in bounds; rows of
46, the longest encoder + text of the batch, as a pool of that context length holds them, do not.
It stops after init_forward_metadata: no kernel runs. The serving process's parts the backend reads
are stand-ins, as the harness's sglang_fa3 builds them: a model runner over the real pools, a model
config, sglang's ServerArgs for a one-layer model directory (config.json only) published as a
scheduler publishes them, and a one-rank parallel state.

Runs on a GPU (sglang with sgl_kernel) and on a CPU: where sgl_kernel does not import, its module is
replaced by one whose kernels raise, which the plan never calls. Prints the versions; exits 1 while
the bug is there, 0 once both pools plan in bounds with each request's text addressed.
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
ENCODER = (33, 18)  # encoder tokens per request
TEXT = (13, 18)  # decoder tokens per request (all new: a first extend)
SERVED = max(e + t for e, t in zip(ENCODER, TEXT))  # 46: the batch's longest row
WIDE = max(ENCODER) + max(TEXT)  # 51: every gather in bounds


def model_path() -> str:
    """A one-layer Llama of this geometry (config.json only): what ServerArgs reads of a model."""
    path = Path(tempfile.mkdtemp(prefix="sglang-fa3-text-"))
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


def model_runner(r2t: ReqToTokenPool, kv: MHATokenToKVPool, args: ServerArgs, device: str):  # noqa: ANN201
    """What FlashAttentionBackend reads of a ModelRunner at construction (0.5.17 .. 0.5.23); its
    model config's context_len is the pool's row width, as a serving pool's rows are sized by it."""
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
        page_size=1,
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
            page_size=1,
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


def plan(width: int, device: str) -> str:
    """Plan the CROSS forward over ReqToTokenPool rows of `width` columns: "in bounds" when
    init_forward_metadata's text table addresses each request's own text slots, else what went wrong."""
    rows = [list(range(1 + 100 * b, 1 + 100 * b + e + t)) for b, (e, t) in enumerate(zip(ENCODER, TEXT))]
    new_slots = [s for r, e in zip(rows, ENCODER) for s in r[e:]]
    args = ServerArgs(
        model_path=model_path(), attention_backend="fa3", device=device, skip_tokenizer_init=True
    )
    with serving(args):
        r2t = ReqToTokenPool(size=len(rows), max_context_len=width, device=device, enable_memory_saver=False)
        req_pool_indices = torch.arange(len(rows), 0, -1, device=device)  # rows 2, 1 (0 is padding)
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
        r2t.write(req_pool_indices, table.to(r2t.req_to_token.dtype))
        kv = MHATokenToKVPool(
            size=100 * len(rows), page_size=1, dtype=torch.bfloat16, head_num=HKV, head_dim=D, layer_num=1,
            device=device, enable_memory_saver=False,
        )  # fmt: skip
        backend = FlashAttentionBackend(model_runner(r2t, kv, args, device))

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(rows), input_ids=ints([0] * sum(TEXT)),
            req_pool_indices=req_pool_indices, seq_lens=ints(list(TEXT)), seq_lens_sum=sum(TEXT),
            seq_lens_cpu=torch.tensor(TEXT), out_cache_loc=ints(new_slots),
            positions=ints([j for t in TEXT for j in range(t)]), extend_prefix_lens=ints([0] * len(rows)),
            extend_seq_lens=ints(list(TEXT)), extend_prefix_lens_cpu=[0] * len(rows),
            extend_seq_lens_cpu=list(TEXT), encoder_lens=ints(list(ENCODER)), encoder_lens_cpu=list(ENCODER),
        )  # fmt: skip
        translator = getattr(backend, "kv_index_translator", None)
        if translator is not None and hasattr(translator, "own_plan"):  # 0.5.22 on: ForwardBatch.init_new's
            translator.own_plan(fb).bind(fb, translator)
        RadixAttention(HQ, D, D**-0.5, HKV, layer_id=0, is_cross_attention=True)  # the layer it plans for
        try:
            backend.init_forward_metadata(fb)
            if device == "cuda":
                torch.cuda.synchronize()  # a device-side assert of the gather surfaces here
        except IndexError as e:
            return f"IndexError: {e}"
        except RuntimeError as e:
            if "device-side assert" not in str(e):
                raise
            return f"device-side assert: {str(e).splitlines()[0]}"
        text = backend.forward_metadata.page_table.cpu()
    wrong = [b for b, (e, t) in enumerate(zip(ENCODER, TEXT)) if text[b, :t].tolist() != rows[b][e : e + t]]
    return "in bounds" if not wrong else f"in bounds, but the text table misses requests {wrong}' text"


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
    shape = ", ".join(f"encoder {e} + text {t}" for e, t in zip(ENCODER, TEXT))
    outcomes = {}
    for width, what in ((WIDE, "control"), (SERVED, "as served")):  # the control first: an assert ends CUDA
        outcomes[width] = plan(width, device)
        print(f"rows of {width} ({what}), {shape}: init_forward_metadata: {outcomes[width]}")
    if outcomes[WIDE] != "in bounds":
        print("the control did not plan in bounds, which the known issue does not describe")
        return 1
    if outcomes[SERVED] != "in bounds":
        print(
            f"BUG: FlashAttentionBackend gathers each request's text table for the longest text "
            f"({max(TEXT)}) from its encoder offset: {ENCODER[0]} + {max(TEXT)} columns leave rows of "
            f"{SERVED}"
        )
        return 1
    print("fixed: the text page table of a cross batch stays within each request's row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
