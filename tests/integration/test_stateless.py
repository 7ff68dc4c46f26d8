"""POST /execute: a fresh kernel per request, on both backends."""

from __future__ import annotations

import base64
import os
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kernel_gateway.client import Client, RateLimitError
from tests.support.api import collected, parse_sse
from tests.support.backends import settings_for
from tests.support.server import ServerThread


def run(client: httpx.Client, body: dict[str, object]) -> dict[str, object]:
    return collected(client, "/execute", body)


def test_nothing_leaks_between_requests(client: httpx.Client) -> None:
    assert run(client, {"code": "secret = 1\nopen('left.txt', 'w').write('x')"})["status"] == "ok"
    second = run(client, {"code": "import os\nprint(os.listdir('.'))\nprint(secret)"})
    assert second["stdout"] == "[]\n"
    assert second["error"]["ename"] == "NameError"  # type: ignore[index]


def test_concurrent_requests_get_their_own_output(client: httpx.Client) -> None:
    def one(i: int) -> str:
        return str(run(client, {"code": f"import time; time.sleep(0.1); print({i} * 3)"})["stdout"])

    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(one, range(16)))
    assert outputs == [f"{i * 3}\n" for i in range(16)]


OUTPUT_HABITS = """\
import multiprocessing, os, subprocess, sys
def work(i):
    print(f"worker {i}", flush=True)
    return i
with multiprocessing.get_context("fork").Pool(2) as pool:
    print(sum(pool.map(work, range(4))))
if os.fork() == 0:
    print("forked child", flush=True)
    os._exit(0)
os.wait()
subprocess.run(["echo", "from a subprocess"])
sys.stdout.write("x" * 700_000 + "\\n")
print("partial", end="")
"""


def test_output_from_forks_subprocesses_and_odd_text_arrives(
    client: httpx.Client, backend_name: str
) -> None:
    """What a forked stateless kernel collects differently from ipykernel, all arriving."""
    code = OUTPUT_HABITS
    if backend_name == "docker":  # forked: a lone surrogate is replaced, not a lost message
        code += 'print("lone \\ud800 surrogate")\n'
    result = run(client, {"code": code, "timeout": 60})
    assert result["status"] == "ok", result
    out = str(result["stdout"])
    assert all(f"worker {i}" in out for i in range(4)), out[:500]
    for line in ("6", "forked child", "from a subprocess", "x" * 700_000):
        assert line in out.splitlines(), line[:40]
    if backend_name == "docker":
        # The subprocess wrote to the file descriptor, Python to sys.stdout: two streams the
        # fork server collects apart, so their order at the very end is not promised.
        assert "partiallone ? surrogate\n" in out, out[-200:]
    else:
        assert out.endswith("partial")


FORK_SERVER_MEMORY = """\
import json, os, sys
print(sorted(k for k in os.environ if k.startswith(("PYTHONMALLOC", "MIMALLOC", "KG_"))))
print(sys.version_info[:2] in ((3, 12), (3, 13)))
print(sys.getrefcount(json) >= 2**32 - 1, sys.getrefcount(json.dumps) >= 2**32 - 1)
rollup = open("/proc/self/smaps_rollup").read().split()
print(int(rollup[rollup.index("AnonHugePages:") + 1]))
"""


def _huge_pages_suit() -> bool:
    """What the fork server checks before it asks for huge pages (in_kernel/allocator.py)."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        return False
    pools = Path("/sys/kernel/mm/hugepages").glob("*/nr_hugepages")
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    return all(p.read_text().strip() == "0" for p in pools) and (major, minor) >= (5, 8)


def test_a_forked_kernel_shares_an_immortal_preload_in_huge_pages(
    client: httpx.Client, backend_name: str
) -> None:
    """What the fork server holds is immortal (a child writes no reference count of it)
    and, where the host suits it, in 2 MiB pages; the allocator's settings stay out of
    the request's environment."""
    if backend_name != "docker":
        pytest.skip("only the docker backend forks stateless kernels")
    result = run(client, {"code": FORK_SERVER_MEMORY})
    assert result["status"] == "ok", result
    names, immortal_python, immortal, huge_kib = str(result["stdout"]).splitlines()
    assert names == "[]"
    assert immortal == ("True True" if immortal_python == "True" else "False False")
    if _huge_pages_suit():
        assert int(huge_kib) > 0


