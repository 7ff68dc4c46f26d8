"""The browser UI in real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.backends import require_languages, settings_for
from tests.support.server import CuttableProxy, ServerFactory, ServerThread

CHROMIUM = Path("/usr/bin/chromium")
OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "web"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("KG_REQUIRE_BROWSER") == "1":
            pytest.fail(f"KG_REQUIRE_BROWSER=1 but {message}")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield instance
        instance.close()


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", pool_size=2, max_sessions=16)


@pytest.fixture
def page(browser: Any, server: ServerThread, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#session-state:has-text('idle')")
    yield page
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / f"{request.node.name}.png"), full_page=True)
    sid = page.evaluate("sessionStorage.getItem('kg-session')")
    context.close()
    if sid:
        httpx.delete(f"{server.url}/sessions/{sid}")


def run_cell(page: Any, code: str, wait: bool = True) -> Any:
    """Type a cell, run it with Shift+Enter, and return its answer element."""
    count = page.locator(".turn").count()
    page.fill("#code", code)
    page.press("#code", "Shift+Enter")
    answer = page.locator(".turn").nth(count).locator(".answer")
    if wait:
        answer.locator(".done").wait_for(timeout=30_000)
    return answer


def test_print_appears(page: Any) -> None:
    answer = run_cell(page, "print('hi')")
    assert answer.locator(".stream.stdout").inner_text() == "hi\n"
    assert answer.get_attribute("data-status") == "ok"
    assert "Variables persist" in page.inner_text("#notice")


def test_output_is_live(page: Any) -> None:
    answer = run_cell(
        page, "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')", wait=False
    )
    answer.locator(".stream:has-text('first')").wait_for(timeout=10_000)
    assert answer.locator(".done").count() == 0  # still running
    assert "second" not in answer.inner_text()
    assert page.is_visible("#interrupt")
    answer.locator(".done").wait_for(timeout=10_000)
    assert "second" in answer.inner_text()


def test_chart_is_an_image(page: Any) -> None:
    answer = run_cell(page, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    img = answer.locator("img.output-image")
    img.wait_for()
    assert page.evaluate("(img) => img.complete && img.naturalWidth", img.element_handle()) > 0


def test_traceback_is_shown(page: Any) -> None:
    answer = run_cell(page, "1/0")
    block = answer.locator(".error-block")
    assert "ZeroDivisionError" in block.inner_text()
    assert "\x1b" not in block.inner_text()  # ANSI codes became colours
    assert answer.get_attribute("data-status") == "error"


def test_html_output_cannot_run_script(page: Any) -> None:
    answer = run_cell(
        page,
        "from IPython.display import HTML, display\n"
        "display(HTML('<img src=x onerror=\"window.parent.__pwned=1; window.__pwned=1\">'))",
    )
    frame = answer.locator("iframe.html-output")
    frame.wait_for()
    assert frame.get_attribute("sandbox") == "allow-same-origin"
    time.sleep(0.5)  # give an onerror handler every chance to fire
    assert page.evaluate("typeof window.__pwned") == "undefined"
    svg = run_cell(
        page,
        "from IPython.display import SVG, display\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
        '<script>parent.__pwned=2</script><rect width="10" height="10"/></svg>\'))',
    )
    assert svg.locator("img.output-image").count() == 1
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_interrupt_a_long_sleep(page: Any) -> None:
    answer = run_cell(page, "import time\ntime.sleep(60)", wait=False)
    page.wait_for_selector("#interrupt:visible")
    time.sleep(0.5)
    started = time.monotonic()
    page.click("#interrupt")
    answer.locator(".done").wait_for(timeout=10_000)
    assert time.monotonic() - started < 5
    assert answer.get_attribute("data-status") == "interrupted"


def test_state_persists_and_survives_a_reload(page: Any) -> None:
    run_cell(page, "kept = 'across reloads'")
    page.reload()
    page.wait_for_selector(".system:has-text('Reconnected')")
    answer = run_cell(page, "print(kept)")
    assert answer.locator(".stream").inner_text() == "across reloads\n"


def test_files_and_restart(page: Any) -> None:
    answer = run_cell(
        page,
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2]}).to_csv('table.csv')\n"
        "pd.DataFrame({'a': [1, 2]})",
    )
    assert answer.locator(".file-link a:has-text('table.csv')").count() == 1
    assert answer.locator("iframe.html-output").count() == 1  # the DataFrame's HTML
    page.click("#restart")
    page.wait_for_selector(".system:has-text('Kernel restarted')")
    after = run_cell(page, "print('pd' in globals())")
    assert after.locator(".stream").inner_text() == "False\n"


def test_errors_from_the_api_are_shown(page: Any, server: ServerThread) -> None:
    sid = page.evaluate("sessionStorage.getItem('kg-session')")
    httpx.delete(f"{server.url}/sessions/{sid}")
    answer = run_cell(page, "print('recovered')")
    assert answer.locator(".stream").inner_text() == "recovered\n"
    assert page.locator(".system:has-text('expired')").count() == 1


def test_phone_width(browser: Any, server: ServerThread) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#session-state:has-text('idle')")
    answer = run_cell(page, "print('small screen')")
    assert answer.locator(".stream").inner_text() == "small screen\n"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / "test_phone_width.png"))
    context.close()


def test_token_is_asked_once(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = settings_for(
        "local", tmp_path_factory.mktemp("webtok"), token="let-me-in", pool_size=1
    )
    with ServerThread(settings) as secured:
        context = browser.new_context()
        page = context.new_page()
        page.goto(secured.url + "/")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", "let-me-in")
        page.click("#token-form button")
        page.wait_for_selector("#session-state:has-text('idle')")
        answer = run_cell(page, "print('authorised')")
        assert answer.locator(".stream").inner_text() == "authorised\n"
        page.reload()
        page.wait_for_selector(".system:has-text('Reconnected')")
        assert page.locator("#token-dialog[open]").count() == 0
        context.close()


def test_chat_with_text_chart_and_traceback(browser: Any, server: ServerThread) -> None:
    """The picture in the README: text output, a chart and a traceback in one chat."""
    context = browser.new_context(viewport={"width": 1100, "height": 1250})
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#session-state:has-text('idle')")
    run_cell(
        page,
        "import pandas as pd\nsales = pd.Series([12, 19, 7, 24], "
        "index=['Q1', 'Q2', 'Q3', 'Q4'])\nprint(sales.describe().round(1).to_string())",
    )
    chart = run_cell(
        page,
        "import matplotlib.pyplot as plt\n"
        "sales.plot.bar(color='#6366f1', title='Sales by quarter')\n"
        "plt.tight_layout(); plt.show()",
    )
    chart.locator("img.output-image").wait_for()
    error = run_cell(page, "growth = int('twelve percent')")
    assert "ValueError" in error.locator(".error-block").inner_text()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / "chat.png"))
    context.close()


# -- one session per page, cells in order ------------------------------------------------------


def session_ids(server: ServerThread) -> set[str]:
    sessions = httpx.get(f"{server.url}/sessions", timeout=30).json()["sessions"]
    return {str(s["id"]) for s in sessions}


def test_a_cell_sent_during_the_first_start_uses_the_same_session(
    browser: Any, server: ServerThread
) -> None:
    """A cold start is held open (the page's `POST /sessions` waits in the route) while a
    cell is sent: the cell waits for that session, and no second one is started."""
    before = session_ids(server)
    held: list[Any] = []

    def hold(route: Any) -> None:
        if route.request.method == "POST":
            held.append(route)
        else:
            route.continue_()

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    try:
        page.route("**/sessions", hold)
        page.goto(server.url + "/")
        page.wait_for_selector("#session-state:has-text('starting')")
        answer = run_cell(page, "print('after the cold start')", wait=False)
        page.wait_for_timeout(1500)  # a second start would have been asked for by now
        assert len(held) == 1
        assert answer.locator(".done").count() == 0
        held[0].continue_()
        answer.locator(".done").wait_for(timeout=30_000)
        assert answer.locator(".stream.stdout").inner_text() == "after the cold start\n"
        assert len(held) == 1
        assert page.locator(".system", has_text="New session started.").count() == 1
        assert page.locator(".system").count() == 1  # no stray messages
        sid = page.evaluate("sessionStorage.getItem('kg-session')")
        assert session_ids(server) - before == {sid}
    finally:
        context.close()
        for sid in session_ids(server) - before:
            httpx.delete(f"{server.url}/sessions/{sid}")


def test_a_cell_sent_while_another_runs_is_queued_and_runs_after_it(page: Any) -> None:
    first = run_cell(page, "import time\ntime.sleep(2)\nfirst_done = True\nprint('a')", wait=False)
    page.wait_for_selector("#session-state:has-text('running')")
    second = run_cell(page, "print('b', first_done)", wait=False)
    assert page.input_value("#code") == ""  # taken, not left in the box
    turns = page.locator(".turn")
    assert turns.count() == 2
    assert turns.nth(1).get_attribute("data-state") == "queued"
    assert first.locator(".done").count() == 0
    first.locator(".done").wait_for(timeout=30_000)
    second.locator(".done").wait_for(timeout=30_000)
    assert first.locator(".stream.stdout").inner_text() == "a\n"
    assert second.locator(".stream.stdout").inner_text() == "b True\n"
    assert second.get_attribute("data-status") == "ok"


def test_interrupt_stops_the_running_cell_and_keeps_the_queued_one(page: Any) -> None:
    first = run_cell(page, "import time\ntime.sleep(60)", wait=False)
    page.wait_for_selector("#session-state:has-text('running')")
    second = run_cell(page, "print('still queued')", wait=False)
    third = run_cell(page, "print('taken back')", wait=False)
    page.locator(".turn").nth(2).locator(".unqueue").click()
    assert page.locator(".turn").count() == 2
    assert page.input_value("#code") == "print('taken back')"
    time.sleep(0.5)
    page.click("#interrupt")
    first.locator(".done").wait_for(timeout=10_000)
    assert first.get_attribute("data-status") == "interrupted"
    second.locator(".done").wait_for(timeout=30_000)
    assert second.locator(".stream.stdout").inner_text() == "still queued\n"
    assert third.count() == 0


# -- resuming streams ------------------------------------------------------------------------

SLOW_CELL = (
    "import time\nfor i in range(40):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n"
)
SLOW_TEXT = "".join(f"line {i}\n" for i in range(40))


@pytest.fixture
def proxy(server: ServerThread) -> Iterator[CuttableProxy]:
    proxy = CuttableProxy(server.url)
    yield proxy
    proxy.close()


def test_a_native_event_source_resumes_after_its_connection_is_killed(
    browser: Any, server: ServerThread, proxy: CuttableProxy
) -> None:
    sid = httpx.post(f"{server.url}/sessions", timeout=60).json()["id"]
    url = f"{server.url}/sessions/{sid}/execute"
    with httpx.stream("POST", url, json={"code": SLOW_CELL}, timeout=60) as response:
        events = response.headers["content-location"]  # dropped at once: it runs on (grace)
    context = browser.new_context()
    page = context.new_page()
    page.goto(proxy.url + "/static/favicon.svg")  # a page of the gateway's origin
    page.evaluate(
        """(url) => {
            window.got = []; window.opens = 0; window.finished = false;
            const es = new EventSource(url);
            es.onopen = () => { window.opens += 1; };
            for (const name of ["stdout", "done"]) {
                es.addEventListener(name, (e) => {
                    window.got.push([Number(e.lastEventId), name, JSON.parse(e.data)]);
                    if (name === "done") { es.close(); window.finished = true; }
                });
            }
        }""",
        events,
    )
    page.wait_for_function("window.got.length >= 5", timeout=20_000)
    proxy.cut()  # the browser's connection dies mid-stream; EventSource reconnects itself
    page.wait_for_function("window.finished", timeout=40_000)
    got = page.evaluate("window.got")
    context.close()
    httpx.delete(f"{server.url}/sessions/{sid}")
    assert page_text(got) == SLOW_TEXT  # every line once, in order
    ids = [event_id for event_id, _, _ in got]
    assert ids == sorted(set(ids))
    assert got[-1][2]["status"] == "ok"  # resumed within the grace: never interrupted


def page_text(got: list[Any]) -> str:
    return "".join(data["text"] for _, name, data in got if name == "stdout")


def test_the_ui_resumes_a_running_cell_after_a_network_drop(
    browser: Any, proxy: CuttableProxy
) -> None:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(proxy.url + "/")
    page.wait_for_selector("#session-state:has-text('idle')")
    answer = run_cell(page, SLOW_CELL, wait=False)
    answer.locator(".stream.stdout", has_text="line 3\n").wait_for(timeout=20_000)
    proxy.cut()
    answer.locator(".done").wait_for(timeout=40_000)
    assert answer.get_attribute("data-status") == "ok"
    assert answer.locator(".stream.stdout").inner_text() == SLOW_TEXT
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / "resume-after-network-drop.png"), full_page=True)
    context.close()


def test_the_ui_picks_up_a_running_cell_after_a_reload(page: Any) -> None:
    answer = run_cell(page, SLOW_CELL, wait=False)
    answer.locator(".stream.stdout", has_text="line 3\n").wait_for(timeout=20_000)
    page.reload()
    resumed = page.locator(".turn .answer").last
    resumed.locator(".done").wait_for(timeout=40_000)
    assert resumed.get_attribute("data-status") == "ok"
    assert resumed.locator(".stream.stdout").inner_text() == SLOW_TEXT


def test_a_session_of_another_language_is_picked_in_the_header(
    browser: Any, servers: ServerFactory
) -> None:
    """The language menu lists what the gateway runs; picking R starts an R session, whose
    output and charts render as Python's do, and a reload keeps it."""
    require_languages("r")
    server = servers("docker", pool_size=1, max_sessions=8)
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    try:
        page.goto(server.url + "/")
        page.wait_for_selector("#session-state:has-text('idle')")
        options = page.eval_on_selector_all("#language option", "os => os.map(o => o.value)")
        assert options[0] == "python" and "r" in options
        assert page.input_value("#language") == "python"
        page.select_option("#language", "r")
        page.wait_for_selector("#session-id:has-text('R session')")
        page.wait_for_selector("#session-state:has-text('idle')")
        assert "New R session started" in page.inner_text("#chat")
        assert page.get_attribute("#code", "placeholder").startswith("R code")
        answer = run_cell(page, "x <- 41\ncat(x + 1, '\\n')")
        assert answer.locator(".stream.stdout").inner_text().strip() == "42"
        answer = run_cell(page, "plot(1:10)")
        assert answer.locator("img").first.get_attribute("src").startswith("data:image/png")
        sid = page.evaluate("sessionStorage.getItem('kg-session')")
        assert httpx.get(f"{server.url}/sessions/{sid}").json()["language"] == "r"
        page.reload()
        page.wait_for_selector("#session-state:has-text('idle')")
        assert page.input_value("#language") == "r"
        answer = run_cell(page, "cat(x, '\\n')")
        assert answer.locator(".stream.stdout").inner_text().strip() == "41"
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "language-picker.png"), full_page=True)
    finally:
        context.close()
