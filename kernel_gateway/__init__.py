"""A gateway that runs AI-written code in a pool of sandboxed IPython kernels.

Data path, one module each: routes -> pool -> session -> kernel -> events -> sse.
"""

from __future__ import annotations

__version__ = "0.1.0"
