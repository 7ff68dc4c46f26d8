"""Where kernels run. Each backend is chosen by name in settings; see `base.Backend`."""

from __future__ import annotations

from .base import Backend, ExitInfo, KernelProcess

__all__ = ["Backend", "ExitInfo", "KernelProcess"]
