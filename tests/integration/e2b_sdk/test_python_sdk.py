"""E2B's own Python SDK (`e2b-code-interpreter`), unchanged, against a gateway's `/e2b`: only
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the gateway.

This module imports nothing of ours, so it runs twice: in the project's venv with the newest
SDK (`conftest.py` here starts a gateway on the docker backend and sets the variables), and
with the oldest SDK that honours E2B_SANDBOX_URL, in a venv of its own that has only the SDK
and pytest, driven by `tests/integration/test_e2b_sdks.py` against a gateway it started.
"""

from __future__ import annotations

import base64
import importlib
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

e2b = pytest.importorskip("e2b_code_interpreter")
exceptions = pytest.importorskip("e2b.exceptions")
e2b_core = pytest.importorskip("e2b")


@pytest.fixture(scope="module")
def sandbox_url() -> str:
    """The gateway's data plane, as the SDK reads it (set by conftest.py or the caller)."""
    return os.environ["E2B_SANDBOX_URL"]


@pytest.fixture
def sandbox() -> Iterator[Any]:
    sbx = e2b.Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


def test_state_live_output_charts_and_errors(sandbox: Any) -> None:
    assert sandbox.run_code("x = 41").error is None
    assert sandbox.run_code("x + 1").text == "42"
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    execution = sandbox.run_code(
        "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')",
        on_stdout=lambda out: arrivals.append((time.monotonic() - started, str(out.line))),
    )
    assert execution.logs.stdout == ["first\n", "second\n"]
    assert arrivals[1][0] - arrivals[0][0] > 1.5, arrivals  # the first came live
    chart = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert chart.results and base64.b64decode(chart.results[0].png).startswith(PNG_MAGIC)
    failed = sandbox.run_code("1 / 0")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", failed.error.traceback)  # colored, as E2B's is
    assert failed.error.name == "ZeroDivisionError" and "1 / 0" in plain, plain
    assert sandbox.run_code("x").text == "41"  # the kernel lives on


def test_charts_and_tables_carry_their_data(sandbox: Any) -> None:
    line = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [2, 4, 8], label='growth')\n"
        "plt.title('Growth'); plt.xlabel('Time (s)'); plt.ylabel('Size')\n"
        "plt.show()"
    )
    chart = line.results[0].chart
    assert chart is not None and chart.type.value == "line", line.results[0].formats()
    assert (chart.title, chart.x_label, chart.x_unit, chart.y_label) == (
        "Growth",
        "Time (s)",
        "s",
        "Size",
    )
    assert [(e.label, e.points) for e in chart.elements] == [
        ("growth", [(1.0, 2.0), (2.0, 4.0), (3.0, 8.0)])
    ]
    assert line.results[0].png  # the picture still comes
    bars = (
        sandbox.run_code(
            "fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5], label='sold')\nplt.show()"
        )
        .results[0]
        .chart
    )
    assert bars.type.value == "bar"
    assert [(e.label, e.group, e.value) for e in bars.elements] == [
        ("a", "sold", 3.0),
        ("b", "sold", 5.0),
    ]
    pie = sandbox.run_code("plt.pie([1, 3], labels=['x', 'y'])\nplt.show()").results[0].chart
    assert [(e.label, e.angle) for e in pie.elements] == [("x", 90.0), ("y", 270.0)]
    both = (
        sandbox.run_code(
            "fig, (a, b) = plt.subplots(1, 2)\na.plot([1, 2])\nb.scatter([1], [2])\n"
            "fig.suptitle('Two')\nplt.show()"
        )
        .results[0]
        .chart
    )
    assert both.type.value == "superchart" and both.title == "Two"
    assert [c.type.value for c in both.elements] == ["line", "scatter"]
    table = sandbox.run_code(
        "import pandas as pd\npd.DataFrame({'n': [1, None], 'name': ['a', 'b']})"
    ).results[0]
    assert table.data == {"n": [1.0, None], "name": ["a", "b"]} and table.html


