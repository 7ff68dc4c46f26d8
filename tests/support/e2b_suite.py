"""Running E2B's own SDK tests (`tests/e2b_suite/`, vendored unchanged) against a gateway,
and judging the outcome against a reviewed list of the tests that cannot pass here.

Every test must pass but those listed, each of which must fail (or be skipped) for its
stated reason: a listed test that passes, or fails for another reason, is an error too, so
the list cannot go stale.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.support.backends import backend_settings, require_backend
from tests.support.server import ServerThread

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "e2b_suite"
PYTHON = ROOT / "build" / "e2b-sdks" / "python-suite" / "bin" / "python"
SDK_VERSION = "2.45.1"  # the tag tests/e2b_suite/ was taken from (its README)
# e2b 2.26.0 to 2.45.1 refuse, before sending anything, an API key that is not "e2b_" and hex.
TOKEN = "e2b_" + secrets.token_hex(20)
REQUIRE = os.environ.get("KG_REQUIRE_E2B_SDKS") == "1"
RUN_LIMIT = 1800  # seconds for a whole run


class Reason(NamedTuple):
    why: str
    shows: str
    """Text the test's failure (or skip) report must contain."""


class Outcome(NamedTuple):
    state: str  # passed, failed or skipped
    report: str  # the failure's or skip's message and text


def require_suite_venv() -> None:
    """Skip (or fail, under KG_REQUIRE_E2B_SDKS=1) without the suite's venv; check its SDK."""
    if not PYTHON.exists():
        reason = f"{PYTHON} is missing (run `make e2b-suite`)"
        if REQUIRE:
            pytest.fail(f"KG_REQUIRE_E2B_SDKS=1 but {reason}")
        pytest.skip(reason)
    version = subprocess.run(
        [str(PYTHON), "-c", "from importlib.metadata import version; print(version('e2b'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == SDK_VERSION, version.stdout


@contextlib.contextmanager
def suite_gateway(
    tmp_path_factory: pytest.TempPathFactory, backend: str, **settings: Any
) -> Iterator[tuple[str, Path]]:
    """A gateway on `backend` (a name of `tests.support.backends.BACKENDS`) for E2B's suites
    (with the suite's key), after checking the suite's venv and the backend: (its E2B
    address, where to write the junit)."""
    require_suite_venv()
    require_backend(backend)
    junit = tmp_path_factory.mktemp("e2b-suite") / "junit.xml"
    config = backend_settings(
        backend, tmp_path_factory.mktemp(f"gw-{backend}"), token=TOKEN, **settings
    )
    with ServerThread(config) as server:
        yield server.url + "/e2b", junit


def run_suite(
    url: str, junit: Path, folders: tuple[str, ...], *extra: str
) -> subprocess.CompletedProcess[str]:
    """E2B's tests in `folders` with E2B's pytest.ini (rootdir tests/e2b_suite: none of our
    conftests), against the E2B front door at `url`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("E2B_", "PYTEST_")) and k != "PYTHONPATH"
    }
    env.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=TOKEN)
    argv = [str(PYTHON), "-m", "pytest", "-c", "pytest.ini", "--rootdir", "."]
    argv += ["-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={junit}"]
    argv += ["-o", "junit_family=xunit1", *extra, *folders]  # xunit1: each test's file
    return subprocess.run(
        argv, env=env, cwd=SUITE, capture_output=True, text=True, timeout=RUN_LIMIT, check=False
    )


def outcomes(junit: Path) -> dict[str, Outcome]:
    """Each test's pytest node id (relative to tests/e2b_suite) and how it ended."""
    found: dict[str, Outcome] = {}
    for case in ET.parse(junit).iter("testcase"):
        file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name")
        module = file.removesuffix(".py").replace("/", ".")
        assert file and classname.startswith(module) and name, case.attrib
        classes = [part for part in classname[len(module) :].split(".") if part]
        test = "::".join([file, *classes, name])
        state, report = "passed", ""
        for tag in ("failure", "error", "skipped"):
            for seen in case.iter(tag):
                state = "skipped" if tag == "skipped" else "failed"
                report += f"{seen.get('message', '')}\n{seen.text or ''}\n"
        found[test] = Outcome(state, report)
    return found


def judge(
    done: subprocess.CompletedProcess[str], junit: Path, cannot: dict[str, Reason]
) -> dict[str, Outcome]:
    """Asserts that every test passed but those in `cannot`, and that each of those failed
    (or was skipped) for its reason; returns the outcomes."""
    print(done.stdout[-30_000:], done.stderr[-5_000:], sep="\n")  # shown when it fails
    # 0: all passed; 1: some failed. Anything else: the run itself broke (usage, collection).
    assert done.returncode in (0, 1) and junit.exists(), done.stdout[-5_000:]
    found = outcomes(junit)
    unexpected = {
        test: outcome.report[:2_000]
        for test, outcome in found.items()
        if outcome.state != "passed" and test not in cannot
    }
    assert not unexpected, unexpected
    stale = {
        test: found[test].state if test in found else "not collected"
        for test, reason in cannot.items()
        if test not in found
        or found[test].state == "passed"
        or reason.shows not in found[test].report
    }
    assert not stale, f"listed as unable to pass here but not failing for its reason: {stale}"
    assert len(found) > len(cannot), sorted(found)
    return found


def delete_templates(url: str) -> tuple[set[str], dict[str, str]]:
    """Deletes every template of the (fresh) gateway: (their ids, {id: why one was refused})."""
    made: set[str] = set()
    refused: dict[str, str] = {}
    with httpx.Client(base_url=url, headers={"X-API-KEY": TOKEN}, timeout=120) as http:
        while True:  # a page at a time, until a listing shows nothing new
            listed = http.get("/v2/templates", params={"limit": 100})
            listed.raise_for_status()
            new = {t["templateID"] for t in listed.json()} - made
            if not new:
                return made, refused
            made |= new
            for template_id in sorted(new):
                deleted = http.delete(f"/templates/{template_id}")
                if deleted.status_code != 204:
                    refused[template_id] = f"{deleted.status_code} {deleted.text}"


def remove_images(template_ids: set[str]) -> list[str]:
    """Removes (and names) the images of `template_ids` still there once the gateway has
    stopped: none, when every DELETE did its work."""
    import docker

    client = docker.from_env()
    left: list[str] = []
    try:
        for image in client.images.list(filters={"label": "io.kernel-gateway.template"}):
            if image.labels.get("io.kernel-gateway.template") in template_ids and image.id:
                left += image.tags or [image.id]
                client.images.remove(image.id, force=True)
    finally:
        client.close()
    return left
