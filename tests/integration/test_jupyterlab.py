"""JupyterLab, started with `--gateway-url` at our gateway, driven in Chromium by Playwright.

A person opens a notebook, runs a cell that draws a chart, and sees the image;
then a cell that prints and one that raises. Skipped when JupyterLab or Chromium
is not installed (both are with the test extra and `.ci/run`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest

from tests.support.backends import settings_for
from tests.support.jupyter import jupyter_process
from tests.support.server import ServerThread

TOKEN = "lab-gateway-token"
CHROMIUM = Path("/usr/bin/chromium")
OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "jupyterlab"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _require(condition: bool, message: str) -> None:
    if condition:
        return
    if os.environ.get("KG_REQUIRE_BROWSER") == "1":
        pytest.fail(f"KG_REQUIRE_BROWSER=1 but {message}")
    pytest.skip(message)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerThread, Path]]:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        _require(False, "JupyterLab is not installed (pip install jupyterlab)")
    _require(CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    root = tmp_path_factory.mktemp("lab-root")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nplt.plot([1, 4, 2, 5])\nplt.title('from the gateway')"
        ),
        nbformat.v4.new_code_cell("print('hello from', 6 * 7)"),
        nbformat.v4.new_code_cell("1 / 0"),
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / "chart.ipynb")
    settings = settings_for("local", tmp_path_factory.mktemp("rt-lab"), token=TOKEN, pool_size=1)
    with (
        ServerThread(settings) as gateway,
        jupyter_process("jupyterlab", gateway.url, TOKEN, root) as url,
    ):
        yield url, gateway, root


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield instance
        instance.close()


def test_jupyterlab_runs_a_chart_cell_on_the_gateway(
    lab: tuple[str, ServerThread, Path], browser: Any
) -> None:
    url, gateway, _ = lab
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{url}/lab/tree/chart.ipynb", timeout=120_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        # The kernel is one of the gateway's sessions, and idle once JupyterLab connected.
        page.wait_for_selector("text=Python 3 (sandboxed) | Idle", timeout=120_000)
        headers = {"Authorization": f"token {TOKEN}"}
        kernels = httpx.get(f"{gateway.url}/api/kernels", headers=headers).json()
        assert len(kernels) == 1 and kernels[0]["connections"] >= 1

        page.click(".jp-Notebook .jp-Cell >> nth=0")
        page.keyboard.press("Escape")
        for _ in range(3):
            page.keyboard.press("Shift+Enter")
        image = page.wait_for_selector(
            ".jp-Cell >> nth=0 >> .jp-OutputArea-output img", timeout=60_000
        )
        assert image is not None
        assert (image.get_attribute("src") or "").startswith("data:image/png;base64,")
        assert page.evaluate("(img) => img.naturalWidth", image) > 100
        page.wait_for_selector(".jp-Cell >> nth=1 >> text=hello from 42", timeout=60_000)
        page.wait_for_selector(".jp-Cell >> nth=2 >> text=ZeroDivisionError", timeout=60_000)
    finally:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "chart.png"), full_page=True)
        context.close()
