"""The egress proxy's image name, from the kernel image's (pure: the CLI uses it too)."""

from __future__ import annotations

from kernel_gateway.kernels.languages import family_image


def egress_image(kernel_image: str) -> str:
    """`kernel-gateway-kernel:latest` -> `kernel-gateway-kernel-egress:latest`."""
    return family_image(kernel_image, "egress")
