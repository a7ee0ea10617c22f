"""Root conftest: loads the harness's pytest plugin and activates the hypothesis profile."""

from harness import profiles

pytest_plugins = ["harness.pytest_plugin"]

profiles.load()
