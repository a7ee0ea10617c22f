"""harness.api is the plugin's import surface; the old paths still resolve for one release, with a warning."""

import importlib

import pytest

import harness.api as api
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
