"""E2B's async sandbox and API tests (`sandbox_async`, `api_async` in `tests/e2b_suite/`,
vendored unchanged): the same calls as the sync suites of `test_e2b_sandbox_suite.py`,
through the SDK's async client (httpx's async transport, its own connection handling and
timeouts). The tests that cannot pass here are the sync suite's twins, for the same
reasons; those it does not run likewise.
"""

from __future__ import annotations

import pytest

from tests.support.e2b_suite import Reason

from .test_e2b_sandbox_suite import CANNOT, NOT_RUN, run_and_judge

FOLDERS = ("tests/async/sandbox_async", "tests/async/api_async")


def twin(test: str) -> str:
    """The async suite's twin of a sync test's node id."""
    assert test.startswith("tests/sync/sandbox_sync/"), test
    return test.replace("tests/sync/sandbox_sync/", "tests/async/sandbox_async/", 1)


ASYNC_CANNOT: dict[str, Reason] = {twin(test): reason for test, reason in CANNOT.items()}
ASYNC_NOT_RUN: dict[str, str] = {twin(test): why for test, why in NOT_RUN.items()}


def test_e2bs_async_suite_passes_but_for_what_cannot_here(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_and_judge(tmp_path_factory, FOLDERS, ASYNC_CANNOT, ASYNC_NOT_RUN)
