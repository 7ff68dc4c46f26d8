"""Where kernels run: a backend is chosen by name and imported only when chosen.

As uvicorn picks its loop and protocol implementations by name from a small
dict, `BACKENDS` maps each name to `module:Class`; the module (and what it
needs, such as the Docker SDK for `docker`) is imported only by `load_backend`,
so a gateway on the local backend never loads the Docker SDK. Each backend
describes itself (`Backend.isolation`, `Backend.startup_warning`); see
`base.Backend` for the interface.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from kernel_gateway.errors import BackendUnavailable
from kernel_gateway.kernels.backends.base import Backend, ExitInfo, KernelProcess

if TYPE_CHECKING:
    from kernel_gateway.kernels.runtime_dir import RuntimeDir
    from kernel_gateway.settings import Settings

BackendFactory = Callable[["Settings", "RuntimeDir"], Backend]

BACKENDS: dict[str, str] = {
    "docker": "kernel_gateway.kernels.backends.docker:DockerBackend",
    "local": "kernel_gateway.kernels.backends.local:LocalBackend",
}
AUTO: tuple[str, ...] = ("docker", "local")
"""What `--backend auto` tries, in order; the first that starts is used."""

__all__ = ["AUTO", "BACKENDS", "Backend", "ExitInfo", "KernelProcess", "load_backend"]


def load_backend(name: str) -> BackendFactory:
    """The backend class registered as `name`, importing its module now.

    A library the backend needs that is not installed (the Docker SDK in a light
    install) is `BackendUnavailable`, so `auto` moves on to the next backend.
    """
    try:
        module_name, _, class_name = BACKENDS[name].partition(":")
    except KeyError:
        known = ", ".join(BACKENDS)
        raise ValueError(f"unknown backend {name!r} (known: {known})") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] == "kernel_gateway":
            raise
        raise BackendUnavailable(
            f"the {name} backend needs the {exc.name!r} package, which is not installed "
            "(pip install 'kernel-gateway[server]')"
        ) from exc
    return cast(BackendFactory, getattr(module, class_name))
