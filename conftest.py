"""Root conftest: loads the harness's pytest plugin and activates the hypothesis profile."""

from harness.run import cache_dir
from harness.run.speed import settings
from harness.search import profiles

cache_dir.apply()  # `pytest cases` compiles into the same cache directory as `python -m harness check`

pytest_plugins = ["harness.run.pytest_plugin"]

profiles.load(settings.current().profile)
