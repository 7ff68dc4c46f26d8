"""Build the kernel image, creating its Debian base locally when no registry answers.

Where Docker Hub is reachable the Dockerfile builds as usual. Where it is not
(air-gapped or proxied hosts), `debian:bookworm-slim` is made with debootstrap
and `docker import`, so the same Dockerfile builds unchanged in both places.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker

BASE_IMAGE = "debian:bookworm-slim"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

Printer = Callable[[str], None]


def default_context() -> Path:
    """The kernel image's build context: `kernel-image/`, shipped as package data.

    pyproject.toml installs that folder as `kernel_gateway.kernel_image` (as it installs
    web/ as `kernel_gateway.web`), so an installed wheel finds it as well as a checkout.
    """
    try:
        return Path(str(files("kernel_gateway.kernel_image")))
    except ModuleNotFoundError:  # a source checkout run without being installed
        return Path(__file__).resolve().parent.parent / "kernel-image"


def _print(line: str) -> None:
    print(line, flush=True)


def ensure_base_image(client: docker.DockerClient, out: Printer = _print) -> None:
    import docker.errors

    try:
        client.images.get(BASE_IMAGE)
        out(f"base image {BASE_IMAGE}: present")
        return
    except docker.errors.ImageNotFound:
        pass
    out(f"base image {BASE_IMAGE}: pulling")
    try:
        client.images.pull(BASE_IMAGE)
        out(f"base image {BASE_IMAGE}: pulled")
        return
    except docker.errors.APIError as exc:
        out(f"base image {BASE_IMAGE}: pull failed ({exc.explanation or exc}); creating it locally")
    _debootstrap_base(out)


def _debootstrap_base(out: Printer) -> None:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise SystemExit(
            "cannot pull debian:bookworm-slim and debootstrap is not installed; "
            "install it (apt-get install debootstrap) or make the registry reachable"
        )
    with tempfile.TemporaryDirectory(prefix="kg-rootfs-") as root:
        out(f"debootstrap --variant=minbase bookworm {root} (about a minute)")
        proc = subprocess.Popen(
            [debootstrap, "--variant=minbase", "bookworm", root, DEBIAN_MIRROR],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out("  " + line.rstrip())
        if proc.wait() != 0:
            raise SystemExit(f"debootstrap failed with exit status {proc.returncode}")
        out(f"importing the root filesystem as {BASE_IMAGE}")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True, text=True
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise SystemExit(f"docker import failed: {imported.stderr.strip()}")
    out(f"base image {BASE_IMAGE}: created locally")


def build_image(tag: str, context: Path | None = None, out: Printer = _print) -> None:
    """Build `kernel-image/` as `tag`, streaming Docker's build log to `out`."""
    context = context or default_context()
    if not (context / "Dockerfile").is_file():
        raise SystemExit(f"no Dockerfile in {context}; pass --context to the kernel-image folder")
    import docker  # the server extra; imported here so default_context() needs nothing
    import docker.errors

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise SystemExit(f"no Docker engine answers: {exc}") from exc
    try:
        ensure_base_image(client, out)
        out(f"building {tag} from {context}")
        for chunk in client.api.build(path=str(context), tag=tag, rm=True, decode=True):
            if "stream" in chunk:
                text = str(chunk["stream"]).rstrip()
                if text:
                    out(text)
            elif "status" in chunk:
                out(str(chunk["status"]))
            elif "error" in chunk:
                raise SystemExit(f"image build failed: {chunk['error']}")
        out(f"built {tag}")
    finally:
        client.close()


if __name__ == "__main__":  # pragma: no cover - convenience for debugging
    build_image(sys.argv[1] if len(sys.argv) > 1 else "kernel-gateway-kernel:latest")