def test_files_both_ways(sandbox: Any) -> None:
    sandbox.files.write("/home/user/data/in.csv", "a,b\n1,2\n")
    shown = sandbox.run_code("import pandas as pd\nprint(pd.read_csv('data/in.csv').sum().sum())")
    assert shown.logs.stdout == ["3\n"]
    sandbox.run_code("open('out.txt', 'w').write('from the kernel')")
    assert sandbox.files.read("out.txt") == "from the kernel"
    assert sandbox.files.read("/home/user/out.txt", format="bytes") == bytearray(b"from the kernel")
    names = {entry.name for entry in sandbox.files.list("/home/user")}
    assert {"data", "out.txt"} <= names
    assert sandbox.files.exists("out.txt") and not sandbox.files.exists("nope.txt")
    with pytest.raises(exceptions.FileNotFoundException):
        sandbox.files.read("missing.txt")


def test_folders_moves_removals_and_watching(sandbox: Any) -> None:
    assert sandbox.files.make_dir("/home/user/new/deeper")
    assert not sandbox.files.make_dir("new/deeper")  # there already: False, as E2B says
    written = sandbox.files.write("new/deeper/a.txt", "abc")
    assert written.path == "/home/user/new/deeper/a.txt"
    info = sandbox.files.get_info("new/deeper/a.txt")
    assert (info.name, info.size, info.type.value) == ("a.txt", 3, "file")
    moved = sandbox.files.rename("new/deeper/a.txt", "new/b.txt")
    assert moved.path == "/home/user/new/b.txt"
    assert sandbox.run_code("open('new/b.txt').read()").text == "abc"
    sandbox.files.remove("new")
    assert not sandbox.files.exists("new/b.txt") and not sandbox.files.exists("new")
    handle = sandbox.files.watch_dir("/home/user")
    try:
        sandbox.run_code("open('watched.txt', 'w').write('1')")
        deadline = time.monotonic() + 10
        names: set[str] = set()
        while "watched.txt" not in names:
            assert time.monotonic() < deadline, "no event for a file the kernel wrote"
            names |= {event.name for event in handle.get_new_events()}
            time.sleep(0.1)
    finally:
        handle.stop()


def test_paths_outside_home_are_the_sandboxs_own_files(sandbox: Any) -> None:
    # Read, written and listed in the sandbox, as its user: what the code there sees.
    assert ":x:1000:1000:" in sandbox.files.read("/etc/passwd")
    boot_id = sandbox.files.read("/proc/sys/kernel/random/boot_id").strip()
    assert boot_id == sandbox.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    written = sandbox.files.write("/tmp/deep/out.bin", b"\x00\xffbytes")
    assert written.path == "/tmp/deep/out.bin"
    assert sandbox.files.read("/tmp/deep/out.bin", format="bytes") == bytearray(b"\x00\xffbytes")
    assert sandbox.run_code("open('/tmp/deep/out.bin', 'rb').read()").text == "b'\\x00\\xffbytes'"
    info = sandbox.files.get_info("/tmp/deep/out.bin")
    assert (info.name, info.size, info.type.value, info.owner) == ("out.bin", 7, "file", "user")
    assert [e.name for e in sandbox.files.list("/tmp/deep")] == ["out.bin"]
    assert sandbox.files.exists("/tmp/deep") and not sandbox.files.exists("/tmp/nope")
    assert sandbox.files.make_dir("/tmp/made") and not sandbox.files.make_dir("/tmp/made")
    moved = sandbox.files.rename("/tmp/deep/out.bin", "/home/user/from-tmp.bin")
    assert moved.path == "/home/user/from-tmp.bin"
    assert sandbox.files.read("from-tmp.bin", format="bytes") == bytearray(b"\x00\xffbytes")
    sandbox.files.remove("/tmp/deep")
    assert not sandbox.files.exists("/tmp/deep")
    with pytest.raises(exceptions.FileNotFoundException):
        sandbox.files.read("/tmp/never-written")
    with pytest.raises(exceptions.SandboxException, match="Read-only file system"):
        sandbox.files.write("/etc/kg-not-allowed", "x")  # the container's own rules
    with pytest.raises(exceptions.SandboxException):
        sandbox.files.watch_dir("/tmp")  # watched under /home/user only


