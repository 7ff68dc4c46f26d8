"""The gateway's in-kernel code, loaded as a kernel loads it: a module of its own that
imports nothing of the gateway (so unit tests can run its pieces beside the gateway's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import kernel_gateway.in_kernel


def load_in_kernel(name: str) -> ModuleType:
    """`kernel_gateway/in_kernel/<name>.py` as a fresh module."""
    path = Path(kernel_gateway.in_kernel.__file__).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"in_kernel_{name}_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
