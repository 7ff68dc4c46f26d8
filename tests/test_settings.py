from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kernel_gateway.settings import Settings, add_serve_arguments, describe, from_args, from_env


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
