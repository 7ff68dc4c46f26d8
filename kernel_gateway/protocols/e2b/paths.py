"""Which of E2B's calls a path is: the SDKs send control-plane and data-plane calls to the
same base URL when E2B_API_URL and E2B_SANDBOX_URL are one, and some (e2b <= 2.45's
`Sandbox.connect`) send `E2b-Sandbox-Id` on a control-plane call too. So a call is the
control plane's when its path names one of the control plane's resources, whatever its
headers; the data plane's paths (`/execute`, `/contexts`, `/health`, `/files`, the Connect
services' `/<package>.<Service>/<Method>`) never do. Imports nothing: the router uses it,
and reads `ERROR_TYPE_HEADER`.
"""

from __future__ import annotations

import re

CONTROL_PATH = re.compile(
    r"^/+(?:v\d+/+)?(?:sandboxes|templates|teams|snapshots|volumes|secrets|nodes|"
    r"access-tokens|api-keys)(?:/|$)"
)
"""A path (relative to the E2B base URL) of the control plane."""


def is_control(path: str) -> bool:
    """`path`, relative to the base URL (`/sandboxes/x/connect`), is a control-plane call."""
    return CONTROL_PATH.match(path) is not None


ERROR_TYPE_HEADER = "Gateway-Error-Type"
"""The header of an E2B error answer that names the gateway's error type behind it
(`template_not_found`, `template_conflict`...): E2B's error document has only a code and a
message, and a router must tell "no such template here" from other refusals."""
