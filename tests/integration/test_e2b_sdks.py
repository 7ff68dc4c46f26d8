"""E2B's other SDKs against a real gateway on the docker backend: the oldest Python SDK that
honours E2B_SANDBOX_URL (the same suite as the newest, `e2b_sdk/test_python_sdk.py`, in a venv
of its own) and the JavaScript SDK (`e2b_sdk/js/sdk.test.mjs`, and `template.test.mjs`: a
template built with `Template.build`, under Node's test runner).

`make e2b-sdks` (part of `make test`) installs both; without them these tests are skipped,
unless KG_REQUIRE_E2B_SDKS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import ServerFactory

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "integration" / "e2b_sdk"
OLDEST = ROOT / "build" / "e2b-sdks" / "python-oldest" / "bin" / "python"
JS = HERE / "js"
JS_TESTS = ("sdk.test.mjs", "template.test.mjs")
# e2b 2.26.0 to 2.45.1 refuse, before sending anything, an API key that is not "e2b_" and hex
# characters: a gateway token of that shape serves every version (the README says so).
TOKEN = "e2b_" + secrets.token_hex(20)
REQUIRE = os.environ.get("KG_REQUIRE_E2B_SDKS") == "1"
RUN_LIMIT = 600  # seconds for one SDK's whole suite (it takes about 30)


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if REQUIRE:
        pytest.fail(f"KG_REQUIRE_E2B_SDKS=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def e2b_env(servers: ServerFactory) -> Iterator[dict[str, str]]:
    """The environment an SDK run gets: E2B's three variables pointing at a fresh gateway."""
    server = servers("docker", token=TOKEN, pool_size=2, max_sessions=16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTEST_"))}
    env.update(
        E2B_API_URL=server.url + "/e2b",
        E2B_SANDBOX_URL=server.url + "/e2b",
        E2B_VOLUME_API_URL=server.url + "/e2b",
        E2B_API_KEY=TOKEN,
    )
    yield env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_LIMIT, check=False
    )
    print(done.stdout[-20_000:], done.stderr[-5_000:], sep="\n")  # shown when a test fails
    return done


def test_the_oldest_python_sdk_passes_the_same_suite(e2b_env: dict[str, str]) -> None:
    require(OLDEST.exists(), f"{OLDEST} is missing (run `make e2b-sdks`)")
    versions = run(
        [
            str(OLDEST),
            "-c",
            "from importlib.metadata import version as v;"
            "print(v('e2b-code-interpreter'), v('e2b'))",
        ],
        e2b_env,
        ROOT,
    )
    assert versions.stdout.split() == ["2.9.0", "2.26.0"], versions.stdout
    done = run(
        [
            str(OLDEST),
            "-m",
            "pytest",
            "--noconftest",  # no gateway of its own, nothing of ours imported
            "-p",
            "no:cacheprovider",
            "-c",
            str(HERE / "oldest.ini"),
            "--rootdir",
            str(HERE),
            "-q",
            str(HERE / "test_python_sdk.py"),
        ],
        {**e2b_env, "PYTHONPATH": ""},
        ROOT,
    )
    assert done.returncode == 0, done.stdout[-5_000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2_000:]


def test_the_javascript_sdk_passes_its_suite(e2b_env: dict[str, str]) -> None:
    node = shutil.which("node")
    require(node is not None, "Node.js is not installed")
    require(
        (JS / "node_modules" / "@e2b" / "code-interpreter").is_dir(),
        f"{JS}/node_modules is missing (run `make e2b-sdks`)",
    )
    assert node is not None
    done = run(
        # --test-force-exit: a failed runCode leaves the SDK's request timer (60 s) running
        # (@e2b/code-interpreter 2.8.0 clears it only on success), which holds Node open.
        [node, "--test", "--test-force-exit", "--test-reporter=spec", *JS_TESTS],
        e2b_env,
        JS,
    )
    assert done.returncode == 0, done.stdout[-5_000:]
    assert "# fail 0" in done.stdout or "ℹ fail 0" in done.stdout, done.stdout[-2_000:]
