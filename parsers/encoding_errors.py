"""The error raised for messages the chat encoders cannot encode."""

from __future__ import annotations

from dsa_runtime.errors import DSAError


class EncodingError(DSAError):
    """Messages that cannot be encoded; the text names the offending message by index."""
