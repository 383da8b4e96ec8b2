"""dsa-runtime: a plugin-based inference runtime for DeepSeek Sparse Attention models.

Import name of the ``core/`` folder. Heavy modules (torch kernels, the conformance kit, parsers) are
imported lazily so that ``import dsa_runtime`` and ``dsa-runtime plugins`` stay fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
