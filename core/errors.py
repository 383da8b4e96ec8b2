"""Exceptions that carry a user-facing message (the CLI prints them as one line and exits non-zero)."""


class DSAError(Exception):
    """Base class: the message is meant for the user as it is."""


class ConfigError(DSAError):
    """A configuration or choice that cannot work, with the reason and the valid choices."""


class PluginError(DSAError):
    """A plugin could not be loaded or registered something invalid."""
