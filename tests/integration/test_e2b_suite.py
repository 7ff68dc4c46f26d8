"""E2B's own template tests (`tests/e2b_suite/`: E2B's Python SDK's `template_sync` and
`template_async`, vendored unchanged) against a real gateway on the docker backend under
gVisor, run with the SDK they were written for (`e2b` 2.45.1, in a venv of its own) and E2B's
pytest settings.

Every test must pass but those in NEEDS_INTERNET, each of which must fail (or be skipped) for
its stated reason: a listed test that passes, or fails for another reason, is an error too, so
the list cannot go stale. The templates the suite builds (E2B's tests never delete theirs) are
deleted through the gateway's API afterwards, and their images with them.

`make e2b-suite` (part of `make test`) makes the venv; without it this test is skipped, unless
KG_REQUIRE_E2B_SDKS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from tests.support.backends import backend_settings, require_backend
from tests.support.server import ServerThread

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "e2b_suite"
PYTHON = ROOT / "build" / "e2b-sdks" / "python-suite" / "bin" / "python"
FOLDERS = ("tests/sync/template_sync", "tests/async/template_async")
SDK_VERSION = "2.45.1"  # the tag tests/e2b_suite/ was taken from (its README)
# e2b 2.26.0 to 2.45.1 refuse, before sending anything, an API key that is not "e2b_" and hex.
TOKEN = "e2b_" + secrets.token_hex(20)
REQUIRE = os.environ.get("KG_REQUIRE_E2B_SDKS") == "1"
RUN_LIMIT = 1800  # seconds for the whole suite (it takes about 80)


class Reason(NamedTuple):
    why: str
    shows: str
    """Text the test's failure (or skip) report must contain."""


DOCKER_HUB = Reason(
    "builds FROM ubuntu:22.04, which only a public registry (Docker Hub) has: the gateway "
    "pulls no images, so it refuses the base with a 400",
    "a public registry image cannot be used",
)

NEEDS_INTERNET: dict[str, Reason] = {
    f"tests/{flavour}/template_{flavour}/{test}": DOCKER_HUB
    for flavour in ("sync", "async")
    for test in (
        "methods/test_make_symlink.py::test_make_symlink",
        "methods/test_make_symlink.py::test_make_symlink_force",
        "methods/test_run_cmd.py::test_run_command",
        "methods/test_run_cmd.py::test_run_command_as_different_user",
        "methods/test_run_cmd.py::test_run_command_as_user_that_does_not_exist",
        "test_background_build.py::test_build_in_background_should_start_build_and_return_info",
        "test_build.py::test_build_template_with_symlinks",
        "test_build.py::test_build_template_with_resolve_symlinks",
    )
} | {
    "tests/async/template_async/test_build.py::test_build_template_with_skip_cache": DOCKER_HUB,
}


class Outcome(NamedTuple):
    state: str  # passed, failed or skipped
    report: str  # the failure's or skip's message and text


def test_e2bs_template_suite_passes_but_for_the_internet(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if not PYTHON.exists():
        reason = f"{PYTHON} is missing (run `make e2b-suite`)"
        if REQUIRE:
            pytest.fail(f"KG_REQUIRE_E2B_SDKS=1 but {reason}")
        pytest.skip(reason)
    require_backend("gvisor")
    version = subprocess.run(
        [str(PYTHON), "-c", "from importlib.metadata import version; print(version('e2b'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == SDK_VERSION, version.stdout
    junit = tmp_path_factory.mktemp("e2b-suite") / "junit.xml"
    settings = backend_settings(
        "gvisor",
        tmp_path_factory.mktemp("gw-gvisor"),
        token=TOKEN,
        pool_size=1,
        max_sessions=8,
        max_templates=200,  # the suite builds about 20 and deletes none
    )
    with ServerThread(settings) as server:
        try:
            done = _run_suite(server.url + "/e2b", junit)
        finally:
            made, refused = _delete_templates(server.url + "/e2b")
    left = _remove_images(made)
    print(done.stdout[-30_000:], done.stderr[-5_000:], sep="\n")  # shown when it fails
    # 0: all passed; 1: some failed. Anything else: the run itself broke (usage, collection).
    assert done.returncode in (0, 1) and junit.exists(), done.stdout[-5_000:]
    outcomes = _outcomes(junit)
    unexpected = {
        test: outcome.report[:2_000]
        for test, outcome in outcomes.items()
        if outcome.state != "passed" and test not in NEEDS_INTERNET
    }
    assert not unexpected, unexpected
    stale = {
        test: outcomes[test].state if test in outcomes else "not collected"
        for test, reason in NEEDS_INTERNET.items()
        if test not in outcomes
        or outcomes[test].state == "passed"
        or reason.shows not in outcomes[test].report
    }
    assert not stale, f"listed in NEEDS_INTERNET but not failing for its reason: {stale}"
    assert len(outcomes) > len(NEEDS_INTERNET), sorted(outcomes)
    assert not refused, f"templates the gateway would not delete: {refused}"
    assert not left, f"template images left after the gateway stopped: {left}"


def _run_suite(url: str, junit: Path) -> subprocess.CompletedProcess[str]:
    """E2B's suite with E2B's pytest.ini (rootdir tests/e2b_suite: none of our conftests)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("E2B_", "PYTEST_")) and k != "PYTHONPATH"
    }
    env.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=TOKEN)
    argv = [str(PYTHON), "-m", "pytest", "-c", "pytest.ini", "--rootdir", "."]
    argv += ["-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={junit}"]
    argv += ["-o", "junit_family=xunit1", *FOLDERS]  # xunit1: each test's file, for its id
    return subprocess.run(
        argv, env=env, cwd=SUITE, capture_output=True, text=True, timeout=RUN_LIMIT, check=False
    )


def _outcomes(junit: Path) -> dict[str, Outcome]:
    """Each test's pytest node id (relative to tests/e2b_suite) and how it ended."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(junit).iter("testcase"):
        file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name")
        module = file.removesuffix(".py").replace("/", ".")
        assert file and classname.startswith(module) and name, case.attrib
        classes = [part for part in classname[len(module) :].split(".") if part]
        test = "::".join([file, *classes, name])
        state, report = "passed", ""
        for tag in ("failure", "error", "skipped"):
            for found in case.iter(tag):
                state = "skipped" if tag == "skipped" else "failed"
                report += f"{found.get('message', '')}\n{found.text or ''}\n"
        outcomes[test] = Outcome(state, report)
    return outcomes


def _delete_templates(url: str) -> tuple[set[str], dict[str, str]]:
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


def _remove_images(template_ids: set[str]) -> list[str]:
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
