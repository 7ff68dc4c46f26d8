"""Domain patterns and squid's policy helper (kernel_gateway/in_proxy/policy.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from kernel_gateway.in_proxy.policy import (
    BadPattern,
    Policy,
    covers,
    matches,
    normalize,
    outside,
    serve,
)


def test_patterns_are_domain_names_or_wildcards_in_one_spelling() -> None:
    assert normalize("Data.Example.COM.") == "data.example.com"
    assert normalize(" *.example.org ") == "*.example.org"
    for bad in (
        "",
        "*",
        "*.org",
        "1.2.3.4",
        "[::1]",
        "::1",
        "a..b",
        "-a.b",
        "a b.c",
        "*.*.a.b",
        "x" * 64 + ".com",
        "http://a.b",
        "a.b/c",
        "a.b:443",
    ):
        with pytest.raises(BadPattern):
            normalize(bad)


def test_an_exact_name_allows_itself_and_a_wildcard_its_subdomains() -> None:
    assert matches("data.example.com", "DATA.example.com.")
    assert not matches("data.example.com", "x.data.example.com")
    assert matches("*.example.org", "a.example.org") and matches("*.example.org", "a.b.example.org")
    assert not matches("*.example.org", "example.org")
    assert not matches("*.example.org", "badexample.org")
    assert not matches("*.example.org", "example.org.evil.com")


def test_a_ceiling_covers_what_it_allows_and_nothing_more() -> None:
    assert covers("*.example.org", "a.example.org") and covers("*.example.org", "*.a.example.org")
    assert covers("*.example.org", "*.example.org")
    assert not covers("*.example.org", "example.org")
    assert not covers("a.example.org", "*.example.org")
    ceiling = ["pypi.org", "*.pythonhosted.org"]
    assert outside(ceiling, ["pypi.org", "files.pythonhosted.org", "evil.com"]) == ["evil.com"]


def test_the_helper_authenticates_and_allows_by_session(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"

    def write(sessions: dict[str, object]) -> None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"sessions": sessions}))
        os.replace(temporary, path)

    secret = hashlib.sha256(b"s3cret").hexdigest()
    write({"s1": {"secret_sha256": secret, "allow": ["allowed.test", "*.example.org"]}})
    policy = Policy(str(path))

    def ask(mode: str, *lines: str) -> list[str]:
        out = io.StringIO()
        serve(mode, policy, io.StringIO("".join(line + "\n" for line in lines)), out)
        return out.getvalue().splitlines()

    assert ask("auth", "s1 s3cret", "s1 wrong", "s2 s3cret", "s1%20 s3cret", "") == [
        "OK",
        "ERR",
        "ERR",
        "ERR",
        "ERR",
    ]
    assert ask(
        "allow", "s1 allowed.test", "s1 a.example.org", "s1 other.test", "s2 allowed.test"
    ) == ["OK", "OK", "ERR", "ERR"]
    write({"s2": {"secret_sha256": secret, "allow": ["other.test"]}})  # the file changes
    assert ask("allow", "s1 allowed.test", "s2 other.test") == ["ERR", "OK"]
    path.write_text("{not json")
    assert ask("allow", "s2 other.test") == ["ERR"]  # unreadable: nothing is allowed
    path.unlink()
    assert ask("auth", "s2 s3cret") == ["ERR"]
