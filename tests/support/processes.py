"""A gateway (or router) as its own process, restartable, its log in a file per start.

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
from pathlib import Path
from typing import Any

import httpx

from kernel_gateway.kernels.storage import reclaim
from tests.support.backends import IMAGE
from tests.support.ports import free_port


class Gateway:
    """`kernel-gateway serve` (or `route`) as a process: started, stopped and restarted on the
    same port and runtime dir. Each start writes its own log (`logs`; `log` is the latest)."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_dir: Path,
        *,
        token: str | None = None,
        env: dict[str, str] | None = None,
        up_within: float = 90,
        name: str = "gateway",
    ) -> None:
        self.cmd = cmd
        self.url = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.env = {**os.environ, **(env or {})}
        self.log_dir = log_dir
        self.up_within = up_within
        self.name = name
        self.logs: list[Path] = []
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self._proc is not None, "the process was never started"
        return self._proc

    @property
    def log(self) -> Path:
        return self.logs[-1]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *extra: str) -> float:
        """Start (with `extra` flags this time only) and wait until `/health` answers 200;
        the seconds that took. The log is shown if the process exits first."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{self.name}-{len(self.logs)}.log"
        self.logs.append(log)
        started = time.monotonic()
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [*self.cmd, *extra], stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = started + self.up_within
        while True:
            assert self.proc.poll() is None, log.read_text()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{self.url} did not come up: {log.read_text()}"
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, wait: float = 60, *, force: bool = True) -> int:
        """Send `sig` and wait up to `wait` s; then SIGKILL (`force`) or raise TimeoutExpired."""
        if self.running:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                if not force:
                    raise
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def restart(self, *extra: str, sig: int = signal.SIGTERM) -> float:
        """Stop with `sig`, start again on the same port and runtime dir; seconds to answer."""
        self.stop(sig)
        return self.start(*extra)

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


def serve_command(runtime_dir: Path, port: int, *args: str, token: str | None = None) -> list[str]:
    """`python -m kernel_gateway serve` on `port` and `runtime_dir`, the test image, `args`.

    One fork server, as `settings_for` gives in-process gateways, unless `args` say how
    stateless requests run: the default four are a container start and a second of CPU
    each, at every start of every test gateway, for tests that send few stateless requests.
    """
    if not {"--fork-servers", "--stateless-mode"} & set(args):
        args = ("--fork-servers", "1", *args)
    return [
        sys.executable,
        "-m",
        "kernel_gateway",
        "serve",
        "--port",
        str(port),
        "--runtime-dir",
        str(runtime_dir),
        "--image",
        IMAGE,
        *(["--token", token] if token else []),
        *args,
    ]


@contextmanager
def gateway(
    tmp_path: Path,
    *args: str,
    token: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Gateway]:
    """A gateway process on `tmp_path/rt`, up for the block; stopped (SIGTERM) after."""
    port = free_port()
    cmd = serve_command(tmp_path / "rt", port, *args, token=token)
    try:
        with _running(Gateway(cmd, port, tmp_path, token=token, env=env, up_within=90)) as gw:
            yield gw
    finally:  # volumes stay mounted when a gateway stops (for its successor): not a test's
        reclaim(tmp_path / "rt" / "volumes")


@contextmanager
def router(
    tmp_path: Path, nodes: list[str], *args: str, token: str | None = None, name: str = "router"
) -> Iterator[Gateway]:
    """`kernel-gateway route` as a process, in front of the node gateways at `nodes`."""
    port = free_port()
    cmd = [sys.executable, "-m", "kernel_gateway", "route", "--port", str(port)]
    cmd += ["--nodes", ",".join(nodes), *(["--token", token] if token else []), *args]
    with _running(Gateway(cmd, port, tmp_path, token=token, up_within=30, name=name)) as gw:
        yield gw


@contextmanager
def _running(gw: Gateway) -> Iterator[Gateway]:
    try:
        gw.start()
        yield gw
    finally:
        if gw._proc is not None:
            gw.stop()
