"""The tree is the architecture: every package sits in a layer, and the router stays light."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kernel_gateway"


def layered_names() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return {name.strip() for layer in layers["layers"] for name in layer.split("|")}


def test_every_package_and_module_of_the_gateway_is_in_a_layer() -> None:
    top = {
        f"kernel_gateway.{p.stem}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    missing = top - layered_names()
    assert not missing, f"not in the layers contract of pyproject.toml: {sorted(missing)}"


def test_the_router_loads_no_kernel_machinery() -> None:
    code = (
        "import json, sys\n"
        "import kernel_gateway.cluster.app\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = set(json.loads(result.stdout))
    assert not loaded & {"zmq", "jupyter_client", "docker", "mcp", "ipykernel"}, loaded


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject.toml lists packages by hand: a new folder must be added there."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