FIRST_IMPORTS = """\
import sys
import pandas as pd
frame = pd.DataFrame({"a": [1.5, 2.0]})
display(frame)
print(frame.describe())
print(sys.version_info[:2] in ((3, 12), (3, 13)))
print(sorted(n for n, m in list(sys.modules.items()) if sys.getrefcount(m) < 2**32 - 1))
"""


def test_a_forked_kernel_imports_nothing_the_fork_server_could_have(
    client: httpx.Client, backend_name: str
) -> None:
    """A module imported in the fork server is immortal in every child; one a child
    imports is not. Running a cell, showing a table and printing one import nothing more
    (IPython's session logger and pandas' formatters once did, in every request)."""
    if backend_name != "docker":
        pytest.skip("only the docker backend forks stateless kernels")
    for _ in range(3):  # fork servers that have served requests before: no import since
        result = run(client, {"code": FIRST_IMPORTS})
        assert result["status"] == "ok", result
        *_, immortal_python, mortal = str(result["stdout"]).splitlines()
        if immortal_python != "True":
            pytest.skip("the kernel's Python has no immortal objects")
        assert mortal == "[]"


TEMPLATES = [
    # a cell that imports only standard modules (and numpy, matplotlib): the light one
    ("import sys\nprint('pandas' in sys.modules)", "False"),
    # one that imports pandas: the full one, pandas already there
    ("import sys, pandas\nprint('pandas' in sys.modules)", "True"),
    # a wrong guess costs time, never the result: pandas imported by a name the text hides
    (
        "import builtins, sys\ngetattr(builtins, '__imp' + 'ort__')('pan' + 'das')\n"
        "print('pandas' in sys.modules)",
        "True",
    ),
]


def test_light_cells_are_forked_from_a_template_without_pandas(
    client: httpx.Client, backend_name: str
) -> None:
    """A fork server holds a light template (the preload without pandas: cheaper forks)
    and a full one; each cell goes to the light one when its imports allow it."""
    if backend_name != "docker":
        pytest.skip("only the docker backend forks stateless kernels")
    before = client.get("/health").json()["fork_servers"]["light_requests"]
    for code, printed in TEMPLATES:
        result = run(client, {"code": code})
        assert result["status"] == "ok", result
        assert str(result["stdout"]).strip() == printed
    assert client.get("/health").json()["fork_servers"]["light_requests"] == before + 2


def test_sse_stream_with_files_in_and_out(client: httpx.Client) -> None:
    body = {
        "code": "import pandas as pd\n"
        "df = pd.read_csv('in.csv')\n"
        "df.assign(double=df.n * 2).to_csv('out.csv', index=False)\n"
        "print(df.n.sum())",
        "files": [{"path": "in.csv", "data": base64.b64encode(b"n\n1\n2\n").decode()}],
    }
    with client.stream("POST", "/execute", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(parse_sse(response.iter_lines()))
    names = [n for n, _ in events]
    assert names[-1] == "done"
    assert ("stdout", {"text": "3\n"}) in events
    (file_event,) = [d for n, d in events if n == "file"]
    assert file_event["path"] == "out.csv"
    assert file_event["url"] is None  # the kernel is gone: the bytes come inline
    assert base64.b64decode(file_event["data"]) == b"n,double\n1,2\n2,4\n"


@pytest.mark.parametrize(
    ("files", "status"),
    [
        ("nope", 422),
        ([{"path": "a"}], 422),
        ([{"path": "../x", "data": ""}], 422),
        ([{"path": "a", "data": "***"}], 422),
    ],
)
def test_bad_files_are_refused(client: httpx.Client, files: object, status: int) -> None:
    response = client.post("/execute", json={"code": "1", "files": files})
    assert response.status_code == status
    assert response.json()["error"]["type"] == "invalid_request"


def test_beyond_the_limit_is_429(tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = settings_for("local", tmp_path_factory.mktemp("sl"), pool_size=1, max_stateless=1)
    with ServerThread(settings) as server, Client(server.url) as c:
        stream = c.stream("import time; print('started', flush=True); time.sleep(3)")
        assert next(stream).text == "started\n"  # type: ignore[union-attr]
        with pytest.raises(RateLimitError) as caught:
            c.run("1")
        assert caught.value.status_code == 429
        assert caught.value.retry_after == 1
        assert isinstance(stream, Generator)  # typed Iterator: close() is the generator's
        stream.close()
