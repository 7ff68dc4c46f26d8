"""The labels on every container a gateway starts: whose it is, and what it is for.

They let a later gateway tell its own containers (same instance) from those of a live
gateway (its lock held) and from orphans to remove (see `kernels/runtime_dir.py`). Docker
filters by them: the events stream and the listings of this instance's containers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kernel_gateway.kernels.runtime_dir import RuntimeDir

LABEL_MANAGED = "io.kernel-gateway.managed"
LABEL_INSTANCE = "io.kernel-gateway.instance"
LABEL_HOST = "io.kernel-gateway.host"
LABEL_LOCK = "io.kernel-gateway.lock"  # the owner's instance lock: held while it lives
LABEL_VIEW = "io.kernel-gateway.view"  # the owner's file system view, where the lock is
LABEL_ROLE = "io.kernel-gateway.role"
LABEL_LANGUAGE = "io.kernel-gateway.language"  # what a kernel container runs

Role = Literal["kernel", "fork-server", "probe", "egress", "build"]
"""A kernel; a fork server (stateless cells); a probe (an image's kernelspecs read at
startup); the egress proxy; a template build's step (`docker_images.py`)."""


def container_labels(
    runtime: RuntimeDir, role: Role, language: str | None = None
) -> dict[str, str]:
    """The labels of a container of this gateway's instance playing `role`."""
    labels = {
        LABEL_MANAGED: "1",
        LABEL_INSTANCE: runtime.instance,
        LABEL_HOST: runtime.hostname,
        LABEL_LOCK: str(runtime.lock_path),
        LABEL_VIEW: runtime.view,
        LABEL_ROLE: role,
    }
    if language is not None:
        labels[LABEL_LANGUAGE] = language
    return labels