def test_a_cell_past_its_timeout_is_interrupted_and_the_kernel_lives(sandbox: Any) -> None:
    sandbox.run_code("kept = 'still here'")
    started = time.monotonic()
    with pytest.raises(exceptions.TimeoutException):
        sandbox.run_code("import time\nwhile True: time.sleep(0.1)", timeout=2)
    assert time.monotonic() - started < 10
    assert sandbox.run_code("kept").text == "still here"  # interrupted, not restarted


def test_the_sandbox_is_the_gateways_sandbox(sandbox: Any) -> None:
    shown = sandbox.commands.run(
        "id -u; ls /sys/class/net; touch /usr/x 2>/dev/null || echo read-only; "
        "getent hosts pypi.org || echo no-dns"
    )
    assert shown.stdout.split() == ["1000", "lo", "read-only", "no-dns"], shown.stdout
    refused = sandbox.run_code(
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "except OSError as e:\n    print('refused', type(e).__name__)"
    )
    assert refused.logs.stdout and refused.logs.stdout[0].startswith("refused")


def test_commands(sandbox: Any) -> None:
    done = sandbox.commands.run("echo hello; echo oops >&2; pwd; id -u")
    assert done.exit_code == 0
    assert done.stdout.split() == ["hello", "/home/user", "1000"]
    assert done.stderr == "oops\n"
    with pytest.raises(e2b_core.CommandExitException) as caught:
        sandbox.commands.run("exit 3")
    assert caught.value.exit_code == 3
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    sandbox.commands.run(
        "echo one; sleep 2; echo two",
        on_stdout=lambda line: seen.append((time.monotonic() - started, line)),
    )
    assert [line.strip() for _, line in seen] == ["one", "two"]
    assert seen[1][0] - seen[0][0] > 1.5  # streamed, not collected at the end
    sandbox.commands.run("echo made-by-bash > from-bash.txt")
    assert sandbox.run_code("print(open('from-bash.txt').read())").logs.stdout == [
        "made-by-bash\n\n"
    ]
    piped = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(piped.pid, "piped in\n")
    if hasattr(sandbox.commands, "close_stdin"):  # e2b >= 2.46 (envd 0.5.2)
        sandbox.commands.close_stdin(piped.pid)
        assert piped.wait().stdout == "piped in\n"
    else:
        piped.kill()
    background = sandbox.commands.run("sleep 60", background=True)
    assert background.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(background.pid)
    deadline = time.monotonic() + 10
    while background.pid in [p.pid for p in sandbox.commands.list()]:
        assert time.monotonic() < deadline, "the killed command still runs"
        time.sleep(0.1)
    with pytest.raises(e2b_core.CommandExitException) as killed:
        background.wait()  # its stream ends with the signal, at once, not after 60 s
    assert "killed" in str(killed.value.error), killed.value
    assert not sandbox.commands.kill(999999)
    # The process tools agents reach for (procps), as in E2B's sandboxes.
    listed = sandbox.commands.run("ps -eo user,args && pgrep -c -f kernel_launcher").stdout
    assert "sandbox" in listed and "kernel_launcher" in listed, listed


def test_a_kernel_killed_from_a_command_is_replaced_with_the_files_kept(sandbox: Any) -> None:
    """`pkill` on the kernel, as E2B's template recovers from with systemd: the cell that
    meets the dead kernel says so (`KernelDied`), commands meanwhile wait for the new one,
    and the next cells run on it, on the same files (the variables are gone)."""
    sandbox.files.write("kept.txt", "on disk")
    sandbox.run_code("x = 1")
    assert sandbox.commands.run("pkill -f kernel_launcher").exit_code == 0
    first = sandbox.run_code("open('kept.txt').read()")
    if first.error is not None:  # it reached the kernel before its death was seen
        assert first.error.name == "KernelDied", first.error
    assert sandbox.commands.run("cat kept.txt").stdout == "on disk"  # waits for the kernel
    after = sandbox.run_code("open('kept.txt').read(), 'x' in globals()")
    assert after.error is None and after.text == "('on disk', False)", after


