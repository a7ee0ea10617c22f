"""sglang: its supported releases, its import, and the translation of a Batch into sglang's objects.

Every sglang adapter drives one of sglang's `AttentionBackend`s the way its model runner does: a
`ReqToTokenPool` and an `MHATokenToKVPool` hold the batch's table and cache, a `ForwardBatch`
carries the metadata, a `RadixAttention` describes the layer, `init_forward_metadata` plans and
`forward` writes this forward's K/V through the pool's own `set_kv_buffer` and attends. docs/engines.md
maps each Batch field to its sglang field. Each translation step is one method, so that a mutant
(harness/mutants/sglang.py) can change exactly one engine decision.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from contextlib import AbstractContextManager
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from harness.backends.base import BackendOutput
from harness.backends.engines.base import Engine, EngineAdapter, StandIn
from harness.backends.versions import SupportedRange
from harness.core.batch import Batch
from harness.core.modes import Mode

SGLANG = Engine(
    "sglang",
    SupportedRange(
        distribution="sglang",
        module="sglang",
        lowest="0.5.13",
        below="0.6",
        tested=("0.5.13.post1", "0.5.23"),
        why_lowest="TorchNativeAttnBackend takes its pools from the model runner and reads the layer's "
        "sliding window from 0.5.13 on; 0.5.12 and older read the pools from the ForwardBatch and have "
        "no window",
    ),
)

# What a serving process builds around attention, made here instead (docs/engines.md, "Stand-ins").
MODEL_RUNNER = StandIn(
    "model runner",
    "device, req_to_token_pool, token_to_kv_pool (sglang's real pools)",
    "the backends read only these three attributes of the ModelRunner at construction; a real one "
    "loads a model and starts distributed groups, nothing of which reaches attention",
)
TORCHVISION_OPS = StandIn(
    "torchvision operator schemas (CPU environment only)",
    "the schemas of torchvision::nms and torchvision::qnms, declared before sglang is imported",
    "sglang imports torchvision for multimodal image preprocessing (sglang.srt.configs ->"
    " internvl_utils); PyPI has torchvision only as CUDA builds, whose C++ operators do not load beside"
    " a CPU torch, and then torchvision's own import fails registering fake kernels for those two ops."
    " Declaring their schemas lets the real torchvision import; no attention code calls them",
)

# sglang's modules an adapter uses, by short name.
MODULES = {
    "pools": "sglang.srt.mem_cache.memory_pool",
    "batch": "sglang.srt.model_executor.forward_batch_info",
    "layer": "sglang.srt.layers.radix_attention",
}

# torchvision's operators whose fake kernels its import registers even when its C++ library did not
# load (torchvision/_meta_registrations.py).
TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_schemas: list[torch.library.Library] = []  # kept alive: a Library's definitions last as long as it


def declare_torchvision_schemas() -> None:
    """The TORCHVISION_OPS stand-in: on a CPU torch with torchvision, declare the schemas above if
    nothing has."""
    if _schemas or torch.version.cuda is not None or importlib.util.find_spec("torchvision") is None:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in TORCHVISION_SCHEMAS:
        name = schema.partition("(")[0]
        if not hasattr(torch.ops.torchvision, name):
            lib.define(schema)
    _schemas.append(lib)


def import_sglang(backend_module: str) -> SimpleNamespace:
    """sglang's pools, ForwardBatch, RadixAttention and the given backend module, imported."""
    declare_torchvision_schemas()
    mods = {short: importlib.import_module(name) for short, name in MODULES.items()}
    mods["backend"] = importlib.import_module(backend_module)
    return SimpleNamespace(**mods)


