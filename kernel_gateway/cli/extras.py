"""Which optional libraries a command needs, so a light install fails with one clear line.

`pip install kernel-gateway` installs the client, the LLM tool helpers and
`kernel-gateway run` (httpx only); serving, the stdio MCP server and building the
kernel image need the `server` extra. Checked with `find_spec`, so nothing is
imported and no ImportError from our own code is ever mistaken for a missing extra.
"""

from __future__ import annotations

from importlib.util import find_spec

SERVER_EXTRA = "kernel-gateway[server]"
NEEDS: dict[str, tuple[str, ...]] = {
    "serve": ("uvicorn", "starlette", "sse_starlette", "jupyter_client", "zmq"),
    "route": ("uvicorn", "starlette", "prometheus_client"),
    "build-image": ("docker",),
    "mcp": ("mcp", "httpx2", "uvicorn", "starlette", "jupyter_client", "zmq"),
}


def missing(command: str) -> list[str]:
    """The modules `command` needs that are not installed."""
    return [name for name in NEEDS.get(command, ()) if find_spec(name) is None]


def problem(command: str) -> str | None:
    """One line saying what to install, or None when `command` can run."""
    absent = missing(command)
    if not absent:
        return None
    return (
        f"kernel-gateway {command}: needs the server libraries ({', '.join(absent)} missing); "
        f"install them with: pip install '{SERVER_EXTRA}'"
    )
