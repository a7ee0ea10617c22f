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
# The FP8 prefix case sglang_flashinfer failed (err 123 against 0.0425): one cached token, one new,
# V written at a scale of 0.0173 and read back unscaled.
FP8_PREFIX = Case(
    mode="EXTEND",
    requests=(Request(1, 1),),
    num_q_heads=4,
    num_kv_heads=4,
    head_dim=64,
    dtype="bfloat16",
    window_left=28,
    page_size=16,
    kv_dtype="float8_e4m3fn",
    k_scale=1.0,
    v_scale=0.0173,
)
