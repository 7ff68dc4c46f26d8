"""Secrets without a network: the sealed store, and what the relay does to a request head
and to an answer (`interception.rewrite`, `Redactor`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_gateway.errors import Conflict, SecretNotFound, SecretsNotConfigured
from kernel_gateway.kernels.egress.authority import Authority
from kernel_gateway.kernels.egress.interception import (
    Head,
    Malformed,
    Redactor,
    Refused,
    framing,
    parse_head,
    rewrite,
)
from kernel_gateway.tenants.secrets import Opened, SecretStore

TOKEN = Opened("TOKEN", "t0ps3cret", ("api.example.org",), None, "{value}")
KEYED = Opened("KEYED", "k3y", ("*.example.org",), "X-Api-Key", "Key {value}")


def head(*lines: str) -> Head:
    """A request head for api.example.org (or the Host given) as the relay parses it."""
    if not any(line.lower().startswith("host:") for line in lines[1:]):
        lines = (lines[0], "Host: api.example.org", *lines[1:])
    return parse_head(("\r\n".join(lines) + "\r\n\r\n").encode())


def test_placeholders_become_values_only_for_their_domains() -> None:
    out = rewrite(
        head("GET / HTTP/1.1", "Host: api.example.org", "Authorization: Bearer kg-secret:TOKEN"),
        "api.example.org",
        [TOKEN],
    )
    assert b"Authorization: Bearer t0ps3cret" in out.head
    assert b"Accept-Encoding: identity" in out.head and [s.name for s in out.used] == ["TOKEN"]
    e2b = rewrite(head("GET / HTTP/1.1", "X: ${e2b.secrets.TOKEN}"), "api.example.org", [TOKEN])
    assert b"X: t0ps3cret" in e2b.head
    with pytest.raises(Refused, match="only to api.example.org, not evil.test"):
        rewrite(
            head("GET / HTTP/1.1", "Host: evil.test", "X: kg-secret:TOKEN"), "evil.test", [TOKEN]
        )
    with pytest.raises(Refused, match="does not have"):
        rewrite(head("GET / HTTP/1.1", "X: kg-secret:OTHER"), "api.example.org", [TOKEN])
    with pytest.raises(Refused, match="URL"):
        rewrite(head("GET /?k=kg-secret:TOKEN HTTP/1.1"), "api.example.org", [TOKEN])


def test_a_header_secret_is_added_where_missing_and_only_for_its_domains() -> None:
    added = rewrite(
        head("GET / HTTP/1.1", "Host: a.example.org", "Accept-Encoding: gzip", "Range: 0-3"),
        "a.example.org",
        [KEYED],
    )
    assert b"X-Api-Key: Key k3y" in added.head
    assert b"gzip" not in added.head and b"Range" not in added.head  # a whole, plain answer
    kept = rewrite(
        head("GET / HTTP/1.1", "Host: a.example.org", "x-api-key: mine"), "a.example.org", [KEYED]
    )
    assert b"k3y" not in kept.head and b"x-api-key: mine" in kept.head
    elsewhere = rewrite(
        head("GET / HTTP/1.1", "Host: other.test", "Accept-Encoding: gzip"), "other.test", [KEYED]
    )
    assert b"k3y" not in elsewhere.head and b"Accept-Encoding: gzip" in elsewhere.head


def test_a_tunnel_carries_requests_for_its_own_host_only() -> None:
    for other in ("Host: attacker.example.org", "Host: api.example.org.evil"):
        with pytest.raises(Refused, match="Host other than"):
            rewrite(head("GET / HTTP/1.1", other, "X: kg-secret:TOKEN"), "api.example.org", [TOKEN])
    with pytest.raises(Refused, match="another host"):
        rewrite(head("GET https://evil.test/ HTTP/1.1"), "api.example.org", [TOKEN])
    with pytest.raises(Malformed, match="twice"):
        rewrite(head("GET / HTTP/1.1", "Host: a", "Host: api.example.org"), "api.example.org", [])
    ok = rewrite(head("GET / HTTP/1.1", "Host: API.example.org:443"), "api.example.org", [])
    assert ok.used == []


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nHost: a\r\n Transfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n",
        b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\0\r\n\r\n",
    ],
)
def test_heads_two_parsers_could_read_differently_are_refused(raw: bytes) -> None:
    with pytest.raises(Malformed):
        parse_head(raw)


def test_a_body_s_framing_is_one_reading_or_none() -> None:
    def of(*fields: str) -> tuple[str, int]:
        return framing(head("POST / HTTP/1.1", *fields))

    assert of("Content-Length: 12") == ("length", 12)
    assert of("Transfer-Encoding: chunked") == ("chunked", 0)
    assert of() == ("close", 0)
    for bad in (
        ("Transfer-Encoding: chunked", "Content-Length: 3"),
        ("Transfer-Encoding: gzip, chunked",),
        ("Content-Length: 3", "Content-Length: 4"),
        ("Content-Length: -1",),
    ):
        with pytest.raises(Malformed):
            of(*bad)


def test_echoed_values_are_masked_even_across_chunks() -> None:
    redact = Redactor(["t0ps3cret"])
    out = redact.feed(b'{"auth": "Bearer t0p') + redact.feed(b's3cret", "n": 1}') + redact.flush()
    assert out == b'{"auth": "Bearer *********", "n": 1}' and redact.found == 1


def test_the_store_seals_values_and_keeps_them_per_owner(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"0123456789abcdef-operator-key")
    store = SecretStore(tmp_path / "secrets.json", key)
    store.open()
    made = store.create("TOKEN", "t0ps3cret", ["api.example.org"], None, "{value}", "key-a")
    with pytest.raises(Conflict):
        store.create("TOKEN", "x", ["a.test"], None, "{value}", "key-a")
    store.create("TOKEN", "other-owners", ["a.test"], None, "{value}", "key-b")
    assert "t0ps3cret" not in (tmp_path / "secrets.json").read_text()
    assert "t0ps3cret" not in json.dumps(made.to_json())
    with pytest.raises(SecretNotFound):
        store.find("TOKEN", "key-c", admin=False)
    assert [s.value for s in store.opened(("TOKEN",), "key-a")] == ["t0ps3cret"]
    store.change(made, "r0tated", None, None, None)
    again = SecretStore(tmp_path / "secrets.json", key)
    again.open()
    assert [s.value for s in again.opened(("TOKEN",), "key-a")] == ["r0tated"]
    assert again.find("TOKEN", "key-a", admin=False).version == 2
    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"another-key-entirely-0000")
    with pytest.raises(ValueError, match="does not open"):
        SecretStore(tmp_path / "secrets.json", wrong).open()
    off = SecretStore(tmp_path / "none.json", None)
    with pytest.raises(SecretsNotConfigured):
        off.create("A", "b", ["c.test"], None, "{value}", None)


def test_the_authority_signs_what_sandboxes_verify(tmp_path: Path) -> None:
    import ssl

    authority = Authority(tmp_path / "ca")
    assert (tmp_path / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    server = authority.server_context("api.example.org")
    assert authority.server_context("api.example.org") is server  # kept
    client = ssl.create_default_context(cadata=authority.certificate_pem.decode())
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # as Python 3.13 verifies by default
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    sandbox = client.wrap_bio(c_in, c_out, server_hostname="api.example.org")
    relay = server.wrap_bio(s_in, s_out, server_side=True)
    done = set()
    for _ in range(10):
        for side in (sandbox, relay):
            try:
                side.do_handshake()
                done.add(id(side))
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    assert len(done) == 2 and sandbox.selected_alpn_protocol() in (None, "http/1.1")
    assert Authority(tmp_path / "ca").certificate_pem == authority.certificate_pem


def test_what_a_rule_or_a_secret_may_not_set() -> None:
    from kernel_gateway.kernels.egress.interception import Rule

    for name in ("Content-Length", "host", "Transfer-Encoding", "Proxy-Authorization"):
        rule = Rule("api.example.org", ((name, "1"),))
        with pytest.raises(Refused, match="may not set"):
            rewrite(head("GET / HTTP/1.1"), "api.example.org", [], (rule,))
    bad = Opened("X", "v", ("api.example.org",), "Content-Length", "{value}")
    with pytest.raises(Refused, match="may not set"):
        rewrite(head("GET / HTTP/1.1"), "api.example.org", [bad])


def test_a_secret_s_host_gets_whole_plain_answers_even_without_a_value() -> None:
    plain = rewrite(
        head("GET / HTTP/1.1", "Range: bytes=0-3", "Accept-Encoding: gzip", "Upgrade: x"),
        "api.example.org",
        [TOKEN],
    )
    assert plain.used == [] and plain.sensitive
    assert b"Range" not in plain.head and b"gzip" not in plain.head and b"Upgrade" not in plain.head
    elsewhere = rewrite(
        head("GET / HTTP/1.1", "Host: other.test", "Range: bytes=0-3"), "other.test", [TOKEN]
    )
    assert not elsewhere.sensitive and b"Range" in elsewhere.head


@pytest.mark.parametrize(
    "start",
    [b"G\x0bET / HTTP/1.1", b"GET /a\tb HTTP/1.1", b"GET / HTTP/2.0", b"GET / HTTP/1.1 x"],
)
def test_request_lines_that_are_not_plain_are_refused(start: bytes) -> None:
    raw = start + b"\r\nHost: api.example.org\r\n\r\n"
    with pytest.raises(Malformed):
        rewrite(parse_head(raw), "api.example.org", [])


def test_a_field_name_with_an_underscore_is_refused() -> None:
    with pytest.raises(Malformed):
        parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\n\r\n")
