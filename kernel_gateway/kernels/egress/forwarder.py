"""The sandbox's end of the way out: the forwarder's port on the sandbox's own loopback
(`in_kernel/egress_forward.py`) and the proxy variables that point programs at it. A
session's kernels (sessions/network.py), its commands (E2B's process API) and a template
build's RUN steps (templates/build_network.py) all use these."""

from __future__ import annotations

PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"


def proxy_environment() -> dict[str, str]:
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
    }
