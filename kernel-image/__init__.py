"""The kernel image's build context, installed as the `kernel_gateway.kernel_image` package."""
