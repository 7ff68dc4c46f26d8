"""Charts and files reach the client, on both backends; the workspace cannot be escaped."""

from __future__ import annotations

import base64
import http.client
import io
import os
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.api import execute
from tests.support.server import ServerThread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plt_show_gives_a_png_display(client: httpx.Client, session_id: str) -> None:
    stream = execute(
        client, session_id, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
    )
    (display,) = stream.named("display")
    png = base64.b64decode(display["data"]["image/png"])
    assert png.startswith(PNG_MAGIC)
    assert stream.named("file") == []


def test_open_figure_at_end_of_cell_is_shown(client: httpx.Client, session_id: str) -> None:
    stream = execute(client, session_id, "import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])")
    assert any("image/png" in d["data"] for d in stream.named("display"))


def test_pandas_plot_is_shown(client: httpx.Client, session_id: str) -> None:
    code = "import pandas as pd\npd.DataFrame({'a': [1, 3, 2]}).plot()"
    stream = execute(client, session_id, code)
    assert stream.done["status"] == "ok"
    assert any("image/png" in d["data"] for d in stream.named("display"))


def test_savefig_gives_a_file_event_matching_the_download(
    client: httpx.Client, session_id: str
) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(['a', 'b'], [3, 5])\n"
        "fig.savefig('bars.png')\n"
        "plt.close(fig)\n"
    )
    stream = execute(client, session_id, code)
    (event,) = stream.named("file")
    assert event["path"] == "bars.png"
    assert event["mime"] == "image/png"
    assert event["url"] == f"/sessions/{session_id}/files/bars.png"
    data = base64.b64decode(event["data"])
    assert data.startswith(PNG_MAGIC)
    assert event["size"] == len(data)
    assert stream.names[-2:] == ["file", "done"]
    download = client.get(event["url"])
    assert download.status_code == 200
    assert download.headers["content-type"] == "image/png"
    assert download.content == data


def test_files_written_every_way_are_reported_once(client: httpx.Client, session_id: str) -> None:
    code = (
        "import subprocess, pandas as pd\n"
        "from PIL import Image\n"
        "Image.new('RGB', (4, 4), 'red').save('pil.jpg')\n"
        "pd.DataFrame({'x': [1, 2]}).to_csv('out.csv', index=False)\n"
        "open('plain.txt', 'w').write('hello')\n"
        "subprocess.run(['sh', '-c', 'mkdir -p sub && echo hi > sub/shell.txt'], check=True)\n"
    )
    stream = execute(client, session_id, code)
    files = {e["path"]: e for e in stream.named("file")}
    assert set(files) == {"pil.jpg", "out.csv", "plain.txt", "sub/shell.txt"}
    assert files["pil.jpg"]["mime"] == "image/jpeg"
    assert base64.b64decode(files["pil.jpg"]["data"])[:2] == b"\xff\xd8"
    assert "data" not in files["out.csv"]
    assert files["out.csv"]["mime"] == "text/csv"
    assert client.get(files["out.csv"]["url"]).text == "x\n1\n2\n"
    assert client.get(files["sub/shell.txt"]["url"]).text == "hi\n"
    # Untouched files are not reported again; a changed one is.
    again = execute(client, session_id, "open('plain.txt', 'a').write(' again')")
    assert [e["path"] for e in again.named("file")] == ["plain.txt"]
    assert execute(client, session_id, "1").named("file") == []


def test_uploaded_csv_is_read_by_pandas(client: httpx.Client, session_id: str) -> None:
    csv = b"city,temp\nOslo,3\nLima,19\n"
    put = client.put(f"/sessions/{session_id}/files/data/in.csv", content=csv)
    assert put.status_code == 201
    assert put.json()["path"] == "data/in.csv"
    assert put.json()["size"] == len(csv)
    stream = execute(
        client, session_id, "import pandas as pd\nprint(pd.read_csv('data/in.csv').temp.sum())"
    )
    assert stream.stdout == "22\n"
    assert stream.named("file") == []  # the upload is not something the code produced


def test_list_and_delete(client: httpx.Client, session_id: str) -> None:
    client.put(f"/sessions/{session_id}/files/a.txt", content=b"abc")
    execute(client, session_id, "open('b.bin', 'wb').write(bytes(range(256)))")
    listing = client.get(f"/sessions/{session_id}/files").json()["files"]
    by_path = {f["path"]: f for f in listing}
    assert set(by_path) == {"a.txt", "b.bin"}
    assert by_path["a.txt"]["size"] == 3
    assert by_path["b.bin"]["modified"].endswith("Z")
    assert client.get(f"/sessions/{session_id}/files/b.bin").content == bytes(range(256))
    assert client.delete(f"/sessions/{session_id}/files/a.txt").status_code == 204
    assert client.get(f"/sessions/{session_id}/files/a.txt").status_code == 404
    assert execute(client, session_id, "import os; print(os.path.exists('a.txt'))").stdout == (
        "False\n"
    )


def test_files_survive_a_restart(client: httpx.Client, session_id: str) -> None:
    client.put(f"/sessions/{session_id}/files/keep.txt", content=b"kept")
    assert client.post(f"/sessions/{session_id}/restart").status_code == 200
    assert execute(client, session_id, "print(open('keep.txt').read())").stdout == "kept\n"
    stream = execute(client, session_id, "open('new.txt', 'w').write('x')")
    assert [e["path"] for e in stream.named("file")] == ["new.txt"]


