from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

import pytest

from kernel_gateway.settings import (
    ROOT_RUNTIME_DIR,
    Settings,
    add_serve_arguments,
    default_runtime_dir,
    describe,
    from_args,
    from_env,
    parse_size,
)


def test_defaults() -> None:
    s = Settings()
    assert (s.host, s.backend, s.exec_timeout, s.idle_timeout) == ("127.0.0.1", "auto", 60, 1200)
    assert s.token is None and not s.auth_required


def test_env_twins() -> None:
    s = from_env(
        {
            "KG_PORT": "9000",
            "KG_POOL_SIZE": "5",
            "KG_TOKEN": "t",
            "KG_NO_AUTH": "true",
            "KG_EXEC_TIMEOUT": "2.5",
            "KG_RUNTIME_DIR": "/tmp/x",
            "UNRELATED": "1",
        }
    )
    assert (s.port, s.pool_size, s.token, s.no_auth) == (9000, 5, "t", True)
    assert s.exec_timeout == 2.5
    assert s.runtime_dir == Path("/tmp/x")


def test_flags_override_env() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--pool-size", "3", "--backend", "local"])
    s = from_args(args, {"KG_POOL_SIZE": "9", "KG_MAX_SESSIONS": "4"})
    assert (s.pool_size, s.backend, s.max_sessions) == (3, "local", 4)


@pytest.mark.parametrize(
    "env",
    [
        {"KG_PORT": "eighty"},
        {"KG_BACKEND": "kubernetes"},
        {"KG_NO_AUTH": "maybe"},
        {"KG_EXEC_TIMEOUT": "0"},
        {"KG_MAX_SESSIONS": "0"},
    ],
)
def test_bad_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        from_env(env)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_loopback_needs_no_token(host: str) -> None:
    Settings(host=host).check_exposure()


def test_network_exposure_needs_a_token_or_no_auth() -> None:
    with pytest.raises(ValueError, match="refusing"):
        Settings(host="0.0.0.0").check_exposure()
    Settings(host="0.0.0.0", token="secret").check_exposure()
    Settings(host="0.0.0.0", no_auth=True).check_exposure()


def test_describe_masks_the_token() -> None:
    lines = describe(Settings(token="hunter2"))
    assert "token=***" in lines
    assert not any("hunter2" in line for line in lines)


# -- sizes and durations are validated at startup, naming the flag ------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1g", 1024**3),
        ("1G", 1024**3),
        ("1GiB", 1024**3),
        ("1gb", 1024**3),
        ("512m", 512 * 1024**2),
        ("512MiB", 512 * 1024**2),
        ("1.5g", 3 * 512 * 1024**2),
        ("16777216", 16777216),
        (" 64m ", 64 * 1024**2),
        ("64K", 65536),
    ],
)
def test_sizes_accept_the_common_spellings(text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert Settings(workspace_size=text).workspace_size_bytes == expected
    if expected >= 6 * 1024**2:  # Docker's smallest memory limit
        assert Settings(memory_limit=text).memory_limit_bytes == expected


@pytest.mark.parametrize(
    "text", ["lots", "1x", "1gg", "g", "", "0", "-1g", "nan", "inf", "1e400", "1 g b"]
)
@pytest.mark.parametrize(("name", "flag"), [("memory_limit", "--memory-limit"),
                                            ("workspace_size", "--workspace-size")])  # fmt: skip
def test_bad_sizes_are_refused_naming_the_flag(name: str, flag: str, text: str) -> None:
    with pytest.raises(ValueError, match=f"{flag} \\(KG_{name.upper()}\\)"):
        from_env({f"KG_{name.upper()}": text})


def test_a_memory_limit_below_what_docker_accepts_is_refused() -> None:
    with pytest.raises(ValueError, match="--memory-limit"):
        Settings(memory_limit="1m")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"KG_EXEC_TIMEOUT": "nan"}, "--exec-timeout"),
        ({"KG_EXEC_TIMEOUT": "inf"}, "--exec-timeout"),
        ({"KG_EXEC_TIMEOUT": "-1"}, "--exec-timeout"),
        ({"KG_EXEC_TIMEOUT": "7200"}, "--exec-timeout"),  # above KG_MAX_EXEC_TIMEOUT (3600)
        ({"KG_MAX_EXEC_TIMEOUT": "nan"}, "KG_MAX_EXEC_TIMEOUT"),
        ({"KG_MAX_EXEC_TIMEOUT": "30"}, "--exec-timeout"),  # below the default exec timeout
        ({"KG_IDLE_TIMEOUT": "inf"}, "--idle-timeout"),
        ({"KG_IDLE_TIMEOUT": "0"}, "--idle-timeout"),
        ({"KG_RESTART_WINDOW": "0"}, "--restart-window"),
        ({"KG_RESTART_WINDOW": "nan"}, "--restart-window"),
        ({"KG_INTERRUPT_GRACE": "nan"}, "KG_INTERRUPT_GRACE"),
        ({"KG_KERNEL_START_TIMEOUT": "-inf"}, "KG_KERNEL_START_TIMEOUT"),
        ({"KG_CPU_LIMIT": "0"}, "--cpu-limit"),
        ({"KG_CPU_LIMIT": "nan"}, "--cpu-limit"),
        ({"KG_CPU_LIMIT": "inf"}, "--cpu-limit"),
        ({"KG_PORT": "70000"}, "--port"),
        ({"KG_PORT": "-1"}, "--port"),
        ({"KG_RESTART_BUDGET": "-1"}, "--restart-budget"),
        ({"KG_MAX_UPLOAD_BYTES": "0"}, "--max-upload-bytes"),
        ({"KG_MAX_BODY_BYTES": "-5"}, "KG_MAX_BODY_BYTES"),
        ({"KG_MAX_QUEUED_EXECUTIONS": "0"}, "KG_MAX_QUEUED_EXECUTIONS"),
    ],
)
def test_bad_numbers_are_refused_naming_the_flag(env: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=re.escape(names)):
        from_env(env)


