"""What every engine adapter shares: the engine's release and supported range, its stand-ins, the
window translation, and their registration into the backend registry.

An engine adapter is a Backend whose `run()` builds the engine's own objects (pools, tables, forward
batch, layer) from the Batch and calls the engine's attention backend unmodified, with its own
KV-cache write; only what a serving process builds around attention may be a `StandIn`
(docs/engines.md). The engine is imported lazily, in `available` and `run`, never by the registry or
`list`, so a machine without it lists its adapters as unavailable, with the reason.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from harness.backends.base import Backend, BackendBroken
from harness.backends.versions import SupportedRange, distribution_version
from harness.core.batch import Batch
from harness.core.pool import translate_slots


@dataclass(frozen=True)
class StandIn:
    """What a serving process builds around attention, made by the adapter: what it is (e.g. 'model
    runner'), what it holds, and why a stand-in is enough there."""

    what: str
    holds: str
    why: str


@dataclass(frozen=True)
class Engine:
    """A serving engine: its pip distribution and the releases its adapters can drive."""

    name: str  # e.g. "sglang"
    supported: SupportedRange

    def release(self) -> str | None:
        """The installed release, from the distribution's metadata (imports nothing); None if absent."""
        return distribution_version(self.supported.distribution)

    def refusal(self) -> str | None:
        """None if the installed release is in range or none is installed; else one line: the release
        and why the adapters cannot drive it."""
        release = self.release()
        if release is None:
            return None
        return self.supported.why_unsupported(release)


@cache
def model_dir(num_q_heads: int, num_kv_heads: int, head_dim: int) -> str:
    """A local model directory whose config.json is a one-layer Llama of this attention geometry,
    read by an engine's model config in place of a hub model's. One per geometry under the temp dir,
    shared by every process and run (written by rename, so no writer leaves half a file)."""
    name = f"llama-{num_q_heads}-{num_kv_heads}-{head_dim}"
    path = Path(tempfile.gettempdir()) / "attn-harness-models" / name
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": num_q_heads * head_dim,
        "num_attention_heads": num_q_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "intermediate_size": 4 * num_q_heads * head_dim,
        "vocab_size": 256,
        "max_position_embeddings": 1 << 20,
    }
    path.mkdir(parents=True, exist_ok=True)
    target = path / "config.json"
    if not target.is_file() or json.loads(target.read_text()) != config:
        fd, tmp = tempfile.mkstemp(dir=path, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        os.replace(tmp, target)
    return str(path)


class EngineAdapter(Backend):
    """A harness Backend over one of an engine's own attention backends.

    Subclasses set `engine`, `engine_backend` (the engine's class, as module:Class), `stand_ins`,
    `capabilities` (what the engine's code supports; each missing feature with the engine's reason in
    why_not), implement `import_engine` and `run`, and override `engine_window` where needed.
    """

    engine: Engine
    engine_backend: str
    stand_ins: tuple[StandIn, ...] = ()
    # Other distributions the engine's backend needs (pip name, what it is), e.g. its CUDA kernels.
    requires: tuple[tuple[str, str], ...] = ()

    @property
    def library(self) -> str:  # type: ignore[override]  # the report's library column: the engine
        return self.engine.name

    @property
    def supported(self) -> SupportedRange:
        """The engine's range: `list` prints the installed release and its standing from it."""
        return self.engine.supported

    def release(self) -> str | None:
        return self.engine.release()

    def available(self, device: str) -> str | None:
        """Why not here (device, engine or required distribution); BackendBroken for an installed
        release out of range or an engine that fails to import."""
        why = super().available(device)
        if why is not None:
            return why
        if self.release() is None:
            return f"{self.engine.supported.distribution} is not installed here (supported: " \
                f"{self.engine.supported.spec}; docs/engines.md says how to install it)"
        for distribution, what in self.requires:
            if distribution_version(distribution) is None:
                return f"{distribution} ({what}) is not installed here; {self.name} needs it beside " \
                    f"{self.engine.name} {self.release()} (docs/engines.md says how to install it)"
        refusal = self.engine.refusal()
        if refusal is not None:
            raise BackendBroken(refusal)
        self.engine_modules()
        return None

    def engine_modules(self) -> ModuleType:
        """The engine's backend module, imported once; BackendBroken naming the release when it fails."""
        try:
            return self.import_engine()
        except BackendBroken:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of an installed engine is a broken install
            first = (str(e).splitlines() or [""])[0]
            raise BackendBroken(
                f"{self.engine.name} {self.release()} is installed but {self.engine_backend} does not "
                f"import: {type(e).__name__}: {first}"
            ) from e

    def import_engine(self) -> ModuleType:
        """Import the engine's backend module (and what `run` needs); raise what the import raises."""
        raise NotImplementedError

    def engine_window(self, window_left: int) -> int:
        """The engine's layer parameter for the harness's window W (a query at p keeps keys p - W .. p,
        W + 1 keys; -1 none). Identity unless an engine counts differently (a test pins its convention)."""
        return window_left

    def keep_kv(self, batch: Batch) -> None:
        """This forward's K/V into the harness's pool at the slots the engine wrote them to (through
        `full_to_swa` on a hybrid pool's window layer; CROSS has none): the engine's cache lives for one
        `run`, a later forward reads the pool (the Backend contract, docs/backends.md)."""
        if batch.k_new.shape[0]:
            slots = translate_slots(batch.out_cache_loc, batch.full_to_swa)
            batch.pool.write(slots, batch.k_new, batch.v_new)


def _adapter_modules() -> list[str]:
    """Every module of every engine subpackage here (e.g. sglang.torch_native), importing no engine."""
    import harness.backends.engines as package

    found = []
    for sub in pkgutil.iter_modules(package.__path__):
        if not sub.ispkg:
            continue
        engine_pkg = importlib.import_module(f"{package.__name__}.{sub.name}")
        found += [f"{engine_pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(engine_pkg.__path__)]
    return found


@cache
def engine_backends() -> dict[str, Callable[[], Backend]]:
    """name -> factory of every engine adapter: the `BACKENDS` dict of each module under an engine's
    subpackage. harness.backends registers them beside its built-in adapters."""
    found: dict[str, Callable[[], Backend]] = {}
    for module_name in _adapter_modules():
        module = importlib.import_module(module_name)
        for name, factory in getattr(module, "BACKENDS", {}).items():
            if name in found:
                raise ValueError(f"engine backend name {name!r} is declared twice ({module_name})")
            found[name] = factory
    return found
