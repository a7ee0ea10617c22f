"""sglang: a sliding window of 0 (a query sees only its own key) is read as no window at all.

RadixAttention stores `self.sliding_window_size = sliding_window_size or -1`, so a layer built with
sliding_window_size=0 reports -1, and every backend that asks the layer attends over the whole
context. sglang's models pass `config.sliding_window - 1`, so a model whose window is one token gets
full attention. Here one request with one cached token and one new token: with the window the new
token sees only itself (the output is its own V); sglang's TorchNativeAttnBackend returns the
average over both keys.

Prints the sglang and torch versions; exits 1 while the bug is there, 0 once it is gone.
Runs on the CPU with sglang and torch only (on a CPU torch, torchvision's two operator schemas are
declared first, as the harness's sglang environment does: docs/engines.md, "Stand-ins").
"""

import sys
from importlib.metadata import version
from types import SimpleNamespace

import torch

if torch.version.cuda is None:
    _tv = torch.library.Library("torchvision", "FRAGMENT")
    for _schema in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, _schema):
            _tv.define(f"{_schema}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402

print(f"sglang {version('sglang')}, torch {torch.__version__}")
H, D = 2, 16
torch.manual_seed(0)
layer = RadixAttention(H, D, D**-0.5, H, layer_id=0, sliding_window_size=0)
print(f"RadixAttention(sliding_window_size=0).sliding_window_size = {layer.sliding_window_size}")

r2t = ReqToTokenPool(size=1, max_context_len=2, device="cpu", enable_memory_saver=False)
kv = MHATokenToKVPool(
    size=16, page_size=1, dtype=torch.float32, head_num=H, head_dim=D, layer_num=1, device="cpu",
    enable_memory_saver=False,
)
r2t.req_to_token[1, :2] = torch.tensor([3, 4])
k_cached, v_cached = torch.randn(H, D), torch.randn(H, D)
kv.get_key_buffer(0)[3], kv.get_value_buffer(0)[3] = k_cached, v_cached
q, k, v = torch.randn(1, H * D), torch.randn(1, H, D), torch.randn(1, H, D)
fb = ForwardBatch(
    forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=torch.zeros(1, dtype=torch.int64),
    req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([2]), out_cache_loc=torch.tensor([4]),
    seq_lens_sum=2, seq_lens_cpu=torch.tensor([2]), positions=torch.tensor([1]),
    extend_prefix_lens=torch.tensor([1]), extend_seq_lens=torch.tensor([1]),
    extend_prefix_lens_cpu=[1], extend_seq_lens_cpu=[1],
)
runner = SimpleNamespace(device="cpu", req_to_token_pool=r2t, token_to_kv_pool=kv)
backend = TorchNativeAttnBackend(runner)
backend.init_forward_metadata(fb)
out = backend.forward(q, k, v, layer, fb).view(1, H, D)
err = (out[0] - v[0]).abs().max().item()  # a window of 0: the new token's output is its own V
print(f"max |out - own V| with a window of 0: {err:.4f}")
if err > 1e-4:
    print("BUG: sliding_window_size=0 is read as no window (RadixAttention: `sliding_window_size or -1`)")
    sys.exit(1)
print("fixed: a window of 0 keeps only the query's own key")
