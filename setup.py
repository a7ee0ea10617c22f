"""Packaging that pyproject.toml cannot say: the suite (cases/) ships inside the package as
`harness.cases`, so an installed harness finds it (harness/cli.py, `suite()`); in the repository
it stays the top-level cases/ folder."""

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["harness", "harness.*", "references", "references.*"])

setup(
    packages=[*PACKAGES, "harness.cases"],
    package_dir={"harness.cases": "cases"},
)
