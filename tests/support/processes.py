"""A gateway as its own process (`python -m kernel_gateway serve`), its log in a file.

Writing the log to a file, not a pipe, keeps a chatty gateway (an access-log line
per request) from blocking on a full pipe that nobody reads during a long test.
The process can be measured from outside: resident memory, open descriptors,
and the processes it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.backends import IMAGE
from tests.support.ports import free_port


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    headers: dict[str, str]

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def descendants(self) -> set[int]:
        """Pids of every process below the gateway (local kernels and their sandboxes)."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        found: set[int] = set()
        pending = [self.proc.pid]
        while pending:
            for child in children.get(pending.pop(), []):
                if child not in found:
                    found.add(child)
                    pending.append(child)
        return found

    def wait_settled(self, target: int, seconds: float = 120) -> dict[str, Any]:
        """Wait until nothing runs and the warm pool is full again; the pool stats."""
        deadline = time.monotonic() + seconds
        with self.client() as c:
            while True:
                pool: dict[str, Any] = c.get("/health").json()["pool"]
                if (
                    pool["warm"] == target
                    and pool["starting"] == 0
                    and pool["sessions"] == 0
                    and pool["stateless"] == 0
                ):
                    return pool
                assert time.monotonic() < deadline, f"the gateway did not settle: {pool}"
                time.sleep(0.2)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextmanager
def gateway(
    tmp_path: Path,
    *args: str,
    token: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Gateway]:
    port = free_port()
    log = tmp_path / "gateway.log"
    cmd = [
        sys.executable,
        "-m",
        "kernel_gateway",
        "serve",
        "--port",
        str(port),
        "--runtime-dir",
        str(tmp_path / "rt"),
        "--image",
        IMAGE,
        *(["--token", token] if token else []),
        *args,
    ]
    with _running(cmd, log, port, token, env, up_within=90) as gw:
        yield gw


@contextmanager
def router(
    tmp_path: Path, nodes: list[str], *args: str, token: str | None = None, name: str = "router"
) -> Iterator[Gateway]:
    """`kernel-gateway route` as a process, in front of the node gateways at `nodes`."""
    port = free_port()
    log = tmp_path / f"{name}.log"
    cmd = [sys.executable, "-m", "kernel_gateway", "route", "--port", str(port)]
    cmd += ["--nodes", ",".join(nodes), *(["--token", token] if token else []), *args]
    with _running(cmd, log, port, token, None, up_within=30) as gw:
        yield gw


@contextmanager
def _running(
    cmd: list[str],
    log: Path,
    port: int,
    token: str | None,
    env: dict[str, str] | None,
    *,
    up_within: float,
) -> Iterator[Gateway]:
    """`cmd` started with its output in `log`; yielded once it answers `/health`, stopped after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    gw = Gateway(proc, f"http://127.0.0.1:{port}", log, headers)
    try:
        _wait_up(gw, up_within)
        yield gw
    finally:
        gw.stop()


def _wait_up(gw: Gateway, seconds: float) -> None:
    """Until the process answers `/health` with 200 (its log shown if it exits first)."""
    deadline = time.monotonic() + seconds
    while True:
        assert gw.proc.poll() is None, gw.log.read_text()
        try:
            if httpx.get(gw.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{gw.url} did not come up: {gw.log.read_text()}"
        time.sleep(0.1)
