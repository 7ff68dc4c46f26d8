"""Code that runs inside a kernel's container, never in the gateway.

Each module here is copied into a container's connection folder by a backend (found as a
package resource) and run by the container's own Python: `kernel_startup.py` before
ipykernel in every kernel, `zygote.py` as a fork server's preloaded parent. So these
modules import nothing of `kernel_gateway`, only the standard library and what the
kernel image installs.
"""
