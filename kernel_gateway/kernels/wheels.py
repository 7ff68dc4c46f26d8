"""What `pip download` must ask for so the wheels it fetches on the host install in a
kernel image: CPython of the image's version, on glibc Linux of the engine's architecture.

The kernel image's build (`cli/image.py`) and templates' `pip install` steps
(`templates/pip.py`) download wheels on the host, which can reach the package index when
containers cannot, and install them in the image without an index.
"""

from __future__ import annotations

ARCHES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}
NEWEST_GLIBC_MINOR = 41  # Debian trixie's glibc 2.41: wheels up to manylinux_2_41 run
GLIBC_MINOR_OF_PYTHON = {"3.11": 36}
"""Where an image's Python is not trixie's 3.13: the glibc of the Debian release whose
`python3` it is (Python 3.11 images are Debian 12, bookworm: glibc 2.36)."""


def wheel_target(arch: str, python: str) -> list[str]:
    """pip download's target options; ValueError for an architecture without wheels."""
    machine = ARCHES.get(arch)
    if machine is None:
        raise ValueError(f"no wheels for the Docker engine's architecture {arch!r}")
    nodot = python.replace(".", "")
    args = ["--python-version", python, "--implementation", "cp"]
    args += ["--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    newest = GLIBC_MINOR_OF_PYTHON.get(python, NEWEST_GLIBC_MINOR)
    for minor in range(newest, 16, -1):
        args += ["--platform", f"manylinux_2_{minor}_{machine}"]
    return [*args, "--platform", f"manylinux2014_{machine}"]