class SglangAdapter(EngineAdapter):
    """The translation every sglang adapter shares; a subclass names the backend and its capabilities."""

    engine = SGLANG
    stand_ins = (MODEL_RUNNER, TORCHVISION_OPS)
    _sg: SimpleNamespace | None = None

    # --- the engine --------------------------------------------------------------------------

    def import_engine(self) -> ModuleType:
        module, _, _ = self.engine_backend.partition(":")
        if self._sg is None:
            self._sg = import_sglang(module)
        return self._sg.backend

    def __getstate__(self) -> dict:
        """Pickled without sglang's modules (modules do not pickle); a worker imports its own."""
        return {k: v for k, v in self.__dict__.items() if k != "_sg"}

    def sg(self) -> SimpleNamespace:
        """sglang's modules, imported on first use."""
        self.engine_modules()
        assert self._sg is not None
        return self._sg

    def backend_class(self) -> type:
        """The sglang AttentionBackend class this adapter drives."""
        return getattr(self.engine_modules(), self.engine_backend.partition(":")[2])

    # --- the translation: one engine decision per method ------------------------------------------

    def forward_mode(self, batch: Batch) -> Any:
        """sglang's ForwardMode: DECODE, else EXTEND (sglang tells cross and encoder layers apart by the
        layer)."""
        fm = self.sg().batch.ForwardMode
        return fm.DECODE if batch.mode == Mode.DECODE else fm.EXTEND

    def req_pool_indices(self, batch: Batch) -> torch.Tensor:
        """Each request's row in the ReqToTokenPool: rows B..1, in reverse (row 0 is sglang's padding
        row), so that reading a request's row by its place in the batch reads another request's."""
        return torch.arange(batch.batch_size, 0, -1, dtype=torch.int64, device=batch.device)

    def req_to_token_pool(self, batch: Batch, rows: torch.Tensor) -> Any:
        """sglang's ReqToTokenPool holding the batch's req_to_token rows at `rows`."""
        width = max(1, batch.req_to_token.shape[1])
        pool = self.sg().pools.ReqToTokenPool(
            size=batch.batch_size, max_context_len=width, device=str(batch.device), enable_memory_saver=False
        )
        pool.write(rows, batch.req_to_token.to(pool.req_to_token.dtype))
        return pool

    def token_to_kv_pool(self, batch: Batch) -> Any:
        """sglang's MHATokenToKVPool holding a copy of the harness's pages, poison included (same slots)."""
        case, hp = batch.case, batch.pool
        pool = self.sg().pools.MHATokenToKVPool(
            size=hp.num_slots - hp.page_size,  # sglang adds one page of padding slots to `size`
            page_size=hp.page_size,
            dtype=hp.k.dtype,
            head_num=case.num_kv_heads,
            head_dim=case.head_dim,
            layer_num=1,
            device=str(batch.device),
            enable_memory_saver=False,
        )
        for ours, theirs in ((hp.k, pool.get_key_buffer(0)), (hp.v, pool.get_value_buffer(0))):
            theirs.copy_(ours.reshape(theirs.shape))
        return pool

    def layer(self, batch: Batch) -> Any:
        """sglang's RadixAttention for this layer: heads, scale, soft cap, window, cross / encoder."""
        case, sg = batch.case, self.sg()
        attn_type = sg.layer.AttentionType
        return sg.layer.RadixAttention(
            num_heads=case.num_q_heads,
            head_dim=case.head_dim,
            scaling=case.scale,
            num_kv_heads=case.num_kv_heads,
            layer_id=0,
            logit_cap=case.soft_cap,
            sliding_window_size=self.engine_window(self.window_left(batch)),
            is_cross_attention=batch.mode == Mode.CROSS,
            attn_type=attn_type.ENCODER_ONLY if batch.mode == Mode.ENCODER_ONLY else attn_type.DECODER,
        )

    def window_left(self, batch: Batch) -> int:
        """The harness's window of this layer (-1 none; a cross layer has none)."""
        return -1 if batch.mode == Mode.CROSS else batch.case.window_left

    def seq_lens(self, batch: Batch) -> list[int]:
        """sglang's seq_lens: the decoder's tokens per request, this forward's included."""
        return batch.cpu_list("seq_lens")

    def forward_batch(self, batch: Batch, rows: torch.Tensor) -> Any:
        """sglang's ForwardBatch of this forward (the fields its attention backends read)."""
        sg, dev = self.sg(), batch.device
        seq = self.seq_lens(batch)
        prefix, extend = batch.cpu_list("prefix_lens"), batch.cpu_list("extend_lens")

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        cross = batch.mode == Mode.CROSS
        enc = batch.cpu_list("encoder_lens")
        return sg.batch.ForwardBatch(
            forward_mode=self.forward_mode(batch),
            batch_size=batch.batch_size,
            input_ids=torch.zeros(batch.q.shape[0], dtype=torch.int64, device=dev),
            req_pool_indices=rows,
            seq_lens=ints(seq),
            out_cache_loc=batch.out_cache_loc.to(torch.int64),
            seq_lens_sum=sum(seq),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
            positions=batch.positions.to(torch.int64),
            extend_prefix_lens=ints(prefix),
            extend_seq_lens=ints(extend),
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=extend,
            encoder_lens=ints(enc) if cross else None,
            encoder_lens_cpu=enc if cross else None,
        )

    def new_kv(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This forward's K/V as RadixAttention hands them to the backend ([T, Hkv, D]); none for a
        cross layer (the encoder's are cached)."""
        if batch.mode == Mode.CROSS:
            return None, None
        return batch.k_new, batch.v_new

    # --- the forward --------------------------------------------------------------------------

    def model_runner(self, batch: Batch, r2t: Any, kv: Any) -> SimpleNamespace:
        """The MODEL_RUNNER stand-in."""
        return SimpleNamespace(device=str(batch.device), req_to_token_pool=r2t, token_to_kv_pool=kv)

    def serving_context(self, batch: Batch) -> AbstractContextManager[Any]:
        """What a serving process holds around attention (published server args, parallel state); the
        CPU backends read none of it."""
        return contextlib.nullcontext()

    def attention_backend(self, batch: Batch, r2t: Any, kv: Any) -> Any:
        """sglang's backend, constructed over the model runner as sglang's ModelRunner constructs it."""
        return self.backend_class()(self.model_runner(batch, r2t, kv))

    def bind_forward_batch(self, backend: Any, fb: Any) -> None:
        """What ForwardBatch.init_new adds through the model runner (a KV location plan, where a release
        has one); the CPU backends read none of it."""

    def forward_kwargs(self, batch: Batch) -> dict[str, Any]:
        """Keyword arguments of the backend's forward beyond q, k, v, layer and the batch."""
        return {}

    def planned(self, batch: Batch) -> tuple[Any, Any, Any]:
        """sglang's backend, ForwardBatch and layer over the batch, planned by init_forward_metadata
        inside serving_context."""
        rows = self.req_pool_indices(batch)
        r2t = self.req_to_token_pool(batch, rows)
        kv = self.token_to_kv_pool(batch)
        backend = self.attention_backend(batch, r2t, kv)
        fb = self.forward_batch(batch, rows)
        self.bind_forward_batch(backend, fb)
        layer = self.layer(batch)
        backend.init_forward_metadata(fb)
        return backend, fb, layer

    def run(self, batch: Batch) -> BackendOutput:
        with self.serving_context(batch):
            backend, fb, layer = self.planned(batch)
            k, v = self.new_kv(batch)
            q = batch.q.reshape(batch.q.shape[0], -1)
            o = backend.forward(q, k, v, layer, fb, **self.forward_kwargs(batch))
        self.keep_kv(batch)
        return BackendOutput(out=o.view(batch.q.shape[0], batch.case.num_q_heads, -1))
