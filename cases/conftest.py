"""The suite's conftest: activates the hypothesis profile (ATTN_HARNESS_PROFILE, default `ci`).

It ships with the suite (as harness/cases/conftest.py, setup.py), so an installed harness runs its
suite under the same profile as a checkout; the plugin itself comes from the `pytest11` entry point
(or `-p harness.run.pytest_plugin`, which `attn-harness check` passes). `--hypothesis-profile NAME`
still wins: hypothesis applies it after this file is loaded.
"""

from harness.run.speed import settings
from harness.search import profiles

profiles.load(settings.current().profile)