def test_html_download_cannot_run_on_our_origin(client: httpx.Client, session_id: str) -> None:
    execute(client, session_id, "open('report.html', 'w').write('<script>alert(1)</script>')")
    response = client.get(f"/sessions/{session_id}/files/report.html")
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


def raw_request(base_url: str, method: str, target: str, body: bytes = b"") -> int:
    """Send a request line exactly as given (httpx would normalise '..' away)."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None, base_url
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


TRAVERSALS = [
    "../outside.txt",
    "sub/../../outside.txt",
    "..%2Foutside.txt",
    "%2e%2e/outside.txt",
    "%2E%2E%2Foutside.txt",
    "sub/%2e%2e/%2e%2e/outside.txt",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "a%00b.txt",
]


@pytest.mark.parametrize("path", TRAVERSALS)
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_traversal_is_refused(
    gateway: ServerThread, client: httpx.Client, session_id: str, path: str, method: str
) -> None:
    outside = gateway.settings.runtime_dir / "outside.txt"
    outside.write_text("secret")
    status = raw_request(gateway.url, method, f"/sessions/{session_id}/files/{path}", b"pwned")
    assert status in (400, 403, 404)
    assert outside.read_text() == "secret"
    assert not os.path.exists("/etc/pwned")


def test_symlinks_out_of_the_workspace_are_not_followed(
    gateway: ServerThread, client: httpx.Client, session_id: str
) -> None:
    secret = gateway.settings.runtime_dir / "host-secret.txt"
    secret.write_text("host secret")
    code = (
        "import os\n"
        f"os.symlink({str(secret)!r}, 'link.txt')\n"
        "os.symlink('/etc', 'etc')\n"
        "os.makedirs('d', exist_ok=True)\n"
        f"os.symlink({str(secret.parent)!r}, 'd/up')\n"
    )
    stream = execute(client, session_id, code)
    assert stream.done["status"] == "ok"
    assert stream.named("file") == []  # links are never reported as files
    for path in ("link.txt", "etc/passwd", "d/up/host-secret.txt"):
        response = client.get(f"/sessions/{session_id}/files/{path}")
        assert response.status_code in (403, 404), path
        assert b"host secret" not in response.content
        assert b"root:" not in response.content
        put = client.put(f"/sessions/{session_id}/files/{path}", content=b"overwritten")
        assert put.status_code in (400, 403, 404), path
    assert secret.read_text() == "host secret"
    listed = [f["path"] for f in client.get(f"/sessions/{session_id}/files").json()["files"]]
    assert listed == []


def test_upload_over_the_cap_is_413_and_writes_nothing(
    gateway: ServerThread, client: httpx.Client, session_id: str
) -> None:
    limit = gateway.settings.max_upload_bytes
    response = client.put(f"/sessions/{session_id}/files/big.bin", content=b"x" * (limit + 1))
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"

    def chunks() -> io.BytesIO:
        return io.BytesIO(b"y" * (limit + 1))

    # Without Content-Length (chunked), the cap is enforced while streaming.
    streamed = client.put(f"/sessions/{session_id}/files/big2.bin", content=iter([chunks().read()]))
    assert streamed.status_code == 413
    assert client.get(f"/sessions/{session_id}/files").json()["files"] == []
    stream = execute(client, session_id, "import os; print(sorted(os.listdir('.')))")
    assert stream.stdout == "[]\n"


def test_files_are_gone_with_the_session(gateway: ServerThread, client: httpx.Client) -> None:
    sid = client.post("/sessions").json()["id"]
    execute(client, sid, "open('x.txt', 'w').write('x'); import os; print(os.getcwd())")
    before = {p.name for p in (gateway.settings.runtime_dir).rglob("x.txt")}
    assert before == {"x.txt"}
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert list(gateway.settings.runtime_dir.rglob("x.txt")) == []
    assert client.get(f"/sessions/{sid}/files").status_code == 404


def test_svg_and_dpi_are_configurable(
    backend_name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.support.backends import backend_settings

    settings = backend_settings(
        backend_name,
        tmp_path_factory.mktemp("svg"),
        pool_size=0,
        figure_formats="png,svg",
        figure_dpi=50,
    )
    code = (
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 2))\nplt.plot([1, 2])\nplt.show()"
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        sid = c.post("/sessions").json()["id"]
        (display,) = execute(c, sid, code).named("display")
    assert "<svg" in display["data"]["image/svg+xml"]
    png = base64.b64decode(display["data"]["image/png"])
    width = int.from_bytes(png[16:20], "big")
    assert width < 4 * 50 + 20  # 4 inches at 50 dpi, give or take the tight bbox


def test_seaborn_chart_is_shown(client: httpx.Client, session_id: str) -> None:
    code = "import seaborn as sns\nsns.barplot(x=['a', 'b'], y=[1, 2])"
    stream = execute(client, session_id, code)
    assert stream.done["status"] == "ok", stream.named("error")
    assert any("image/png" in d["data"] for d in stream.named("display"))


def test_excel_file_is_reported(client: httpx.Client, session_id: str) -> None:
    code = "import pandas as pd\npd.DataFrame({'a': [1]}).to_excel('t.xlsx', index=False)"
    stream = execute(client, session_id, code)
    (event,) = stream.named("file")
    assert event["mime"] == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    assert client.get(event["url"]).content[:2] == b"PK"
