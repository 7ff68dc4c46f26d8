"""The Python clients against a real gateway: streaming, files, typed errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from kernel_gateway.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    Display,
    Done,
    NotFoundError,
    Stdout,
    TransportError,
    event_from,
)
from tests.support.backends import settings_for
from tests.support.server import ServerThread

SLOW_CELL = (
    "import time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.4)\n"
)


def test_unknown_events_are_skipped() -> None:
    assert event_from("future-event", {"x": 1}) is None


def test_sync_session_streams_incrementally(gateway: ServerThread) -> None:
    with Client(gateway.url) as client, client.session() as session:
        arrivals = [(type(e), time.monotonic()) for e in session.stream(SLOW_CELL)]
        first_line = next(t for kind, t in arrivals if kind is Stdout)
        assert arrivals[-1][0] is Done
        assert arrivals[-1][1] - first_line > 0.6
        lines: list[str] = []
        execution = session.run(SLOW_CELL, on_stdout=lines.append)
        assert lines == ["line 0\n", "line 1\n", "line 2\n"]
        assert execution.stdout == "line 0\nline 1\nline 2\n"
        assert execution.ok and execution.done is not None
        sid = session.id
    with Client(gateway.url) as client, pytest.raises(NotFoundError):
        client.session(sid).info()


def test_sync_state_files_and_results(gateway: ServerThread) -> None:
    with Client(gateway.url) as client, client.session() as session:
        session.upload("in.txt", b"abc")
        session.run("data = open('in.txt').read()")
        execution = session.run(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2]); plt.savefig('chart.png'); plt.close()\n"
            "data.upper()"
        )
        assert execution.text == "'ABC'"
        (chart,) = execution.files
        assert chart.path == "chart.png" and chart.data is not None
        assert session.download("chart.png") == chart.data
        assert [f["path"] for f in session.files()] == ["chart.png", "in.txt"]
        error = session.run("1/0")
        assert error.status == "error" and error.error is not None
        assert error.error.ename == "ZeroDivisionError"
        with pytest.raises(NotFoundError):
            session.download("missing.txt")


def test_sync_stateless(gateway: ServerThread) -> None:
    with Client(gateway.url) as client:
        displays: list[Display] = []
        execution = client.run(
            "import matplotlib.pyplot as plt\nplt.plot([1]); plt.show()\n6 * 7",
            on_display=displays.append,
        )
        assert execution.text == "42"
        assert displays and displays[0].png is not None
        assert displays[0].png.startswith(b"\x89PNG")


def test_async_client(gateway: ServerThread) -> None:
    async def main() -> None:
        async with AsyncClient(gateway.url) as client:
            async with client.session() as session:
                arrivals = [(type(e), time.monotonic()) async for e in session.stream(SLOW_CELL)]
                first_line = next(t for kind, t in arrivals if kind is Stdout)
                assert arrivals[-1][1] - first_line > 0.6
                await session.run("open('out.txt', 'w').write('async')")
                assert await session.download("out.txt") == b"async"
                sid = session.id
            with pytest.raises(NotFoundError):
                await client.request("GET", f"/sessions/{sid}")
            assert (await client.run("print(5)")).stdout == "5\n"

    asyncio.run(main())


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for("local", tmp_path_factory.mktemp("cl"), token="t0k", pool_size=0)
    with ServerThread(settings) as server:
        yield server


def test_typed_errors(secured: ServerThread) -> None:
    with Client(secured.url, token="wrong") as client:
        with pytest.raises(AuthenticationError) as caught:
            client.create_session()
        assert caught.value.status_code == 401
        assert caught.value.type == "unauthorized"
    with Client(secured.url, token="t0k") as client:
        with pytest.raises(NotFoundError) as missing:
            client.session("no-such-session").run("1")
        assert missing.value.type == "session_not_found"

    async def main() -> None:
        async with AsyncClient(secured.url) as client:
            with pytest.raises(AuthenticationError):
                await client.run("1")

    asyncio.run(main())


def test_unreachable_gateway_is_a_transport_error() -> None:
    # Refused connections are retried for `reconnect_seconds` (a restarting gateway): 1 here.
    with (
        Client("http://127.0.0.1:9", timeout=2, reconnect_seconds=1) as client,
        pytest.raises(TransportError),
    ):
        client.health()
