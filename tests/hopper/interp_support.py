"""What the Triton-interpreter tests need: triton installed, and a numpy its interpreter can use.

Each ``tests/hopper/test_*_interpreter.py`` sets ``pytestmark = NEEDS_INTERPRETER`` and runs its kernels in a
subprocess with ``TRITON_INTERPRET=1`` (the interpreter must be chosen before triton compiles anything).
"""

from __future__ import annotations

import importlib.util

import pytest


def numpy_converts_size1_arrays() -> bool:
    """Triton 3.6's interpreter turns a runtime loop bound into a 1-element array and calls ``int()`` on it,
    which newer numpy releases refuse."""
    import warnings

    import numpy as np

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            int(np.array([1]))
    except TypeError:
        return False
    return True


HAS_TRITON = importlib.util.find_spec("triton") is not None
NEEDS_INTERPRETER = [
    pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (the interpreter ships with it)"),
    pytest.mark.skipif(
        HAS_TRITON and not numpy_converts_size1_arrays(),
        reason="this numpy refuses int() of 1-element arrays, which Triton 3.6's interpreter needs (numpy<2.3 works)",
    ),
]
