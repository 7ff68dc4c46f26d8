"""How `make test TEST_WORKERS=2` spreads the suite over two pytest-xdist workers.

A work unit is a test file, so a module's gateways start once, as in a serial run, with
two exceptions:

- The swarm suites (`tests/integration/cluster/`) are one unit: each makes the machine's
  engine a swarm manager, one swarm at a time (an abstract-socket lock), so on two
  workers one would only wait for the other.
- Units start longest first (`LONGEST`, measured from a whole run's `--junitxml`), so that
  no long file is left to run alone at the end. Files not listed follow in collection
  order; a stale list only costs balance, never a test.

Two gateways running side by side is what production does too; tests that assert on
Docker state filter by their own gateway's instance label (see `tests/integration/test_cli.py`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

SHORT_ROOT = Path("/tmp/kgt")
KEEP_SECONDS = 24 * 3600

# Seconds per file in a whole run (CI, 2 cores), longest first; rounded.
LONGEST = (
    "tests/integration/cluster",  # 345 s
    "tests/integration/test_bench.py",  # 245 s
    "tests/integration/test_e2b_js_suite.py",  # 170 s alone
    "tests/integration/test_persistence.py",  # 185 s
    "tests/integration/test_classic_template.py",  # 180 s on a fresh machine (its base image)
    "tests/integration/test_api.py",  # 160 s
    "tests/integration/test_e2b_sandbox_suite.py",  # 150 s
    "tests/integration/test_e2b_async_suite.py",  # 150 s
    "tests/integration/test_languages.py",  # 105 s
    "tests/integration/test_egress.py",  # 100 s
    "tests/integration/test_fuzz.py",  # 90 s
    "tests/integration/test_hardening.py",  # 80 s
    "tests/integration/test_router.py",  # 80 s
    "tests/integration/test_hibernation.py",  # 75 s
    "tests/integration/test_files.py",  # 70 s
    "tests/integration/test_e2b_sdks.py",  # 65 s
    "tests/integration/test_templates_api.py",  # 60 s
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or the cluster folder for the swarm suites."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/integration/cluster/"):
        return "tests/integration/cluster"
    return path


def rank(unit: str) -> int:
    return LONGEST.index(unit) if unit in LONGEST else len(LONGEST)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's file scheduler with the units above, longest first."""
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):  # type: ignore[misc]
        ranked = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # Reorder the queue of units, never a worker's collection: xdist sends each
            # test as its index in the worker's own collection.
            if not self.ranked:
                for unit in sorted(self.workqueue, key=rank):
                    self.workqueue.move_to_end(unit)
                self.ranked = True
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False
    return LongestFirst(config, log)


def short_basetemp() -> str:
    """A new folder under SHORT_ROOT for one run's temporary files (the runs of more than
    a day ago are removed: pytest's own base keeps its last three, this one cannot know
    which of its neighbours still run)."""
    SHORT_ROOT.mkdir(mode=0o700, exist_ok=True)
    for old in SHORT_ROOT.iterdir():
        try:
            if time.time() - old.stat().st_mtime > KEEP_SECONDS:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="", dir=SHORT_ROOT)
