"""`python bench/run.py` puts `bench/` first on the import path: a module there named as one
of the standard library's would be imported in its place, by everything (`bench/secrets.py`
once broke `import secrets` in the gateway's own modules)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_module_shadows_the_standard_library() -> None:
    shadowing = [p.name for p in BENCH.glob("*.py") if p.stem in sys.stdlib_module_names]
    assert shadowing == []
