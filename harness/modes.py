"""Deprecated: the modes moved to harness.core.modes; a plugin imports Mode from harness.api.

Kept for one release: each name still resolves, with a DeprecationWarning naming harness.api.
"""

from __future__ import annotations

from harness import deprecated

__getattr__ = deprecated.forward(__name__, "harness.core.modes")
