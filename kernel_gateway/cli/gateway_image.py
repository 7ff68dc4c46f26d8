"""Build the gateway's own image (cluster mode: `kernel-gateway route` and its nodes).

The gateway's wheel and what it needs, fetched on the host as the kernel image's wheels are
(`image.py`), installed in an image built on the kernel image.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_gateway.cli.image import (
    LOCK,
    Printer,
    default_context,
    docker_build,
    folder_name,
    lock_python,
    package_parent,
    pip_download,
    platform_args,
    print_line,
)

if TYPE_CHECKING:
    pass

GATEWAY_DOCKERFILE = "gateway.Dockerfile"
GATEWAY_WHEELS = "gateway-wheels"
GATEWAY_REQUIREMENTS = "gateway-requirements.txt"
# What the server extra brings only for kernels run by the local backend: a gateway in
# a container drives kernel containers, which have their own copies.
KERNEL_SIDE = frozenset(
    {"ipykernel", "matplotlib", "numpy", "pandas", "seaborn", "openpyxl", "pillow"}
)


def gateway_requirements() -> list[str]:
    """The server extra's requirements that the gateway process itself needs."""
    from importlib.metadata import requires

    kept = []
    for line in requires("kernel-gateway") or []:
        spec, _, marker = line.partition(";")
        if 'extra == "server"' not in marker.replace("'", '"'):
            continue
        name = re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0]
        if name.lower().replace("_", "-") not in KERNEL_SIDE:
            rest = marker.replace('extra == "server"', "").replace("extra == 'server'", "")
            rest = rest.strip().removeprefix("and").removesuffix("and").strip()
            kept.append(f"{spec.strip()}; {rest}" if rest else spec.strip())
    return kept


def source_checkout() -> Path:
    """The project's source tree (its wheel is built from it), or SystemExit."""
    root = package_parent()
    if not (root / "pyproject.toml").is_file():
        raise SystemExit(
            "the gateway image is built from a source checkout of kernel-gateway "
            f"(no pyproject.toml beside {root / 'kernel_gateway'})"
        )
    return root


def build_gateway_image(
    tag: str, kernel_image: str, out: Printer = print_line, *, cache_dir: Path
) -> None:
    """Build the gateway's image on top of `kernel_image` (which must exist)."""
    started = time.monotonic()
    import docker
    import docker.errors

    root = source_checkout()
    stage = cache_dir / folder_name(tag)
    wheels = stage / GATEWAY_WHEELS
    wheels.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(default_context() / GATEWAY_DOCKERFILE, stage / "Dockerfile")
    try:
        client = docker.from_env()
        client.ping()
        client.images.get(kernel_image)
    except docker.errors.ImageNotFound:
        raise SystemExit(
            f"the gateway image is built on the kernel image {kernel_image}, which is "
            "missing: run `kernel-gateway build-image` first"
        ) from None
    except docker.errors.DockerException as exc:
        raise SystemExit(f"no Docker engine answers: {exc}") from exc
    try:
        for old in wheels.glob("kernel_gateway-*.whl"):
            old.unlink()
        out(f"wheels: the gateway's own, from {root}")
        pip_download(
            ["wheel", "--no-deps", "--wheel-dir", str(wheels), str(root)], 1, out, "gateway"
        )
        own = next(wheels.glob("kernel_gateway-*.whl"))
        python = lock_python(default_context() / LOCK)
        target = platform_args(str(client.version().get("Arch", "amd64")), python)
        requirements = stage / GATEWAY_REQUIREMENTS
        requirements.write_text("\n".join([*gateway_requirements(), ""]))
        out(f"wheels: the gateway's dependencies, for Python {python}")
        pip_download(
            ["download", "--dest", str(wheels), "--only-binary", ":all:", *target]
            + ["-r", str(requirements), "httpx"],
            0,
            out,
            "server",
        )
        out(f"wheels: {own.name} and its dependencies ready")
        docker_build(client, stage, tag, out, {"KERNEL_IMAGE": kernel_image})
        size = client.images.get(tag).attrs.get("Size", 0) / 1e6
        out(f"built {tag} ({size:.0f} MB) in {time.monotonic() - started:.1f} s")
    finally:
        client.close()
