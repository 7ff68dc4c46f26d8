"""A package index on the host's loopback serving one wheel made here: what a template's
`pip install` fetches in tests (no test reaches the internet)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import threading
import uuid
import zipfile
from collections.abc import Iterator

import pytest


def wheel(name: str, version: str, source: str) -> tuple[str, bytes]:
    """A pure-Python wheel of one module (`name/__init__.py` holding `source`)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    records = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist}/RECORD"] = ("\n".join([*records, f"{dist}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


@pytest.fixture
def package_index() -> Iterator[tuple[str, str]]:
    """A PEP 503 index on 127.0.0.1 serving one wheel: (its URL, the package's name)."""
    package = f"kgdemo{uuid.uuid4().hex[:6]}"
    filename, data = wheel(package, "1.0", "VALUE = 'from the index'\n")

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == f"/simple/{package}":
                body = f'<a href="/files/{filename}">{filename}</a>'.encode()
                kind = "text/html"
            elif self.path == f"/files/{filename}":
                body, kind = data, "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", package
    finally:
        server.shutdown()
        server.server_close()
