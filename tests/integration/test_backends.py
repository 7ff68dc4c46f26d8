"""Backends are chosen by name from a small registry and imported only when chosen."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from kernel_gateway.kernels.backends import AUTO, BACKENDS, load_backend
from kernel_gateway.kernels.backends.base import Backend
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.settings import BackendName, Settings

# Build the app, run its lifespan on the local backend, and list what got imported.
SERVE_LOCAL = """
import asyncio, sys
from pathlib import Path
from kernel_gateway.server.app import create_app
from kernel_gateway.settings import Settings

async def main() -> None:
    settings = Settings(backend="local", pool_size=0, preload="", runtime_dir=Path(sys.argv[1]))
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        pass

asyncio.run(main())
print(sorted(m for m in sys.modules if m == "docker" or m.startswith("docker.")))
"""


def test_the_local_backend_never_imports_the_docker_sdk(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SERVE_LOCAL), str(tmp_path / "rt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_every_backend_name_in_settings_is_registered() -> None:
    assert set(BACKENDS) | {"auto"} == set(get_args(BackendName))
    assert AUTO == ("docker", "local")  # auto: docker when it starts, else local


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_registered_backend_loads_and_describes_itself(name: BackendName, tmp_path: Path) -> None:
    cls = load_backend(name)
    backend = cls(Settings(backend=name, runtime_dir=tmp_path), RuntimeDir(tmp_path))
    assert isinstance(backend, Backend) and backend.name == name
    assert backend.isolation
    warning = backend.startup_warning
    if name == "docker":
        assert warning is None
    else:
        assert warning is not None and "local backend" in warning.lower()


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'kubernetes'"):
        load_backend("kubernetes")
