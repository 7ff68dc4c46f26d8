"""`kernel-gateway run` as a user runs it: a subprocess talking to a real gateway."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import ServerThread


def kg_run(
    gateway: ServerThread, *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_gateway", "run", "--url", gateway.url, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_output_streams_while_the_cell_runs(gateway: ServerThread) -> None:
    code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_gateway", "run", "--url", gateway.url, code],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "first\n"
    first_at = time.monotonic()
    rest = proc.stdout.read()
    assert proc.wait(30) == 0
    assert time.monotonic() - first_at > 1.0  # "first" arrived long before the end
    assert rest == "second\n"
    proc.stdout.close()


def test_error_exits_non_zero_with_the_traceback(gateway: ServerThread) -> None:
    result = kg_run(gateway, "print('before'); 1/0")
    assert result.returncode == 1
    assert result.stdout == "before\n"
    assert "ZeroDivisionError" in result.stderr
    assert "\x1b[" not in result.stderr  # no colours when not a terminal


def test_timeout_exit_status(gateway: ServerThread) -> None:
    result = kg_run(gateway, "--timeout", "1", "while True: pass")
    assert result.returncode == 124
    assert "[timeout" in result.stderr


def test_code_from_stdin_and_file(gateway: ServerThread, tmp_path: Path) -> None:
    assert kg_run(gateway, stdin="print(6 * 7)").stdout == "42\n"
    script = tmp_path / "job.py"
    script.write_text("x = 2\nx ** 10")
    assert kg_run(gateway, "-f", str(script)).stdout == "1024\n"


def test_images_are_saved(gateway: ServerThread, tmp_path: Path) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.savefig('saved.png'); plt.show()"
    result = kg_run(gateway, "--out", str(tmp_path / "imgs"), code)
    assert result.returncode == 0, result.stderr
    saved = sorted(p.name for p in (tmp_path / "imgs").iterdir())
    assert saved == ["display-1.png", "saved.png"]
    assert (tmp_path / "imgs" / "saved.png").read_bytes().startswith(b"\x89PNG")


def test_session_mode_keeps_state(gateway: ServerThread) -> None:
    import httpx

    sid = httpx.post(gateway.url + "/sessions").json()["id"]
    assert kg_run(gateway, "--session", sid, "y = 5").returncode == 0
    assert kg_run(gateway, "--session", sid, "print(y)").stdout == "5\n"
    httpx.delete(gateway.url + f"/sessions/{sid}")


def test_unreachable_gateway_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kernel_gateway", "run", "--url", "http://127.0.0.1:9", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "kernel-gateway run:" in result.stderr
