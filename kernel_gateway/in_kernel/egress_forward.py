"""The kernel's way to the egress proxy: `127.0.0.1:<port>` inside the kernel's container,
forwarded byte for byte to a Unix socket in the kernel's ipc folder.

A kernel container has no network at all (only `lo`), with or without a network policy.
A session allowed some domains gets this forwarder (started beside its kernel, as its
user) and `HTTP_PROXY`/`HTTPS_PROXY` pointing at it; the Unix socket's other end is the
gateway, which adds the session's own proxy credentials and hands the connection to the
proxy. Nothing here decides anything: a connection that does not go through the proxy
has nowhere to go.

    python3 egress_forward.py PORT SOCKET_PATH READY_PATH

Writes READY_PATH once it listens (the gateway waits for it). Runs with the standard library
only. Exits when the port is taken (a forwarder left running by a gateway before this one
still serves it: the ready file is written all the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

CHUNK = 64 * 1024


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def forward(
    path: str, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
) -> None:
    try:
        proxy_reader, proxy_writer = await asyncio.open_unix_connection(path)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(pump(client_reader, proxy_writer), pump(proxy_reader, client_writer))
    finally:
        for writer in (client_writer, proxy_writer):
            with contextlib.suppress(OSError):
                writer.close()


def mark_ready(path: str, state: str) -> None:
    with open(path, "w") as f:  # tiny, once: no need to leave the event loop for it
        f.write(state + "\n")


async def main(port: int, path: str, ready: str) -> None:
    try:
        server = await asyncio.start_server(
            lambda r, w: forward(path, r, w), "127.0.0.1", port, reuse_address=True
        )
    except OSError:  # already served (by the forwarder of a gateway before this one)
        server = None
    mark_ready(ready, "listening" if server is not None else "served already")
    if server is None:
        return
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
