"""The browser UI: `/` and `/static/*`, shipped inside the package (kernel_gateway.web).

The page is public (it holds no data; every API call it makes needs the token)
and is served with a strict Content-Security-Policy: only its own script runs.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from kernel_gateway.http.operations import Operation, Reply, Surface

WEB_DIR = Path(str(files("kernel_gateway.web")))

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "frame-src 'self' data: blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def index(request: Request) -> Response:
    return FileResponse(WEB_DIR / "index.html", headers=HEADERS)


OPERATIONS = (
    Operation(
        "get",
        "/",
        index,
        "webUI",
        summary="The browser UI (public: the page holds no data).",
        tags=("web",),
        public=True,
        replies=(Reply(200, "The page.", content={"text/html": {"schema": {}}}),),
    ),
)
SURFACE = Surface(
    "/static",
    "the web UI's own files (HTML, CSS, JavaScript), public and not part of the API",
    [Mount("/static", app=StaticFiles(directory=WEB_DIR), name="static")],
)
