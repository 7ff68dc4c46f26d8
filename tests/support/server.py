"""The real app under uvicorn in a thread, and a proxy whose connections a test can cut."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn

from kernel_gateway.kernels.storage import reclaim
from kernel_gateway.server.app import create_app
from kernel_gateway.settings import Settings

ServerFactory = Callable[..., "ServerThread"]
"""The `servers` fixture (tests/conftest.py): `servers(backend="local", **settings)`."""


class ServerThread:
    """Runs the real app under uvicorn on a free loopback port, lifespan included."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=math.ceil(settings.keep_alive_timeout),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        # A server that does not stop never ran its lifespan's shutdown: its kernels and
        # session disks are left behind (a connection handler that outlives its client).
        assert not self.thread.is_alive(), "the test server did not stop within 60 s"
        # Volumes stay mounted when a gateway stops (for its successor): not a test's.
        reclaim(Path(self.settings.runtime_dir) / "volumes")

    @property
    def url(self) -> str:
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"


class CuttableProxy:
    """A loopback TCP proxy to `target` whose open connections the test can cut at once.

    Cutting closes both sides of every live connection, as a dropped network does; new
    connections are served as before.
    """

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._live.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._live.difference_update((source, sink))

    def cut(self) -> None:
        with self._lock:
            live, self._live = self._live, set()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.cuts += 1

    def close(self) -> None:
        self._listener.close()
        self.cut()
