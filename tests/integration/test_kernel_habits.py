"""Habits of generated code work on every backend (kernel_startup.py), not only in the image.

`sys.stdout.buffer`, `reconfigure`, `argparse`, any matplotlib backend drawing inline,
empty figures not sent, and `pip install` in a kernel without network failing at once
with a way forward. The local backend runs the gateway's own Python; the docker one the
image (tests/integration/test_image_corpus.py has the image's wider corpus).
"""

from __future__ import annotations

import base64
import time

import httpx

from tests.support.api import execute


def pngs(stream_displays: list[dict[str, object]]) -> list[bytes]:
    out = []
    for display in stream_displays:
        data = display["data"]
        assert isinstance(data, dict)
        if "image/png" in data:
            out.append(base64.b64decode(data["image/png"]))
    return out


def test_stdout_buffer_and_reconfigure(client: httpx.Client, session_id: str) -> None:
    code = (
        "import sys\n"
        "sys.stdout.reconfigure(encoding='utf-8')\n"
        "sys.stdout.buffer.write(b'bytes ')\n"
        "sys.stdout.buffer.write('\\u4e2d'.encode()[:2])\n"  # a character split in two writes
        "sys.stdout.buffer.write('\\u4e2d'.encode()[2:] + b'\\n')\n"
        "print('text', flush=True)\n"
    )
    stream = execute(client, session_id, code)
    assert stream.done["status"] == "ok", stream.events
    assert stream.stdout == "bytes \u4e2d\ntext\n"
    wrong = execute(client, session_id, "import sys; sys.stdout.buffer.write('str')")
    (error,) = wrong.named("error")
    assert error["ename"] == "TypeError"


def test_argparse_sees_no_kernel_flags(client: httpx.Client, session_id: str) -> None:
    code = (
        "import argparse, sys\n"
        "p = argparse.ArgumentParser(); p.add_argument('--k', default='v')\n"
        "print(p.parse_args().k, len(sys.argv))"
    )
    stream = execute(client, session_id, code)
    assert stream.stdout == "v 1\n", stream.events


def test_agg_backend_still_draws_inline(client: httpx.Client, session_id: str) -> None:
    code = (
        "import matplotlib\n"
        "matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.show()\n"
        "plt.figure(); plt.bar(['a'], [1])\n"  # left open: sent at the end of the cell
    )
    stream = execute(client, session_id, code)
    assert stream.done["status"] == "ok", stream.events
    images = pngs(stream.named("display"))
    assert len(images) == 2
    assert all(image.startswith(b"\x89PNG") for image in images)
    again = execute(client, session_id, "plt.switch_backend('TkAgg'); plt.plot([0]); plt.show()")
    assert len(pngs(again.named("display"))) == 1, again.events


def test_empty_figure_is_not_sent(client: httpx.Client, session_id: str) -> None:
    code = "import matplotlib.pyplot as plt\nplt.figure()\nfig = plt.figure(); fig.add_subplot()\n"
    stream = execute(client, session_id, code)
    displays = stream.named("display")
    assert len(displays) == 1, displays
    assert len(pngs(displays)) == 1


def test_pip_install_without_network_fails_at_once(client: httpx.Client, session_id: str) -> None:
    started = time.monotonic()
    stream = execute(client, session_id, "!pip install kg-no-such-package-16")
    assert time.monotonic() - started < 20
    assert "no network access" in stream.named("stderr")[-1]["text"], stream.events
    present = execute(client, session_id, "%pip install matplotlib")
    assert "Requirement already satisfied" in present.stdout, present.events
    assert "no network access" not in "".join(d["text"] for d in present.named("stderr"))
