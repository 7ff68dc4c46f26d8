"""docs/api.md's table of routes lists exactly the gateway's operations and surfaces.

The table is prose for readers (what each answer holds, in words), so it is written by
hand; this keeps it from naming a route that does not exist or leaving one out."""

from __future__ import annotations

import re
from pathlib import Path

from kernel_gateway.server.routes import OPERATIONS, SURFACES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\| `(?:(GET|POST|PUT|DELETE|PATCH) )?(/[^`]*)` \|", re.MULTILINE)
PARAM = re.compile(r"\{[^}]*\}")


def _normal(path: str) -> str:
    return PARAM.sub("{}", path)


def test_the_route_table_lists_every_operation_and_surface() -> None:
    rows = ROW.findall(PAGE.read_text())
    documented = {(m, _normal(p)) for m, p in rows if m}
    surfaces = {p.removesuffix("/…").removesuffix("/") for m, p in rows if not m}
    routed = {(op.method.upper(), _normal(op.template)) for op in OPERATIONS}
    assert documented == routed, (
        f"in docs/api.md only: {sorted(documented - routed)}; "
        f"routed only: {sorted(routed - documented)}"
    )
    assert surfaces == {s.prefix for s in SURFACES}
