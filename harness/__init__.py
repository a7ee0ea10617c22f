"""attn-harness: engine-shaped batches, attention backends, and independent references."""

from importlib import metadata

# The release this source is; pyproject.toml's `version` says the same (tests/test_install.py).
SOURCE_VERSION = "0.1.0"


def installed_version() -> str:
    """The installed distribution's version, or the source's where the package runs uninstalled."""
    try:
        return metadata.version("attn-harness")
    except metadata.PackageNotFoundError:
        return SOURCE_VERSION


__version__ = installed_version()
