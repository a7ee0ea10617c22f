"""The cases sglang_flashinfer failed on an H200 (sglang 0.5.17, flashinfer-python 0.6.18.post1), as their
repro lines give them: the known issues' own cases, judged with the FlashInfer fake on the CPU and with
FlashInfer itself on the GPU."""

from harness.core.case import Case, Request

# A soft cap of 30 at queries of amplitude 30 (float16), given to forward() only.
CAPPED_DECODE = Case(
    mode="DECODE",
    requests=(Request(62, 1),) * 3,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    dtype="float16",
    soft_cap=30.0,
    q_amplitude=30.0,
    page_size=16,
    page_layout="interleaved",
    seed=1179,
)
# The catalogue's chunk_over_window: a chunk of new tokens wider than the window, after a prefix.
CHUNK_OVER_WINDOW = Case(
    mode="EXTEND",
    requests=(Request(40, 30), Request(3, 20)),
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=64,
    window_left=7,
    page_size=16,
)
