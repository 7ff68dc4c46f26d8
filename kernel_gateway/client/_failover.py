"""Several base URLs for one service (a cluster's routers): fail over when one is down.

A request goes to the URL that answered last; when no connection can be made to it
(refused, unreachable, connect timeout: nothing was sent), the same request goes to
the next URL at once. Both clients use this as an httpx transport wrapped around the
real one, so calls, streams and stream resumes all fail over alike. Errors after a
connection was made are not retried here: they reach the client's own handling
(`Reconnect`, `Resumer`), which knows what may be sent again.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


class Replicas:
    """The base URLs, in the order given, and the one that answered last."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("no base URL given")
        self.urls = [httpx.URL(u) for u in urls]
        self.current = 0

    def order(self) -> list[int]:
        n = len(self.urls)
        return [(self.current + i) % n for i in range(n)]

    def retarget(self, request: httpx.Request, index: int) -> None:
        """Point `request` (built against the first URL) at URL number `index`."""
        target = self.urls[index]
        path = request.url.raw_path
        for base in self.urls:
            prefix = base.raw_path.rstrip(b"/")
            if prefix and path.startswith(prefix + b"/"):
                path = path[len(prefix) :]
                break
        path = target.raw_path.rstrip(b"/") + path
        request.url = request.url.copy_with(
            scheme=target.scheme, host=target.host, port=target.port, raw_path=path
        )
        request.headers["Host"] = target.netloc.decode("ascii")


class FailoverTransport(httpx.BaseTransport):
    def __init__(self, replicas: Replicas, transport: httpx.BaseTransport) -> None:
        self.replicas = replicas
        self._transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        failure: Exception | None = None
        for index in self.replicas.order():
            self.replicas.retarget(request, index)
            try:
                response = self._transport.handle_request(request)
            except CONNECT_ERRORS as exc:
                failure = exc
                continue
            self.replicas.current = index
            return response
        assert failure is not None
        raise failure

    def close(self) -> None:
        self._transport.close()


class AsyncFailoverTransport(httpx.AsyncBaseTransport):
    def __init__(self, replicas: Replicas, transport: httpx.AsyncBaseTransport) -> None:
        self.replicas = replicas
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        failure: Exception | None = None
        for index in self.replicas.order():
            self.replicas.retarget(request, index)
            try:
                response = await self._transport.handle_async_request(request)
            except CONNECT_ERRORS as exc:
                failure = exc
                continue
            self.replicas.current = index
            return response
        assert failure is not None
        raise failure

    async def aclose(self) -> None:
        await self._transport.aclose()
