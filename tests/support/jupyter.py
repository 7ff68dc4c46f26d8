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