def test_connect_list_timeout_pause_kill() -> None:
    sbx = e2b.Sandbox.create(timeout=60, metadata={"owner": "tests"})
    try:
        sbx.run_code("kept = 'yes'")
        again = e2b.Sandbox.connect(sbx.sandbox_id)  # a second client
        assert again.run_code("kept").text == "yes"
        listed = [s.sandbox_id for s in e2b.Sandbox.list(query=None).next_items()]
        assert sbx.sandbox_id in listed
        info = sbx.get_info()
        assert info.metadata == {"owner": "tests"} and info.state == "running"
        sbx.pause()  # True from e2b >= 2.46, None before
        assert sbx.get_info().state == "paused"
        resumed = e2b.Sandbox.connect(sbx.sandbox_id)
        assert resumed.run_code("kept").text == "yes"  # a paused sandbox keeps its variables
        sbx.set_timeout(2)
        deadline = time.monotonic() + 15
        while sbx.is_running():
            assert time.monotonic() < deadline, "the sandbox outlived its timeout"
            time.sleep(0.5)
        with pytest.raises(exceptions.SandboxException):
            sbx.get_info()
    finally:
        sbx.kill()
    assert e2b.Sandbox.kill(sbx.sandbox_id) is False  # already gone: False, as E2B says


def test_a_wrong_api_key_is_an_authentication_error() -> None:
    with pytest.raises(exceptions.AuthenticationException):
        e2b.Sandbox.create(api_key="not-the-token")


def test_one_sandboxs_token_cannot_drive_another(sandbox_url: str) -> None:
    first = e2b.Sandbox.create(timeout=60)
    second = e2b.Sandbox.create(timeout=60)
    try:
        stolen = first._envd_access_token
        headers = {
            "E2b-Sandbox-Id": second.sandbox_id,
            "E2b-Sandbox-Port": "49999",
            "X-Access-Token": stolen,
        }
        response = httpx.post(
            sandbox_url + "/execute", json={"code": "print('owned')"}, headers=headers, timeout=30
        )
        assert response.status_code == 401, response.text
        assert "owned" not in response.text
        envd = {**headers, "E2b-Sandbox-Port": "49983"}
        upload = httpx.post(
            sandbox_url + "/files",
            params={"path": "/home/user/planted.txt"},
            content=b"planted",
            headers={**envd, "Content-Type": "application/octet-stream"},
            timeout=30,
        )
        assert upload.status_code == 401, upload.text
        assert not second.files.exists("planted.txt")
    finally:
        first.kill()
        second.kill()


def test_two_sandboxes_run_at_once() -> None:
    results: dict[str, str] = {}

    def run(name: str) -> None:
        sbx = e2b.Sandbox.create(timeout=60)
        try:
            results[name] = sbx.run_code(f"import time; time.sleep(1); '{name}'").text
        finally:
            sbx.kill()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {"a": "a", "b": "b"}


def test_contexts_are_namespaces_of_their_own_on_the_same_files(sandbox: Any) -> None:
    sandbox.run_code("x = 'default'")
    other = sandbox.create_code_context()
    assert other.language == "python" and other.cwd == "/home/user"
    sandbox.run_code("x = 'other'", context=other)
    assert sandbox.run_code("x").text == "default"
    assert sandbox.run_code("x", context=other).text == "other"
    sandbox.run_code("open('shared.txt', 'w').write('seen by all')", context=other)
    assert sandbox.run_code("open('shared.txt').read()").text == "seen by all"
    ids = {c.id for c in sandbox.list_code_contexts()}
    assert other.id in ids
    sandbox.restart_code_context(other)
    assert sandbox.run_code("'x' in globals()", context=other).text == "False"
    sandbox.remove_code_context(other)
    assert other.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(exceptions.NotFoundException):
        sandbox.run_code("1", context=other)


