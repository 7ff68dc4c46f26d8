"""E2B's own template tests (`tests/e2b_suite/`: E2B's Python SDK's `template_sync` and
`template_async`, vendored unchanged) against a real gateway on the docker backend with
its default runtime (runc), run with the SDK they were written for (`e2b` 2.45.1, in a venv
of its own) and E2B's pytest settings.

Every test must pass but those in NEEDS_INTERNET, each of which must fail (or be skipped) for
its stated reason: a listed test that passes, or fails for another reason, is an error too, so
the list cannot go stale. The templates the suite builds (E2B's tests never delete theirs) are
deleted through the gateway's API afterwards, and their images with them.

`make e2b-suite` (part of `make test`) makes the venv; without it this test is skipped, unless
KG_REQUIRE_E2B_SDKS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import pytest

from tests.support.e2b_suite import (
    Reason,
    delete_templates,
    judge,
    remove_images,
    run_suite,
    suite_gateway,
)

FOLDERS = ("tests/sync/template_sync", "tests/async/template_async")


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


def test_e2bs_template_suite_passes_but_for_the_internet(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the suite builds about 20 templates and deletes none
    with suite_gateway(
        tmp_path_factory, "docker", pool_size=1, max_sessions=8, max_templates=200
    ) as (
        url,
        junit,
    ):
        try:
            done = run_suite(url, junit, FOLDERS)
        finally:
            made, refused = delete_templates(url)
    left = remove_images(made)
    judge(done, junit, NEEDS_INTERNET)
    assert not refused, f"templates the gateway would not delete: {refused}"
    assert not left, f"template images left after the gateway stopped: {left}"
