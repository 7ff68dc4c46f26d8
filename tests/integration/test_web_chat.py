"""The web UI's Ask mode in real headless Chromium: a scripted model writes the code, the
session runs it, the page shows the model's Markdown, its cell and chart, and its answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_web import OUTPUT, browser, run_cell
from tests.support.scripted_model import Reply, ScriptedModel, last_tool_output, last_user_text
from tests.support.server import ServerFactory, ServerThread

__all__ = ["browser"]  # the module's Chromium, shared with test_web

CHART = (
    "import pandas as pd\n"
    "import matplotlib.pyplot as plt\n"
    "sales = pd.read_csv('sales.csv')\n"
    "plt.plot(sales['month'], sales['amount'])\n"
    "plt.title('sales')\n"
    "plt.show()\n"
    "print('total', sales['amount'].sum())"
)
CSV = "month,amount\n1,10\n2,30\n3,20\n"
# A long answer that drew slowly (every piece drew it all again; a run of `*a` took
# quadratic time) or not at all (a deep nest of quotes overflowed the stack).
LONG = (
    "".join(
        f"{n}. **bold {n}** and *em* and _under_ and `code` and ~~gone~~, *a *a __b\n"
        for n in range(1, 301)
    )
    + "\n"
    + "*a " * 4000
    + "\n\n"
    + ">" * 5000
    + " deep\n\n- last *list*\n  - nested **item**\n\nTHE END"
)


def script(request: dict[str, Any]) -> Reply:
    output = last_tool_output(request)
    if output is None:
        if "stop me" in last_user_text(request):
            return Reply(text="Working on it.", code=["import time\ntime.sleep(60)"])
        if "break" in last_user_text(request):
            return Reply(status=500)
        if "long answer" in last_user_text(request):
            return Reply(text=LONG)
        if "hello" in last_user_text(request):
            return Reply(text="Hello **there**.")
        return Reply(
            text="I will plot **sales** by month from `sales.csv`:\n\n- read it\n- plot it",
            code=[CHART],
        )
    return Reply(text=f"## Done\n\nThe chart is above; the *total* is in its output ({output!r}).")


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(script) as scripted:
        yield scripted


@pytest.fixture(scope="module")
def server(servers: ServerFactory, model: ScriptedModel) -> ServerThread:
    return servers("local", pool_size=1, llm_url=model.url, llm_model="scripted")


@pytest.fixture
def page(browser: Any, server: ServerThread, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 1000})
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


def drop_file(page: Any, name: str, text: str) -> None:
    """Drop a file on the page as a person dragging it from their desktop would."""
    page.evaluate(
        """([name, text]) => {
            const data = new DataTransfer();
            data.items.add(new File([text], name, { type: "text/csv" }));
            const target = document.getElementById("chat");
            for (const type of ["dragover", "drop"]) {
                const init = { dataTransfer: data, bubbles: true, cancelable: true };
                target.dispatchEvent(new DragEvent(type, init));
            }
        }""",
        [name, text],
    )


def ask(page: Any, question: str) -> Any:
    count = page.locator(".turn").count()
    page.fill("#code", question)
    page.press("#code", "Enter")
    return page.locator(".turn").nth(count)


def test_ask_for_a_chart_of_a_dropped_csv(page: Any, model: ScriptedModel) -> None:
    assert page.is_visible("#mode")
    assert page.get_attribute("#mode button[data-mode='ask']", "aria-pressed") == "true"
    drop_file(page, "sales.csv", CSV)
    page.wait_for_selector("#attachments .chip[data-state='ready']:has-text('sales.csv')")
    turn = ask(page, "Plot sales by month")
    reply = turn.locator(".reply")
    page.wait_for_selector(".reply[data-status='answered']", timeout=60_000)
    assert turn.locator(".cell .chip:has-text('sales.csv')").count() == 1
    assert page.locator("#attachments .chip").count() == 0  # sent with the message
    first = reply.locator(".md").first
    assert first.locator("strong").inner_text() == "sales"  # **sales**
    assert first.locator("code").inner_text() == "sales.csv"
    assert first.locator("li").all_inner_texts() == ["read it", "plot it"]
    cell = reply.locator(".model-cell")
    assert cell.count() == 1
    assert cell.locator("details").get_attribute("open") is None  # the code collapsed
    assert "plt.plot" in cell.locator("details pre").text_content()
    img = cell.locator(".answer img.output-image")
    img.wait_for()
    assert img.get_attribute("src").startswith("data:image/png")
    assert page.evaluate("(img) => img.complete && img.naturalWidth", img.element_handle()) > 0
    assert "total 60" in cell.locator(".stream.stdout").inner_text()
    final = reply.locator(".md").last
    assert final.locator("h2").inner_text() == "Done"
    assert final.locator("em").inner_text() == "total"
    body = model.requests[0]
    assert "sales.csv" in json.dumps(body["messages"])  # the model was told of the file
    # Edit: the model's code comes back into the composer, in Code mode, to run as a cell.
    cell.locator("button.edit").click()
    assert page.get_attribute("#mode button[data-mode='code']", "aria-pressed") == "true"
    assert page.input_value("#code") == CHART
    answer = run_cell(page, page.input_value("#code") + "\nprint(len(sales))")
    assert "3" in answer.locator(".stream.stdout").inner_text()


def test_stop_ends_the_turn_and_a_queued_ask_runs_after_it(page: Any) -> None:
    turn = ask(page, "stop me")
    turn.locator(".model-cell .answer").wait_for(timeout=30_000)
    queued = ask(page, "hello")
    assert queued.get_attribute("data-state") == "queued"
    assert page.inner_text("#interrupt") == "Stop ■"
    page.click("#interrupt")
    page.wait_for_selector(".reply[data-status='interrupted']", timeout=20_000)
    assert "Stopped" in turn.locator(".turn-end").inner_text()
    queued.locator(".reply[data-status='answered']").wait_for(timeout=60_000)
    assert queued.locator(".md strong").inner_text() == "there"
    assert page.is_hidden("#interrupt")


def test_a_running_turn_is_picked_up_after_a_reload(page: Any) -> None:
    turn = ask(page, "stop me")
    turn.locator(".model-cell .answer").wait_for(timeout=30_000)
    page.reload()
    page.wait_for_selector(".system:has-text('Reconnected')")
    resumed = page.locator(".turn").last
    resumed.locator(".model-cell .answer").wait_for(timeout=30_000)
    assert resumed.locator(".cell").inner_text().strip() == "stop me"
    assert resumed.locator(".md").first.inner_text() == "Working on it."
    page.click("#interrupt")
    resumed.locator(".reply[data-status='interrupted']").wait_for(timeout=20_000)


def test_a_long_answer_streams_without_freezing_the_page(page: Any) -> None:
    assert len(LONG) > 30_000
    turn = ask(page, "a long answer please")
    turn.locator(".reply[data-status='answered']").wait_for(timeout=120_000)
    words = turn.locator(".md")
    assert words.count() == 1
    assert words.locator("p").last.inner_text() == "THE END"
    assert words.locator("strong:has-text('bold 300')").count() == 1
    # quotes nested deeper than the renderer draws are words
    assert 15 <= words.locator("blockquote").count() <= 25
    assert words.locator("blockquote p").last.inner_text().endswith("> deep")
    # drawn piece by piece, the answer is what drawing it whole gives
    same = page.evaluate(
        """([words, text]) => {
            const box = document.createElement("div");
            box.appendChild(markdown(text));
            return box.innerHTML === words.innerHTML;
        }""",
        [words.element_handle(), LONG],
    )
    assert same
    again = ask(page, "hello")
    again.locator(".reply[data-status='answered']").wait_for(timeout=30_000)
    assert again.locator(".md strong").inner_text() == "there"


def test_a_part_that_cannot_be_drawn_is_shown_and_the_rest_drawn(page: Any) -> None:
    resumes: list[str] = []
    page.on("request", lambda r: resumes.append(r.url) if "/chat/events" in r.url else None)
    page.evaluate(
        """() => {
            const addWords = ChatTurn.prototype.addWords;
            let pieces = 0;
            ChatTurn.prototype.addWords = function (text) {
                if (++pieces === 2) throw new Error("cannot draw this");
                return addWords.call(this, text);
            };
        }"""
    )
    turn = ask(page, "hello")
    turn.locator(".reply[data-status='answered']").wait_for(timeout=30_000)
    assert "cannot draw this" in turn.locator(".error-block").inner_text()
    assert turn.locator(".md").inner_text().startswith("Hello ")  # the pieces after it
    assert turn.locator(".md").inner_text().endswith(".")
    assert resumes == []  # not taken for a broken stream


def test_a_model_error_is_shown_and_the_session_stays_usable(page: Any) -> None:
    turn = ask(page, "break")
    turn.locator(".reply[data-status='model_error']").wait_for(timeout=30_000)
    said = turn.locator(".turn-end").inner_text()
    assert said.startswith("The model could not answer: ") and len(said) > 30
    again = ask(page, "hello")
    again.locator(".reply[data-status='answered']").wait_for(timeout=30_000)


MARKDOWN_CASES = """
# Title
Some **bold**, *em*, `code` and a [good link](https://example.com/a?b=1).
A [bad link](javascript:alert(1)) and <img src=x onerror="window.__pwned=1"> as words.

```python
print("<b>not bold</b>")
```

1. one
2. two

| a | b |
|---|--:|
| 1 | 2 |
"""


def test_the_markdown_renderer_builds_nodes_never_html(page: Any) -> None:
    html = page.evaluate(
        """(text) => {
            const box = document.createElement("div");
            box.appendChild(markdown(text));
            document.body.appendChild(box);
            return box.innerHTML;
        }""",
        MARKDOWN_CASES,
    )
    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "<code>code</code>" in html
    assert (
        '<a href="https://example.com/a?b=1" target="_blank" rel="noopener noreferrer">'
        "good link</a>" in html
    )
    assert "javascript" not in html.split("bad link")[0]  # no href but http(s)
    assert "<img" not in html and "&lt;img src=x" in html
    assert '<code data-language="python">print("&lt;b&gt;not bold&lt;/b&gt;")</code>' in html
    assert "<ol><li>one</li><li>two</li></ol>" in html
    assert '<td style="text-align: right;">2</td>' in html
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_without_a_model_the_page_says_how_to_turn_it_on(
    browser: Any, servers: ServerFactory
) -> None:
    plain = servers("local", pool_size=1)
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(plain.url + "/")
        page.wait_for_selector("#session-state:has-text('idle')")
        assert page.is_hidden("#mode")
        hint = page.inner_text("#chat-hint")
        assert "--llm-url" in hint and "--llm-model" in hint
        answer = run_cell(page, "print('code as ever')")
        assert answer.locator(".stream").inner_text() == "code as ever\n"
    finally:
        context.close()
