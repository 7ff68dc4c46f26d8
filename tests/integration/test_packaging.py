"""Packaging: a wheel built from this tree, installed the way a user installs it.

- the base install is light: the client, the tool helpers and `kernel-gateway run` need
  only httpx; `serve`, `build-image` and `mcp` without the `server` extra say so in one line;
- the kernel image's build context ships inside the wheel, so `build-image` works from an
  installed copy (defect 7: it used to look for kernel-image/ beside the package).

The wheel is built once (pip, with build isolation) and installed into a plain folder,
with its dependencies, then run with `python -S`: no site-packages, so nothing of the
development environment can leak in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernel_gateway.in_kernel import PROGRAMS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "kernel_gateway", "web", "kernel-image"]
LIGHT = {"kernel-gateway", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio"}
LIGHT |= {"typing-extensions", "exceptiongroup"}
HEAVY = ["uvicorn", "starlette", "jupyter_client", "zmq", "docker", "numpy", "pandas"]


def pip(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built from a clean copy (no build/ or egg-info left here)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    pip("wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"), str(src), cwd=tmp)
    (built,) = (tmp / "dist").glob("kernel_gateway-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """The wheel and its dependencies (no extras) installed into a bare folder."""
    target = wheel.parent.parent / "site"
    pip("install", "--quiet", "--target", str(target), str(wheel), cwd=wheel.parent)
    return target


def bare_python(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Python without site-packages, seeing only the installed folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KG_"))}
    env["PYTHONPATH"] = str(target)
    return subprocess.run(
        [sys.executable, "-S", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=target.parent,
    )


def test_wheel_ships_every_file_of_the_kernel_image_context(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    context = [
        p.name for p in (ROOT / "kernel-image").iterdir() if p.is_file() and p.suffix != ".pyc"
    ]
    assert "Dockerfile" in context
    for name in context:
        assert f"kernel_gateway/kernel_image/{name}" in names, name
    assert {"requirements.lock", "fonts.py", "matplotlibrc"} <= set(context)
    # The Dockerfile copies wheels/: it must exist in an installed copy, even empty.
    assert "kernel_gateway/kernel_image/wheels/README.md" in names
    assert "kernel_gateway/web/index.html" in names
    assert "kernel_gateway/client/sse.py" in names
    # code copied into containers is found as package resources: it must ship
    for files in PROGRAMS.values():  # with every module each program imports
        for name in files:
            assert f"kernel_gateway/in_kernel/{name}" in names, name
    assert "kernel_gateway/in_kernel/kernel_startup.py" in names
    # the egress proxy's image and the code it and kernels run for network policies
    assert "kernel_gateway/kernel_image/egress/Dockerfile" in names
    assert "kernel_gateway/in_proxy/policy.py" in names
    assert "kernel_gateway/in_kernel/egress_forward.py" in names


def test_installed_copy_builds_from_its_own_context(installed: Path) -> None:
    result = bare_python(
        installed,
        "-c",
        "from kernel_gateway.cli.image import default_context; print(default_context())",
    )
    assert result.returncode == 0, result.stderr
    context = Path(result.stdout.strip())
    assert context.is_relative_to(installed), context
    assert (context / "Dockerfile").is_file()
    assert (context / "kernel_launcher.py").is_file()


def test_base_install_is_the_client_and_httpx(wheel: Path, installed: Path) -> None:
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    )
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert [r for r in requires if "extra ==" not in r] == ["httpx>=0.27"]
    server = {r.split(">")[0].split(";")[0] for r in requires if 'extra == "server"' in r}
    assert {"uvicorn", "starlette", "jupyter_client", "docker", "pandas", "ipykernel"} <= server

    distributions = {
        p.name.split("-")[0].lower().replace("_", "-") for p in installed.glob("*.dist-info")
    }
    assert distributions <= LIGHT, distributions - LIGHT

    probe = (
        "import importlib.util, sys\n"
        "from kernel_gateway.client import Client, AsyncClient, APIError, SessionFailedError\n"
        "from kernel_gateway import tools\n"
        f"print([m for m in {HEAVY!r} if importlib.util.find_spec(m)])\n"
    )
    result = bare_python(installed, "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_light_cli_runs_code_and_refuses_serve_in_one_line(installed: Path) -> None:
    helped = bare_python(installed, "-m", "kernel_gateway", "run", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--session" in helped.stdout
    for command in ("serve", "build-image", "mcp"):
        refused = bare_python(installed, "-m", "kernel_gateway", command)
        assert refused.returncode == 2
        assert refused.stdout == ""
        (line,) = refused.stderr.splitlines()
        assert "pip install 'kernel-gateway[server]'" in line
