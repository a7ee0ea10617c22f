"""The flash-attn-4 releases the fa4 glue supports, and what differs between them, in one place.

Found by diffing `flash_attn/cute/interface.py` (and mask.py, __init__.py) of the betas 4.0.0b5 to
4.0.0b36 for every keyword fa4 passes to `flash_attn_varlen_func` and every behaviour the CPU fake
(tests/flash_attn_fakes.py) models. From 4.0.0b26 on the glue needs no branch: the keywords, the
window resolution for the windows it passes (None for an open edge, never -1) and the mask_mod call
are the same. fa3 and fa2 declare no range (FA3 is built from source; FA2 is any 2.x).
"""

from __future__ import annotations

from harness.backends.versions import SupportedRange

FA4_RANGE = SupportedRange(
    distribution="flash-attn-4",
    module="flash_attn.cute",
    lowest="4.0.0b26",
    below="4.0.0",
    tested=("4.0.0b36",),
    why_lowest="learnable_sink must be bfloat16 before 4.0.0b26 (interface.py asserts it; the harness's "
    "sinks are float32, _LEARNABLE_SINK_DTYPES from b26), and 4.0.0b10 has no mask_mod keyword (the "
    "verify-tree mask)",
)

# Named differences inside FA4_RANGE, each with where it is and what the glue does about it.
FA4_DIFFERENCES = {
    "module-version-placeholder": "flash_attn/cute/__init__.py:6 (every beta) reads version('fa4'), a "
    "distribution no release is called, so __version__ is '0.0.0': the installed version comes from "
    "the flash-attn-4 metadata (versions.module_version)",
    "window-resolution-negative-edges": "interface.py _resolve_causal_local_window: 4.0.0b26 "
    "(interface.py:397) drops a window whose left + right < 0, 4.0.0b36 (interface.py:446) one whose "
    "edges are both negative; the glue passes None for an open edge and never a negative one, so "
    "both resolve its windows alike",
    "page-table-width-check": "4.0.0b32 adds `page_table.shape[1] >= required_pages` (interface.py:830 "
    "of b32): the glue's table covers the longest extent (FlashAttnGlue.token_slots), so it passes",
}
