"""The hypothesis profile a pytest run is asked for, checked before anything loads it.

`--hypothesis-profile NAME` is loaded by hypothesis's own plugin, and $ATTN_HARNESS_PROFILE by the
conftests as they are imported; an unknown name was an INTERNALERROR or a conftest traceback. Here
either is pytest's one-line usage error (exit 4). A pytest plugin (harness/run/pytest_plugin.py
names it in `pytest_plugins`).
"""

from __future__ import annotations

import pytest

from harness.run.speed import settings


def unknown_env_profile() -> str | None:
    """Why $ATTN_HARNESS_PROFILE cannot be loaded, or None when it is unset or one of ours."""
    from harness.search import profiles

    name = settings.current().profile
    if name is None or name in profiles.SIZES:
        return None
    return f"${settings.PROFILE_ENV}={name!r} is not a profile; known: {', '.join(profiles.SIZES)}"


def unknown_option_profile(name: str | None) -> str | None:
    """Why `--hypothesis-profile NAME` cannot be loaded, or None: ours and any that a conftest
    registered are known to hypothesis by now."""
    from hypothesis import settings as hypothesis_settings
    from hypothesis.errors import InvalidArgument

    from harness.search import profiles

    if not name:
        return None
    try:
        hypothesis_settings.get_profile(name)
    except InvalidArgument:
        ours = ", ".join(profiles.SIZES)
        return f"--hypothesis-profile {name!r} is not a registered profile; the harness's: {ours}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before the conftests load $ATTN_HARNESS_PROFILE."""
    why = unknown_env_profile()
    if why:
        raise pytest.UsageError(why)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before hypothesis's plugin loads --hypothesis-profile."""
    why = unknown_option_profile(config.getoption("hypothesis_profile", None))
    if why:
        raise pytest.UsageError(why)
