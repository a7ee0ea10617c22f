"""The self-tests' conftest: each test starts from the settings its environment gives.

A test that sets an ATTN_HARNESS_* variable (monkeypatch) sees it at its first `settings.current()`,
and the next test does not see it (harness/run/speed/settings.py reads the environment once)."""

from collections.abc import Iterator

import pytest

from harness.run.speed import settings


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    settings.reset()
    yield
    settings.reset()