def test_a_new_sandbox_lists_its_python_and_javascript_contexts(sandbox: Any) -> None:
    listed = {c.language: c for c in sandbox.list_code_contexts()}
    assert {"python", "javascript"} <= set(listed), listed
    assert listed["javascript"].cwd == "/home/user"
    js = listed["javascript"]
    assert sandbox.run_code("globalThis.kept = 6 * 7", context=js).text == "42"
    assert sandbox.run_code("kept", language="javascript").text == "42"  # the same context
    assert {c.id for c in sandbox.list_code_contexts()} == {c.id for c in listed.values()}
    moved = sandbox.create_code_context(cwd="/tmp", language="python")
    assert moved.cwd == "/tmp"
    assert sandbox.run_code("import os; os.getcwd()", context=moved).text == "/tmp"
    assert moved.cwd == next(c for c in sandbox.list_code_contexts() if c.id == moved.id).cwd


def test_run_code_in_a_sandbox_killed_meanwhile_raises_e2bs_error() -> None:
    sbx = e2b.Sandbox.create(timeout=60)
    sbx.run_code("x = 1")
    killer = threading.Timer(1.5, sbx.kill)
    killer.start()
    try:
        with pytest.raises(Exception) as caught:
            sbx.run_code("import time; time.sleep(30)", timeout=20)
    finally:
        killer.join()
    try:
        knows_killed = hasattr(
            importlib.import_module("e2b_code_interpreter.exceptions"),
            "format_sandbox_killed_error",
        )
    except ImportError:
        knows_killed = False
    if knows_killed:  # the newer SDKs check the sandbox after a dropped connection
        assert isinstance(caught.value, exceptions.TimeoutException), repr(caught.value)
        assert "sandbox was killed" in str(caught.value), caught.value
    else:  # older SDKs let the dropped connection through, as they do from E2B's cloud
        assert isinstance(caught.value, httpx.RemoteProtocolError), repr(caught.value)
    assert not sbx.is_running()


def test_run_code_takes_a_language(sandbox: Any) -> None:
    r = sandbox.run_code("x <- 41; cat(x + 1)", language="r")
    assert r.logs.stdout == ["42"]
    js = sandbox.run_code("const y: number = 2; y * 21", language="typescript")
    assert js.text == "42"
    shell = sandbox.run_code("echo $((6 * 7))", language="bash")
    assert shell.logs.stdout == ["42\n"]
    assert sandbox.run_code("x <- x + 1; cat(x)", language="r").logs.stdout == ["42"]
    with pytest.raises(exceptions.SandboxException, match="cobol"):
        sandbox.run_code("1", language="cobol")


def test_the_working_directory_is_home_user_in_every_language(sandbox: Any) -> None:
    """As in E2B's sandboxes, code starts in /home/user (`/workspace` names it too)."""
    sandbox.files.write("here.txt", "found")
    for language, show in (
        ("python", "import os; print(os.getcwd(), open('here.txt').read())"),
        ("r", 'cat(getwd(), readLines("here.txt", warn = FALSE))'),
        ("javascript", 'console.log(Deno.cwd(), Deno.readTextFileSync("here.txt"))'),
        ("typescript", 'console.log(Deno.cwd(), Deno.readTextFileSync("here.txt"))'),
        ("bash", "echo $(pwd -P) $(cat here.txt)"),
        (
            "java",
            'System.out.println(System.getProperty("user.dir") + " " + '
            'java.nio.file.Files.readString(java.nio.file.Path.of("here.txt")))',
        ),
    ):
        shown = sandbox.run_code(show, language=language)
        assert shown.error is None, (language, shown.error)
        assert "".join(shown.logs.stdout).split() == ["/home/user", "found"], (language, shown)
    assert sandbox.commands.run("cat /workspace/here.txt; pwd").stdout == "found/home/user\n"


