"""Code that runs inside a kernel's container, never in the gateway.

Each module here is copied into a container's connection folder by a backend (found as a
package resource) and run by the container's own Python: `kernel_startup.py` before
ipykernel in every kernel, `zygote.py` as a fork server's preloaded parent, `bridge.py`
beside a kernel of another language. So these modules import nothing of `kernel_gateway`,
only the standard library and what the kernel image installs. A program made of several
modules imports its own as the files beside it (the folder of `python <folder>/<program>.py`
is first on `sys.path`), and as this package's modules in the gateway, which imports
`jupyter_wire.py` too: the one copy of Jupyter's signing and framing.
"""

from __future__ import annotations

PROGRAMS: dict[str, tuple[str, ...]] = {
    "zygote": (
        "zygote.py",
        "allocator.py",
        "fork_server.py",
        "fork_cleanup.py",
        "mini_kernel.py",
        "jupyter_wire.py",
    ),
    "bridge": ("bridge.py", "jupyter_wire.py"),
}
"""The files each program run as `python <folder>/<program>.py` needs in its folder: itself,
then every module of this package it imports (`backends.base.write_in_kernel_program`)."""
