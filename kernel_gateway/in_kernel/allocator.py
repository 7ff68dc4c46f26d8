"""How the fork server's Python allocates: mimalloc, in transparent huge pages where the
host suits them. Both are read only when a Python starts, so the fork server runs itself
again with them (`choose`), before it preloads anything (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ALLOCATOR = {"PYTHONMALLOC": "mimalloc"}
"""How the fork server's Python allocates, where it can (CPython 3.13 has its own copy of
mimalloc, also the faster allocator for user code here)."""
HUGE_PAGES = {"MIMALLOC_LARGE_OS_PAGES": "1"}
"""Where the host suits it (`huge_pages_suit`): mimalloc's memory in transparent huge
pages. After the preload nearly all of the heap is then in 2 MiB pages: a fork shares
it as a few dozen entries instead of tens of thousands, and a child's exit frees as few
(docs/performance.md). mimalloc keeps such memory (it does not give it back to the
system while the process lives): a child lives for one request."""
REEXECUTED = "KG_FORK_SERVER_ALLOCATOR"
"""Set on the run again, with the values the variables had before (JSON)."""


def huge_pages_suit() -> bool:
    """Transparent huge pages on offer (`madvise` or `always`), no reserved huge pages
    (mimalloc would take them first: outside the memory limit, never split, a SIGBUS
    once used up), and a kernel that splits a shared huge page on a child's first write
    instead of copying all 2 MiB of it (5.8 and later)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return False
        root = "/sys/kernel/mm/hugepages"
        for size in os.listdir(root):
            with open(os.path.join(root, size, "nr_hugepages")) as f:
                if int(f.read().strip() or 0):
                    return False
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except (OSError, ValueError):
        return False
    return (major, minor) >= (5, 8)


def choose() -> None:
    """Run this fork server again (its own command line, `sys.orig_argv`) under
    `ALLOCATOR` (read only when a Python starts) if its Python accepts it; the children's
    environment is then put back as it was. Called first thing by `zygote.main`."""
    before = os.environ.pop(REEXECUTED, None)
    if before is not None:
        for name, value in json.loads(before).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        return
    if sys.version_info < (3, 13):
        return  # no mimalloc: an unknown PYTHONMALLOC would stop Python at start
    wanted = {**ALLOCATOR, **(HUGE_PAGES if huge_pages_suit() else {})}
    saved = json.dumps({name: os.environ.get(name) for name in wanted})
    env = {**os.environ, **wanted, REEXECUTED: saved}
    try:
        check = subprocess.run(
            [sys.executable, "-c", "pass"], env=env, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return
    if check.returncode == 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [*sys.orig_argv], env)
