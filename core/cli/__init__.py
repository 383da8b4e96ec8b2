"""The ``dsa-runtime`` command line."""
