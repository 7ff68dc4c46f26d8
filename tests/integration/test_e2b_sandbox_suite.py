"""E2B's own sandbox and API tests (`tests/e2b_suite/`: E2B's Python SDK's `sandbox_sync`,
`api_sync` and their async twins, vendored unchanged) against a real gateway on the docker
backend under gVisor, run with the SDK they were written for (`e2b` 2.45.1) and E2B's
pytest settings.

Every test must pass but those in CANNOT, each of which must fail (or be skipped) for its
stated reason: a listed test that passes, or fails for another reason, is an error too, so
the list cannot go stale. The reasons are of four kinds: the public internet (the machines
that run this have none, and tests send nothing off the machine), a public URL into the
sandbox (`get_host`: a name under E2B's domain that only E2B's DNS has), E2B's cloud-only
parts (a `sudo` to root, MCP servers from Docker Hub), and tests of the SDK alone that
assume E2B's own addresses. docs/e2b.md lists them with the counts.

`make e2b-suite` (part of `make test`) makes the venv; without it this test is skipped,
unless KG_REQUIRE_E2B_SDKS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import pytest

from tests.support.backends import backend_settings, require_backend
from tests.support.e2b_suite import (
    TOKEN,
    Reason,
    judge,
    require_suite_venv,
    run_suite,
)
from tests.support.server import ServerThread

FOLDERS = (
    "tests/sync/sandbox_sync",
    "tests/sync/api_sync",
    "tests/async/sandbox_async",
    "tests/async/api_async",
)

INTERNET = Reason(
    "reaches public addresses (1.1.1.1, 8.8.8.8, connectivitycheck.gstatic.com): the "
    "machines that run this have no internet, and tests send nothing off the machine",
    "Command exited with code",
)
INTERNET_REFUSED = Reason(
    "allows public IP addresses (1.1.1.1, 8.8.8.8): the gateway's egress proxy allows "
    "domain names only, within the operator's --egress-allow (none here)",
    "only domain names can be allowed",
)
PUBLIC_URL = Reason(
    "opens `get_host(port)`, `<port>-<id>.<domain>`: a public URL into the sandbox that only "
    "E2B's DNS and edge serve (the gateway has no per-port ingress)",
    "Name or service not known",
)
HTTPBIN = Reason(
    "needs E2B's `httpbin` template (an image from a public registry) reached through a "
    "public URL into the sandbox",
    "template 'httpbin' not found",
)
SUDO = Reason(
    "runs `sudo`: the sandbox's user cannot become root (its container runs with "
    "no-new-privileges and has no sudo)",
    "sudo: command not found",
)
MCP = Reason(
    "starts E2B's MCP gateway in the sandbox (E2B's image of MCP servers, from a public "
    "registry): refused with a 400 that says so",
    "MCP servers in a sandbox ('mcp') are not supported",
)
E2B_DOMAIN = Reason(
    "a test of the SDK alone (its API mocked) that assumes E2B_SANDBOX_URL is unset and "
    "expects E2B's own https://sandbox.e2b.app",
    "https://sandbox.e2b.app",
)
MEMORY = Reason(
    "expects a resumed sandbox's memory restored in place (the same boot id): a pause here "
    "keeps the files and the kernel's variables, and a resumed sandbox is a new container "
    "(under gVisor, a new boot id)",
    "boot_after == boot_before",
)

_CANNOT = {
    "test_internet_access.py::test_internet_access_enabled": INTERNET,
    "test_internet_access.py::test_internet_access_default": INTERNET,
    "test_network.py::test_deny_specific_ip": INTERNET,
    "test_network.py::test_update_network_applies_restrictions": INTERNET,
    "test_network.py::test_mask_request_host": INTERNET,
    "test_network.py::test_allow_specific_ip_with_deny_all": INTERNET_REFUSED,
    "test_network.py::test_allow_takes_precedence_over_deny": INTERNET_REFUSED,
    "test_network.py::test_update_network_clears_existing_rules": INTERNET_REFUSED,
    "test_network.py::test_allow_public_traffic_false": PUBLIC_URL,
    "test_network.py::test_allow_public_traffic_true": PUBLIC_URL,
    "test_network.py::test_firewall_transform_injects_headers": HTTPBIN,
    "test_host.py::test_ping_server": PUBLIC_URL,
    "test_create.py::test_auto_resume_wakes_on_http_request": PUBLIC_URL,
    "test_create.py::test_mcp_gateway_start_failure_kills_created_sandbox": MCP,
    "test_create.py::test_keep_memory_none_defaults_to_full_memory": MEMORY,
    "commands/test_env_vars.py::test_bash_command_scoped_env_vars": SUDO,
    "test_config_propagation.py::test_connect_sets_stable_host_routing_headers": E2B_DOMAIN,
}
CANNOT: dict[str, Reason] = {
    f"tests/{flavour}/sandbox_{flavour}/{test}": reason
    for flavour in ("sync", "async")
    for test, reason in _CANNOT.items()
}


def test_e2bs_sandbox_suite_passes_but_for_what_cannot_here(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_suite_venv()
    require_backend("gvisor")
    junit = tmp_path_factory.mktemp("e2b-sandbox-suite") / "junit.xml"
    settings = backend_settings(
        "gvisor",
        tmp_path_factory.mktemp("gw-gvisor"),
        token=TOKEN,
        pool_size=2,
        max_sessions=16,
    )
    with ServerThread(settings) as server:
        done = run_suite(server.url + "/e2b", junit, FOLDERS, "--timeout=120")
    found = judge(done, junit, CANNOT)
    passed = sum(outcome.state == "passed" for outcome in found.values())
    print(f"E2B's sandbox and API suites: {passed} of {len(found)} passed")
