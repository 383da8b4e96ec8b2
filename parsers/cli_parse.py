"""Placeholder replaced by the parsers work."""
HELP = "(being built)"


def add_arguments(parser):
    pass


def run(args):
    from dsa_runtime.errors import DSAError

    raise DSAError("not built yet")