def test_limits_at_their_edges_are_accepted() -> None:
    s = from_env(
        {
            "KG_EXEC_TIMEOUT": "3600",
            "KG_RESTART_BUDGET": "0",
            "KG_PORT": "65535",
            "KG_CPU_LIMIT": "0.5",
            "KG_MEMORY_LIMIT": "6m",
        }
    )
    assert (s.exec_timeout, s.restart_budget, s.port, s.memory_limit_bytes) == (
        3600,
        0,
        65535,
        6 * 1024**2,
    )


# -- the runtime folder: on disk for root; XDG_RUNTIME_DIR where set, read from the environ given


def test_a_root_gateway_keeps_its_runtime_dir_on_disk(tmp_path: Path) -> None:
    assert default_runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)}, euid=0) == Path(
        "/var/lib/kernel-gateway"
    )
    if os.geteuid() == 0:
        assert from_env({"XDG_RUNTIME_DIR": str(tmp_path)}).runtime_dir == ROOT_RUNTIME_DIR
        assert Settings().runtime_dir == ROOT_RUNTIME_DIR


def _ours(tmp_path: Path) -> int:
    """A uid that owns `tmp_path`: ours, or (as root) a user we give it to."""
    if os.geteuid() != 0:
        return os.geteuid()
    os.chown(tmp_path, 1000, 1000)
    return 1000


def test_runtime_dir_prefers_xdg_runtime_dir(tmp_path: Path) -> None:
    uid = _ours(tmp_path)
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert default_runtime_dir(env, euid=uid) == tmp_path / "kernel-gateway"


def test_runtime_dir_falls_back_to_the_temp_folder(tmp_path: Path) -> None:
    uid = _ours(tmp_path)
    expected = Path(tempfile.gettempdir()) / f"kernel-gateway-{uid}"
    assert default_runtime_dir({}, euid=uid) == expected
    assert default_runtime_dir({"XDG_RUNTIME_DIR": ""}, euid=uid) == expected
    assert default_runtime_dir({"XDG_RUNTIME_DIR": "relative/dir"}, euid=uid) == expected
    assert default_runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path / "no")}, euid=uid) == expected
    assert default_runtime_dir(None, euid=uid) == expected  # no environ given: none is read


def test_an_xdg_runtime_dir_of_another_user_is_not_used(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder away")
    theirs = tmp_path / "theirs"  # e.g. kept by `sudo` from the invoking user's session
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    assert default_runtime_dir({"XDG_RUNTIME_DIR": str(theirs)}, euid=1000).parent != theirs


def test_runtime_dir_flag_and_variable_win_over_xdg(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "KG_RUNTIME_DIR": "/srv/kg"}
    assert from_env(env).runtime_dir == Path("/srv/kg")
    assert from_env(env, runtime_dir=Path("/srv/flag")).runtime_dir == Path("/srv/flag")


def test_egress_settings_are_domain_patterns_within_the_ceiling() -> None:
    s = from_env(
        {
            "KG_EGRESS_ALLOW": "PyPI.org., *.pythonhosted.org",
            "KG_EGRESS_DEFAULT": "pypi.org",
            "KG_EGRESS_NETWORKS": "corp, bridge",
        }
    )
    assert s.egress_ceiling == ["pypi.org", "*.pythonhosted.org"]
    assert s.egress_default_list == ["pypi.org"]
    assert s.egress_network_list == ["corp", "bridge"]
    assert Settings().egress_ceiling == [] and Settings().egress_network_list == ["bridge"]
    assert not Settings().egress_needed
    builds = from_env({"KG_BUILD_EGRESS_ALLOW": "pypi.org,deb.debian.org"})
    assert builds.build_egress_list == ["pypi.org", "deb.debian.org"]
    assert builds.egress_ceiling == [] and builds.egress_needed  # the proxy runs for builds


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KG_EGRESS_ALLOW": "10.0.0.1"}, "--egress-allow"),
        ({"KG_EGRESS_ALLOW": "*"}, "--egress-allow"),
        ({"KG_EGRESS_ALLOW": "a.test", "KG_EGRESS_DEFAULT": "b.test"}, "--egress-default"),
        ({"KG_EGRESS_ALLOW": "a.test", "KG_BACKEND": "local"}, "docker backend"),
        ({"KG_EGRESS_ALLOW": "a.test", "KG_NETWORK": "bridge"}, "--network"),
        ({"KG_BUILD_EGRESS_ALLOW": "10.0.0.1"}, "--build-egress-allow"),
        ({"KG_BUILD_EGRESS_ALLOW": "a.test", "KG_BACKEND": "local"}, "--build-egress-allow"),
    ],
)
def test_egress_settings_that_cannot_hold_are_refused(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        from_env(env)
