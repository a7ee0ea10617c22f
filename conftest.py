"""Root conftest: loads the harness's pytest plugin and activates the hypothesis profile."""

from harness.search import profiles

pytest_plugins = ["harness.run.pytest_plugin"]

profiles.load()
