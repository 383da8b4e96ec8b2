"""Loader errors: one line naming the file and, where there is one, the tensor."""

from __future__ import annotations

from dsa_runtime.errors import ConfigError


class LoadError(ConfigError):
    """A checkpoint that cannot be loaded as it is (missing, corrupt, or not matching its config.json)."""
