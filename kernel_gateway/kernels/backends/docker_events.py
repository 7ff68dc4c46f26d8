"""Kernel containers' deaths (exit, kill from outside, out of memory), from Docker events.

One events stream, filtered to this instance's containers, rather than a poll of each
container. The Docker SDK reads it by blocking, so a thread of its own turns each `oom` and
`die` into a call on the event loop, to the kernel its container runs. If the stream breaks
(engine restart, socket error) it is reopened with `since` set to the last event seen, so
the engine replays what was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import docker

from kernel_gateway.kernels.backends.base import ExitInfo
from kernel_gateway.kernels.backends.labels import LABEL_INSTANCE

logger = logging.getLogger(__name__)


class Watched(Protocol):
    """A kernel told of its container's events, on the event loop."""

    def on_oom(self) -> None: ...

    def on_die(self, code: int) -> None: ...


def exit_info(code: int, oom: bool) -> ExitInfo:
    """How a container ended, from its exit status and whether an `oom` event came first."""
    if oom:
        return ExitInfo(code, "out_of_memory")
    if code == 128 + signal.SIGKILL:
        return ExitInfo(code, "killed")
    if code > 128:
        return ExitInfo(code, "signal")
    return ExitInfo(code, "exited")


class DeathWatcher:
    """The events stream of one instance's containers, read on a thread of its own.

    `open()` (blocking: on the backend's thread pool) before any launch, so no death can be
    missed; `start()` then reads it. `stop()` says a break is the end, not a reason to
    reopen; `close()` ends the stream.
    """

    def __init__(
        self, client: docker.DockerClient, instance: str, kernels: Mapping[str, Watched]
    ) -> None:
        self._client = client
        self._filters = {"type": "container", "label": f"{LABEL_INSTANCE}={instance}"}
        self._kernels = kernels
        """The kernels by container name, as the backend keeps them (read, never changed)."""
        self._events: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    def open(self) -> None:
        self._events = self._client.events(decode=True, filters=self._filters)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._watch, name="docker-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._closing = True

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.close()

    def _watch(self) -> None:
        """Turn the engine's die/oom events into calls on the event loop, reopening the
        stream where it broke."""
        assert self._loop is not None
        since: int | None = None
        while not self._closing:
            try:
                if self._events is None:
                    self._events = self._client.events(
                        decode=True, since=since, filters=self._filters
                    )
                for event in self._events:
                    since = event.get("time", since)
                    self._dispatch(event)
            except Exception as exc:
                if self._closing:
                    return
                logger.warning("Docker events stream broke (%s); reopening", exc)
            self._events = None
            if not self._closing:
                time.sleep(1.0)

    def _dispatch(self, event: dict[str, Any]) -> None:
        assert self._loop is not None
        action = event.get("Action") or event.get("status")
        attrs = event.get("Actor", {}).get("Attributes", {})
        kernel = self._kernels.get(attrs.get("name", ""))
        if kernel is None:
            return
        if action == "oom":
            self._loop.call_soon_threadsafe(kernel.on_oom)
        elif action == "die":
            code = int(attrs.get("exitCode", -1))
            self._loop.call_soon_threadsafe(kernel.on_die, code)