def test_env_vars_apply_to_one_execution(sandbox: Any) -> None:
    shown = sandbox.run_code("import os; os.environ['ONLY_NOW']", envs={"ONLY_NOW": "yes"})
    assert shown.text == "yes"
    assert sandbox.run_code("import os; os.environ.get('ONLY_NOW', 'gone')").text == "gone"
    failed = sandbox.run_code("1 / 0", envs={"ONLY_NOW": "again"})
    assert failed.error.name == "ZeroDivisionError" and "__kg" not in failed.error.traceback
    assert sandbox.run_code("import os; os.environ.get('ONLY_NOW', 'gone')").text == "gone"
    assert "__kg" not in sandbox.run_code("print(sorted(globals()))").logs.stdout[0]


def test_env_vars_of_one_execution_in_other_languages() -> None:
    sbx = e2b.Sandbox.create(timeout=60, envs={"KEPT": "sandbox"})
    try:
        for language, show in (
            ("bash", 'echo "$ONLY_NOW/$KEPT"'),
            ("r", 'cat(Sys.getenv("ONLY_NOW", "gone"), Sys.getenv("KEPT"), sep = "/")'),
            (
                "javascript",
                'console.log(`${Deno.env.get("ONLY_NOW") ?? "gone"}/${Deno.env.get("KEPT")}`)',
            ),
        ):
            once = sbx.run_code(show, language=language, envs={"ONLY_NOW": "yes", "KEPT": "run"})
            assert "".join(once.logs.stdout).strip() == "yes/run", (language, once)
            after = "".join(sbx.run_code(show, language=language).logs.stdout).strip()
            assert after in ("/sandbox", "gone/sandbox"), (language, after)
        with pytest.raises(exceptions.SandboxException, match="fixed"):
            sbx.run_code("1", language="java", envs={"A": "b"})
    finally:
        sbx.kill()


def test_sandbox_env_vars_reach_code_and_commands() -> None:
    sbx = e2b.Sandbox.create(timeout=60, envs={"FROM_CREATE": "set"})
    try:
        assert sbx.run_code("import os; os.environ['FROM_CREATE']").text == "set"
        assert sbx.commands.run("echo $FROM_CREATE").stdout == "set\n"
        other = sbx.create_code_context()
        assert sbx.run_code("import os; os.environ['FROM_CREATE']", context=other).text == "set"
    finally:
        sbx.kill()


def test_a_killed_sandbox_says_so() -> None:
    sbx = e2b.Sandbox.create(timeout=60)
    sbx.run_code("x = 1")
    sbx.kill()
    assert not sbx.is_running()
    with pytest.raises(exceptions.SandboxException) as caught:
        sbx.run_code("x")
    assert "not found" in str(caught.value).lower(), caught.value
    with pytest.raises(exceptions.SandboxException):
        sbx.files.write("a.txt", "late")
    with pytest.raises(exceptions.SandboxException):
        sbx.commands.run("true")
    with pytest.raises(exceptions.NotFoundException):
        e2b.Sandbox.connect(sbx.sandbox_id)


def test_a_terminal_runs_keys_and_takes_a_new_size(sandbox: Any) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    def session(keys: bytes, resize_to: int | None = None) -> str:
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"ABC": "123"})
        if resize_to is not None:
            sandbox.pty.resize(terminal.pid, PtySize(rows=24, cols=resize_to))
        sandbox.pty.send_stdin(terminal.pid, keys)
        output: list[bytes] = []
        result = terminal.wait(on_pty=output.append)
        text = b"".join(output).decode()
        assert result.exit_code == 0, text
        return text

    # The terminal echoes the keys too; none of them holds these numbers.
    first = session(b"echo $ABC; tput cols; exit\n")
    assert "123" in first and "80" in first, first
    assert "100" in session(b"tput cols; exit\n", resize_to=100)


