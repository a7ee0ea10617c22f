"""harness.api is the plugin's import surface; the old paths still resolve for one release, with a warning.
An entry-point plugin is named by its entry-point name, as a module:factory backend by its spec."""

import importlib
from importlib.metadata import EntryPoint

import pytest

import harness.api as api
from harness import backends
from harness.backends.torch_native import TorchNative
from harness.core import batch, case, modes


def test_every_public_name_resolves():
    assert all(getattr(api, name) is not None for name in api.__all__)


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [("harness.batch", "Batch", batch), ("harness.modes", "Mode", modes), ("harness.case", "Case", case)],
)
def test_an_old_path_warns_and_points_at_the_api(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} is deprecated.*harness\.api"):
        value = getattr(module, name)
    assert value is getattr(new, name) is getattr(api, name)


def test_an_old_path_names_a_moved_name_outside_the_api_by_its_new_module():
    with pytest.warns(DeprecationWarning, match=r"import it from harness\.core\.batch"):
        from harness.batch import kv_len  # noqa: F401


def test_an_old_path_without_the_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="'harness.batch' has no attribute 'nope'"):
        importlib.import_module("harness.batch").nope  # noqa: B018


class MyAttnImpl(TorchNative):
    name = "my_attn_impl"  # the class's own name differs from the entry point's


def test_a_plugin_is_named_by_its_entry_point_and_loads_again_by_that_name(monkeypatch):
    ep = EntryPoint("myattn", "tests.test_api:MyAttnImpl", backends.ENTRY_POINT_GROUP)
    monkeypatch.setattr(backends, "_plugins", lambda: {"myattn": ep})
    backend = backends.load("myattn")
    assert isinstance(backend, MyAttnImpl) and backend.name == "myattn"
    assert "myattn" in backends.names()
    assert backends.load(backend.name).name == "myattn"  # what a repro line names loads again


def test_a_spec_backend_is_named_by_its_spec():
    spec = "tests.test_api:MyAttnImpl"
    assert backends.load(spec).name == spec
