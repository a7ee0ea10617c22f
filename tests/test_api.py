"""harness.api is the plugin's import surface; the old paths still resolve for one release, with a warning.
An entry-point plugin is named by its entry-point name, as a module:factory backend by its spec.
docs/backends.md (and docs/catalogue.md) to the letter: every python block runs, and the lists of
Capabilities fields and engine-glue methods are the code's own."""

import dataclasses
import importlib.metadata
import inspect
import re
import warnings
from pathlib import Path

import pytest

from harness import api, backends
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
    name = "my_attn_impl"  # not the entry point's name


def test_a_plugin_is_named_by_its_entry_point_and_loads_again_by_that_name(monkeypatch):
    ep = importlib.metadata.EntryPoint("myattn", "tests.test_api:MyAttnImpl", backends.ENTRY_POINT_GROUP)
    monkeypatch.setattr(backends, "_plugins", lambda: {"myattn": ep})
    backend = backends.load("myattn")
    assert isinstance(backend, MyAttnImpl) and backend.name == "myattn"
    assert "myattn" in backends.names()
    assert backends.load(backend.name).name == "myattn"  # what a repro line names loads again


def test_a_spec_backend_is_named_by_its_spec():
    spec = "tests.test_api:MyAttnImpl"
    assert backends.load(spec).name == spec


DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDES = ("backends.md", "catalogue.md")


def python_blocks(name: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (DOCS / name).read_text(), flags=re.M | re.S)


BLOCKS = [(name, i, code) for name in GUIDES for i, code in enumerate(python_blocks(name))]


def test_the_guides_have_examples():
    assert {name for name, _, _ in BLOCKS} == set(GUIDES)


@pytest.mark.parametrize(("name", "index", "code"), BLOCKS, ids=[f"{n}-{i}" for n, i, _ in BLOCKS])
def test_a_python_block_runs(name, index, code):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the guide imports from harness.api only
        exec(compile(code, f"docs/{name} block {index}", "exec"), {"__name__": f"doc_{index}"})


def test_every_capabilities_field_is_listed_in_order():
    text = (DOCS / GUIDES[0]).read_text()
    listed = text[text.index("Every\nfield, in order:") : text.index("What that gives a check:")]
    assert re.findall(r"`(\w+)`", listed) == [f.name for f in dataclasses.fields(api.Capabilities)]


def test_the_glue_table_gives_each_method_its_signature():
    text = (DOCS / GUIDES[0]).read_text()
    rows = re.findall(r"^\| `(\w+)\(([^)]*)\)` \| `([^`]+)` \|", text, flags=re.M)
    shared = {n: m for n, m in vars(api.EngineGlue).items() if inspect.isfunction(m) and n[0] != "_"}
    assert {name for name, _, _ in rows} == set(shared)
    for name, args, returns in rows:
        sig = inspect.signature(shared[name])
        assert [p.strip() for p in args.split(",")] == list(sig.parameters)[1:], name
        assert sig.return_annotation.replace("torch.", "") == returns, name
