"""A real Jupyter server (or JupyterLab) process whose kernels are our gateway's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port


def execute_content(code: str) -> dict[str, Any]:
    """An execute_request's content with every field the protocol gives it (older
    ipykernels, such as the kernel image's, require them all)."""
    return {
        "code": code,
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }


def gateway_client_for(jupyter_url: str, request_timeout: float = 60) -> Any:
    """jupyter_server's gateway client in this process, pointed at a Jupyter server."""
    from jupyter_server.gateway.gateway_client import GatewayClient

    client = GatewayClient.instance()
    client.url = jupyter_url
    client.ws_url = jupyter_url.replace("http", "ws", 1)
    client.auth_token = ""
    client.request_timeout = request_timeout
    client._connection_args = {}
    return client


@contextmanager
def jupyter_process(
    module: str, gateway_url: str, gateway_token: str, root: Path, *extra: str
) -> Iterator[str]:
    """`python -m <module> --gateway-url=<gateway>` on a free loopback port; yields its URL.

    The Jupyter server itself takes no token: jupyter_server's gateway kernel client
    opens its WebSocket without credentials. It listens on loopback only.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "KERNEL_"))}
    for name in ("config", "runtime", "data"):
        env[f"JUPYTER_{name.upper()}_DIR"] = str(root / f".jupyter-{name}")
    with open(root / f"{module}.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                f"--gateway-url={gateway_url}",
                f"--GatewayClient.auth_token={gateway_token}",
                "--IdentityProvider.token=",
                "--ServerApp.disable_check_xsrf=True",
                f"--port={port}",
                "--ip=127.0.0.1",
                "--no-browser",
                "--allow-root",
                f"--ServerApp.root_dir={root}",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(f"{url}/api", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((root / f"{module}.log").read_text()[-3000:])
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


class Outputs:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] == msg_type]


async def run_cell(
    kc: Any, code: str, output_hook: Outputs | None = None, seconds: float = 60
) -> dict[str, Any]:
    """jupyter_client's request loop: `execute`, then IOPub until idle, then the shell reply.

    (`execute_interactive` polls ZMQ sockets, which jupyter_server's WebSocket-backed
    gateway client does not have, so its channel API is driven directly.)
    """
    outputs = output_hook or Outputs()
    msg_id = kc.execute(code)
    deadline = time.monotonic() + seconds
    idle = False
    while not idle:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no idle status for {code!r}")
        try:
            message = await kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        parent = message["parent_header"].get("msg_id")
        if parent is None and message["msg_type"] == "status":
            outputs(message)  # the kernel's own state (restarting, dead), for no request
        if parent != msg_id:
            continue
        outputs(message)
        idle = message["msg_type"] == "status" and message["content"]["execution_state"] == "idle"
    while True:
        reply: dict[str, Any] = await kc.get_shell_msg(
            timeout=max(1.0, deadline - time.monotonic())
        )
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
