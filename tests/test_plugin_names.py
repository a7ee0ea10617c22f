"""An entry-point plugin is named by its entry-point name, as a module:factory backend by its spec."""

from importlib.metadata import EntryPoint

from harness import backends
from harness.backends.torch_native import TorchNative


class MyAttnImpl(TorchNative):
    name = "my_attn_impl"  # the class's own name differs from the entry point's


def test_a_plugin_is_named_by_its_entry_point_and_loads_again_by_that_name(monkeypatch):
    ep = EntryPoint("myattn", "tests.test_plugin_names:MyAttnImpl", backends.ENTRY_POINT_GROUP)
    monkeypatch.setattr(backends, "_plugins", lambda: {"myattn": ep})
    backend = backends.load("myattn")
    assert isinstance(backend, MyAttnImpl) and backend.name == "myattn"
    assert "myattn" in backends.names()
    assert backends.load(backend.name).name == "myattn"  # what a repro line names loads again


def test_a_spec_backend_is_named_by_its_spec():
    spec = "tests.test_plugin_names:MyAttnImpl"
    assert backends.load(spec).name == spec