def test_signed_file_urls_need_no_other_credential(sandbox: Any) -> None:
    sandbox.files.write("shared.txt", "from the sandbox")
    url = sandbox.download_url("shared.txt")
    assert "signature=v1_" in url
    assert httpx.get(url).text == "from the sandbox"  # no key, no token: the signature
    upload = sandbox.upload_url("dropped.txt")
    sent = httpx.post(upload, files={"file": ("dropped.txt", b"from outside")})
    assert sent.status_code == 200, sent.text
    assert sandbox.files.read("dropped.txt") == "from outside"
    expired = httpx.get(sandbox.download_url("shared.txt", use_signature_expiration=-60))
    assert expired.status_code == 401
    assert expired.json() == {"code": 401, "message": "signature is already expired"}
    forged = httpx.get(url.replace("shared.txt", "other.txt", 1))
    assert forged.status_code == 401  # signed for another path
    assert httpx.get(url.split("&signature")[0]).status_code == 401


def test_metrics_are_the_sandboxs(sandbox: Any) -> None:
    metrics = sandbox.get_metrics()
    assert metrics, metrics
    last = metrics[-1]
    assert last.cpu_count >= 1 and 0 < last.mem_used < last.mem_total
    assert 0 < last.disk_used <= last.disk_total


def test_a_snapshot_starts_sandboxes_and_a_fork_copies_one(sandbox: Any) -> None:
    sandbox.run_code("plan = ['a', 'b']")
    sandbox.files.write("notes.txt", "kept")
    snapshot = sandbox.create_snapshot()
    try:
        started = e2b.Sandbox.create(snapshot.snapshot_id, timeout=60)
        try:
            assert started.run_code("plan").text == "['a', 'b']"
            assert started.files.read("notes.txt") == "kept"
        finally:
            started.kill()
        listed = e2b.Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()
        assert snapshot.snapshot_id in [s.snapshot_id for s in listed]
    finally:
        assert e2b.Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert e2b.Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    if not hasattr(sandbox, "fork"):  # the oldest SDK tested has no fork
        return
    (copy,) = sandbox.fork()
    try:
        copy.run_code("plan.append('c')")
        assert copy.run_code("plan").text == "['a', 'b', 'c']"
        assert sandbox.run_code("plan").text == "['a', 'b']"
    finally:
        copy.kill()


def test_volumes_outlive_sandboxes_and_are_shared_through_the_sdk() -> None:
    volume_class = e2b_core.Volume
    volume = volume_class.create("sdk-shared")
    try:
        entry = volume.write_file("/seed/hello.txt", "from the SDK")
        assert entry.path == "/seed/hello.txt" and entry.size == 12
        assert volume.exists("/seed") and not volume.exists("/nothing")
        first = e2b.Sandbox.create(timeout=60, volume_mounts={"/mnt/data": volume})
        try:
            out = first.run_code("print(open('/mnt/data/seed/hello.txt').read())")
            assert out.logs.stdout == ["from the SDK\n"]
            first.commands.run("echo written > /mnt/data/out.txt")
        finally:
            first.kill()
        # The sandbox is gone; its write is not. A second one mounts it by name elsewhere.
        second = e2b.Sandbox.create(timeout=60, volume_mounts={"/data/v": "sdk-shared"})
        try:
            assert second.commands.run("cat /data/v/out.txt").stdout == "written\n"
            info = e2b.Sandbox.get_info(second.sandbox_id)
            mounts = getattr(info, "volume_mounts", None)
            if mounts is not None:  # newer SDKs show them
                assert mounts == [{"name": "sdk-shared", "path": "/data/v"}]
        finally:
            second.kill()
        names = sorted(e.name for e in volume.list("/"))
        assert names == ["out.txt", "seed"]
        assert volume.read_file("/out.txt") == "written\n"
        volume.make_dir("/a/b", force=True)
        volume.remove("/a")
        assert not volume.exists("/a")
        with pytest.raises(exceptions.NotFoundException):
            volume.read_file("/missing.txt")
        assert [v.name for v in volume_class.list()] == ["sdk-shared"]
    finally:
        assert volume_class.destroy(volume.volume_id) is True
    assert volume_class.destroy(volume.volume_id) is False
    with pytest.raises(exceptions.SandboxException):
        e2b.Sandbox.create(timeout=60, volume_mounts={"/mnt/x": "no-such-volume"})
